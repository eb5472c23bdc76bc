"""The comparative audit: workload utility, JSON/Markdown/HTML reports and plots.

Pure core (pandas, numpy, matplotlib; never Beam). For a finished run directory::

    run = load_run(run_dir)                       # manifest + releases/<name>/
    audit = audit_run(run, raw, hierarchies=..., attacks={name: [AttackResult...]},
                      baseline_attacks=[...], sweeps={"k": ["k2", "k5", "k10"]})
    write_reports(run_dir, audit)                 # audit.json, report.md, report.html

``compare_runs([audit, ...])`` combines several runs' audits (releases as series).
"""

from privpipe.reports.audit import (
    AUDIT_FORMAT,
    audit_run,
    build_audit,
    compare_runs,
    findings,
    guarantee_text,
    normalise_attacks,
    release_entry,
)
from privpipe.reports.render import render_html, render_markdown
from privpipe.reports.run import (
    Release,
    Run,
    dumps_audit,
    head_rows,
    load_release,
    load_run,
    write_reports,
)
from privpipe.reports.utility import (
    UtilityOptions,
    cover_table,
    raw_release,
    release_utility,
    score,
)
from privpipe.reports.workload import CountQuery, Truth, Workload, build_workload, true_answers

__all__ = [
    "AUDIT_FORMAT",
    "CountQuery",
    "Release",
    "Run",
    "Truth",
    "UtilityOptions",
    "Workload",
    "audit_run",
    "build_audit",
    "build_workload",
    "compare_runs",
    "cover_table",
    "dumps_audit",
    "findings",
    "guarantee_text",
    "head_rows",
    "load_release",
    "load_run",
    "normalise_attacks",
    "raw_release",
    "release_entry",
    "release_utility",
    "render_html",
    "render_markdown",
    "score",
    "true_answers",
    "write_reports",
]
