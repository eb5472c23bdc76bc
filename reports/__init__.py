"""The comparative audit: workload utility, JSON/Markdown/HTML reports and plots.

Pure core (pandas, numpy, matplotlib; never Beam). For a finished run directory::

    run = load_run(run_dir)                       # manifest + releases/<name>/
    audit = audit_run(run, raw, hierarchies=..., attacks={name: [AttackResult...]},
                      baseline_attacks=[...], sweeps={"k": ["k2", "k5", "k10"]})
    write_reports(run_dir, audit)                 # audit.json, report.md, report.html

``compare_runs([audit, ...])`` combines several runs' audits (releases as series).

``render_html`` and ``render_markdown`` are imported on first use (PEP 562): the renderer
brings in matplotlib (~0.3-0.6 s), which a process that only reads releases, such as the
publication attacks' worker process, never needs.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from privpipe.reports.render import render_html, render_markdown

_RENDERED = ("render_html", "render_markdown")

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


def __getattr__(name: str) -> Any:
    """The renderer's functions, imported when first asked for (with matplotlib)."""
    if name in _RENDERED:
        from privpipe.reports import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
