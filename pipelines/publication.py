"""The publication boundary of a run: what goes to ``public/``, and whether it may.

- :func:`split_document` — a published release's release.json keeps only declared
  parameters, figures of the artefact itself and charged DP quantities; everything
  else (timings, input row counts, search statistics, bounding figures) goes to the
  operator's manifest.
- :func:`check_private_paths` — the ledger, the audit ledger, continual state files and
  the scratch folder never lie inside ``DIR/public`` or ``DIR/internal`` (the commit
  replaces those folders as wholes; the public one is handed out).
- :func:`check_combination` — the releases published together (``publish:``) are
  attacked as one publication (``attacks.publication``, ``attacks.composition``); a
  linked pair is refused (exit 4) unless ``accept_linked_releases: true``. Composition
  rule: two published tables that each claim l-diversity (>= l distinct sensitive values
  per class) are linked when intersecting a target's classes leaves it fewer than l
  candidate values (and neither table alone did); k-anonymity or t-closeness tables
  claim no number of values, so their composition is a finding, not a refusal.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.composition import compose_tables
from privpipe.attacks.matching import frequency_table, suppressed_rows
from privpipe.attacks.publication import (
    ROW_ORDER_ROWS,
    Coded,
    Truth,
    encode_rows,
    published_levels,
    reproduced_cells,
    row_order_alignment,
    to_level,
)
from privpipe.dp.budget import ApproxBudget
from privpipe.dp.ledger import Ledger
from privpipe.dp.ledger_auth import LedgerKey
from privpipe.errors import ConfigError, PrivacyRefusal
from privpipe.pipelines.config import ANONYMITY_KINDS
from privpipe.pipelines.output import INTERNAL, PUBLIC
from privpipe.pipelines.plan import Plan

# releases whose published table has a noisy `count` per cell (dp_mean, dp_variance and
# dp_stddev publish the noisy count they divide by): an exact count of the same cell voids
# that part of the noise. dp_count_distinct counts persons: without a privacy unit that is
# the row count, and with one a table's rows per cell equal the persons wherever each
# person has one row there, so it is checked like a count (the safe side)
COUNT_KINDS = (
    "dp_count",
    "dp_histogram",
    "dp_count_distinct",
    "dp_mean",
    "dp_variance",
    "dp_stddev",
    "dp_continual_count",
)

# per kind group: the top-level keys of release.json that may be handed out
_PUBLIC_KEYS = {
    "anonymity": ("name", "kind", "parameters", "guarantee", "transformation", "verified"),
    "central": (
        "name",
        "kind",
        "parameters",
        "guarantee",
        "planned_guarantee",
        "charged",
        "verification",
        "insecure_seed",
        "verified",
    ),
    "local_dp": (
        "name",
        "kind",
        "parameters",
        "guarantee",
        "planned_guarantee",
        "insecure_seed",
        "verified",
    ),
    "dp_continual_count": (
        "name",
        "kind",
        "parameters",
        "guarantee",
        "planned_guarantee",
        "metrics",
        "insecure_seed",
        "verified",
    ),
}


def _group(kind: str) -> str:
    if kind in ANONYMITY_KINDS:
        return "anonymity"
    if kind in ("local_dp", "dp_continual_count"):
        return kind
    return "central"


def split_document(doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public release.json, the rest for the internal manifest) of one published release.

    Public: declared parameters, the guarantee, what was charged, data-independent
    figures (noise scales, interval widths) and figures of the artefact itself (cells
    published; for a table its published and suppressed record counts). Not public:
    anything measured on the input (records in, rows kept by bounding, reports, search
    and verification statistics, seconds).
    """
    group = _group(str(doc.get("kind")))
    public = {k: doc[k] for k in _PUBLIC_KEYS[group] if k in doc}
    internal = {k: v for k, v in doc.items() if k not in public}
    if group == "anonymity":
        records = doc.get("records") or {}
        # the table itself: its rows and its suppressed (*) rows. Dropped rows are not in
        # the table: their number beside the table's length would give the exact input size
        shown: tuple[str, ...] = ("published", "suppressed_as")
        if records.get("suppressed_as") != "drop":
            shown = ("published", "suppressed", "suppressed_as")
        public["records"] = {k: records[k] for k in shown if k in records}
    elif group == "central":
        metrics = doc.get("metrics") or {}
        public["metrics"] = {k: metrics[k] for k in ("cells_published",) if k in metrics}
    elif group == "dp_continual_count":
        check = doc.get("verification") or {}
        public["verification"] = {
            k: check[k] for k in ("ok", "node_scale", "l1_bound") if k in check
        }
    if group == "local_dp":
        public["verification"] = {"ok": (doc.get("verification") or {}).get("ok")}
    return public, internal


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def check_private_paths(plan: Plan, extra: Iterable[tuple[str, Path]] = ()) -> None:
    """ConfigError (exit 2) if an operator-only file lies inside DIR/public or DIR/internal."""
    b = plan.config.budget
    paths: list[tuple[str, Path]] = []
    if plan.ledger_path is not None:
        paths.append(("budget.ledger", plan.ledger_path))
    if b is not None and b.audit_ledger:
        paths.append(("budget.audit_ledger", plan.resolve(b.audit_ledger)))
    work = plan.config.output.work_dir
    if work and _inside(plan.resolve(work), plan.output_dir):
        raise ConfigError(
            f"output.work_dir: {plan.resolve(work)} lies inside the output folder "
            f"{plan.output_dir}; the scratch folder holds row-level data and must stay out "
            "of it: choose another folder (default: the system temp folder)"
        )
    paths += list(extra)
    for key, path in paths:
        for folder in (PUBLIC, INTERNAL):
            if _inside(path, plan.output_dir / folder):
                raise ConfigError(
                    f"{key}: {path} lies inside the output's {folder}/ folder, which every "
                    f"run replaces as a whole{' and hands out' if folder == PUBLIC else ''}; "
                    f"put it outside {plan.output_dir / folder} (e.g. in "
                    f"{plan.output_dir / 'budget'})"
                )


def check_combination(
    plan: Plan,
    folder: Path,
    loaded: Mapping[str, Any],
    published: Sequence[str],
    raw: pd.DataFrame | None,
    hierarchies: Mapping[str, Hierarchy],
    dp_keys: Mapping[str, Sequence[tuple[str, Sequence[str], Mapping[str, int]]]],
    log: Callable[[str], None] = print,
    work: Path | None = None,
) -> dict[str, Any]:
    """Attack the published releases as one publication; refuse (PrivacyRefusal) a linked
    combination unless the config accepts it. Returns the findings for manifest/audit.

    ``folder``: where the releases are staged (``<name>/``); ``loaded``: those already
    read (reports.Release by name); ``raw``: the accepted rows (QIs and SA), or their
    frequency table (column ``attacks.matching.WEIGHT``), for the numerical check;
    ``dp_keys``: per DP count release, its queries as (query name, key columns, levels).
    A count not staged yet (a continual count, published last) is checked against every
    key combination of the data. ``work``: the run's private folder, whose frequency tables
    of the published rows stand for the tables (``reports.load_release``); the row-order
    check reads the head of each table (``reports.head_rows``).
    """
    from privpipe.reports import load_release
    from privpipe.transforms.audit_truth import published_counts_path

    qis = list(plan.config.schema_.quasi_identifiers)
    kinds = {r.name: r.kind for r in plan.config.releases}
    releases = {
        n: loaded.get(n)
        or load_release(folder / n, None if work is None else published_counts_path(work, n))
        for n in published
        if n in loaded or (folder / n / "release.json").is_file()
    }
    tables = [n for n in published if kinds[n] in ANONYMITY_KINDS]
    counts = [n for n in published if n in dp_keys]
    findings: dict[str, Any] = {"reproduced_cells": [], "row_order": [], "composition": []}
    problems: list[str] = []
    pairs: list[tuple[str, str]] = []
    shared = None if raw is None else Truth(raw, hierarchies)  # once for every table
    heads: dict[str, Coded] = {}  # each table's head, encoded once for all its pairs
    for t in tables:
        table = releases[t].data
        suppressed = suppressed_rows(table, [q for q in qis if q in table.columns])
        for d in counts:
            for query, keys, levels in dp_keys[d]:
                true = None
                if shared is not None and shared.holds(keys):
                    truth, true = shared.frame(keys), shared.counts(keys, levels)
                else:
                    truth = pd.DataFrame(columns=list(keys))
                if d in releases:
                    cells = releases[d].data
                    mine = cells[cells["query"] == query] if "query" in cells.columns else cells
                else:  # not staged yet: every cell of the data
                    mine = pd.DataFrame(
                        {k: to_level(truth[k], hierarchies.get(k), levels.get(k, 0)) for k in keys}
                    ).drop_duplicates()
                found = reproduced_cells(
                    table, mine, truth, keys, levels, hierarchies, suppressed,
                    names=(t, d, query), table_levels=published_levels(releases[t].document),
                    true=true,
                )  # fmt: skip
                findings["reproduced_cells"].append(found.as_dict())
                if found.linked:
                    problems.append(found.message())
                    pairs.append((t, d))
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            aligned = row_order_alignment(
                coded_head(a, releases[a], heads), coded_head(b, releases[b], heads), hierarchies,
                names=(a, b),
            )  # fmt: skip
            findings["row_order"].append(aligned.as_dict())
            if aligned.aligned:
                problems.append(aligned.message())
                pairs.append((a, b))
    sa = plan.config.schema_.sensitive
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            found = _composition(releases[a], releases[b], raw, qis, sa, hierarchies)
            if found is None:
                continue
            findings["composition"].append(found.as_dict())
            if found.breach:  # both claim l values per class; together they give fewer
                problems.append(
                    found.message() + " (publish only one of them: their classes cut each other)"
                )
                pairs.append((a, b))
            elif found.gain > 0:
                log(f"privpipe: note (composition, not a breach): {found.message()}")
    findings["linked"] = problems
    findings["linked_with"] = {  # release -> the releases it is linked with (names only)
        n: sorted({y for x, y in pairs if x == n} | {x for x, y in pairs if y == n})
        for n in sorted({n for pair in pairs for n in pair})
    }
    findings["accepted"] = bool(problems) and plan.config.accept_linked_releases
    if problems and not plan.config.accept_linked_releases:
        raise PrivacyRefusal(
            "the releases to publish are linked: "
            + "; ".join(problems)
            + ". Publish fewer of them (publish: [...]), generalise the table above the DP "
            "release's level, or set accept_linked_releases: true to publish them anyway "
            "(the report flags it). Nothing was published"
        )
    for p in problems:
        log(f"privpipe: WARNING linked releases published (accept_linked_releases): {p}")
    return findings


def coded_head(name: str, release: Any, memo: dict[str, Coded]) -> Coded:
    """The first ``ROW_ORDER_ROWS`` published rows of table ``name`` (``reports.head_rows``)
    encoded for the row-order attack (``attacks.publication.encode_rows``), once per name
    in ``memo``."""
    from privpipe.reports import head_rows

    if name not in memo:
        memo[name] = encode_rows(head_rows(release, ROW_ORDER_ROWS))
    return memo[name]


def _composition(
    first: Any,
    second: Any,
    raw: pd.DataFrame | None,
    qis: Sequence[str],
    sa: str | None,
    hierarchies: Mapping[str, Hierarchy],
) -> Any:
    """The composition attack (attacks.composition) on two published tables, every
    accepted record a target (a guarantee holds for every class); None without the SA."""
    if raw is None or not sa or sa not in raw.columns:
        return None
    if sa not in first.data.columns or sa not in second.data.columns:
        return None
    tables = {  # each table's distinct rows with their counts: the same view, fewer rows
        r.name: frequency_table(r.data, [*(q for q in qis if q in r.data.columns), sa])
        for r in (first, second)
    }
    return compose_tables(
        tables, raw, qis, sa, hierarchies,
        guarantees={r.name: (r.document or {}).get("guarantee") for r in (first, second)},
    )  # fmt: skip


def dp_count_keys(
    jobs: Iterable[Any],
) -> dict[str, list[tuple[str, list[str], dict[str, int]]]]:
    """Per DP count release (central or continual job): its queries as (query name, key
    columns: partition_by then group_by, levels)."""
    out: dict[str, list[tuple[str, list[str], dict[str, int]]]] = {}
    for job in jobs:
        spec = job.spec
        if spec.kind not in COUNT_KINDS:
            continue
        parts = list(getattr(spec, "partition_by", ()) or ())
        out[job.name] = [
            (q.name, list(dict.fromkeys([*parts, *q.group_by])), dict(q.levels))
            for q in spec.queries
        ]
    return out


class _ThrowawayLedger(Ledger):
    """A ledger whose private folder goes when it is closed. Not left to garbage
    collection: a run's ``finally`` closes its ledgers, but a terminated run whose library
    thread is stranded ends by ``os._exit`` (``cli._exit_without_stranded_threads``),
    which runs no finalizer, and a failed run's traceback keeps the ledger alive."""

    discard: weakref.finalize | None = None  # removes the folder, at most once

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.discard is not None:
                self.discard()


def uncharged_ledger(plan: Plan, jobs: Sequence[Any]) -> Ledger:
    """A throw-away ledger for DP candidates without budget.audit_ledger: the noise is drawn
    and verified as for any release, but nothing is recorded in any lasting ledger, because
    a candidate never leaves the operator (it can never reach public/). It lives in a
    private temporary folder (own random key and heads file) removed when it is closed
    (and, should it never be, when it is collected or the interpreter exits)."""
    eps = sum((Fraction(j.budget().epsilon) for j in jobs), Fraction(0))
    dlt = sum((Fraction(j.budget().delta) for j in jobs), Fraction(0))
    delta = min(dlt * 2 + Fraction(1, 10**9), Fraction(1, 2))
    folder = Path(tempfile.mkdtemp(prefix="privpipe-candidates-"))
    try:
        key = LedgerKey(os.urandom(32), "throw-away key (candidates)", folder / "heads.json")
        budget = ApproxBudget(eps + 1, delta)
        path = _ThrowawayLedger.create(folder / "ledger.sqlite", plan.name, budget, key)
        ledger = _ThrowawayLedger.open(path, plan.name, key)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    ledger = cast(_ThrowawayLedger, ledger)  # open() makes the class it is called on
    ledger.label = "no lasting ledger (candidates: computed for comparison, never published)"
    ledger.discard = weakref.finalize(ledger, shutil.rmtree, folder, True)
    return ledger
