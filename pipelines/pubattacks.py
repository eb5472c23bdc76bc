"""Attacks on the publication as a whole, for audit.json's ``publication_attacks``.

The attacker holds the public artefacts of the releases (data and the public part of
release.json, :func:`pipelines.publication.split_document`) and the targets' QIs; the
raw rows are read only to score. Run on the published set (what an attacker holds) and,
marked ``"hypothetical": true``, on pairs/sets involving candidates (what publishing
them would give). Entries (flat dicts; contract §4): ``releases``, ``finding`` (one
sentence), ``breach``.

- ``row_linking``: :func:`attacks.publication.row_order_alignment` per pair of tables;
- ``composition``: :func:`attacks.composition.compose_tables` per pair of tables (breach:
  both claim l values per class and the intersection leaves fewer);
- ``differencing``: per table x DP count query, the share of DP cells the table
  reproduces exactly (:func:`attacks.publication.reproduced_cells`), and the exact
  record total a table's length gives beside a DP count's cells;
- ``reconstruction``: :func:`attacks.reconstruction.reconstruct` on a small domain
  (:func:`reconstruction_domain`) from every count published;
- ``across_runs`` (:func:`across_runs`): the same release in two runs.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy, canonical_column
from privpipe.attacks.composition import compose_tables
from privpipe.attacks.matching import WEIGHT, TargetView, expand_rows, records_of, suppressed_rows
from privpipe.attacks.publication import (
    ROW_ORDER_ROWS,
    Alignment,
    Coded,
    Truth,
    _ancestors,
    _level_of,
    per_distinct,
    reproduced_cells,
    row_order_alignment,
)
from privpipe.attacks.reconstruction import (
    MAX_CELLS,
    Marginal,
    Reconstruction,
    independence,
    match_share,
    reconstruct,
    round_to,
)
from privpipe.pipelines.config import ANONYMITY_KINDS
from privpipe.pipelines.publication import COUNT_KINDS, coded_head, split_document

if TYPE_CHECKING:
    from privpipe.pipelines.plan import Plan
    from privpipe.reports import Release

ATTACKS = ("row_linking", "composition", "differencing", "reconstruction", "across_runs")
MAX_COLUMNS = 3  # columns of the reconstruction's domain (and MAX_CELLS cells at most)
TIME_LIMIT = 10.0  # seconds for the integer program; then its relaxation, rounded


def public_document(release: Release) -> dict[str, Any]:
    """The part of a release's release.json that is handed out."""
    doc = dict(release.document)
    return split_document(doc)[0] if doc.get("kind") else doc


def dp_queries(release: Release) -> list[tuple[str, list[str], dict[str, int]]]:
    """(query, key columns, levels) of a DP count release, from its public document."""
    params = public_document(release).get("parameters") or {}
    if release.kind == "dp_continual_count":
        return [(release.name, list(params.get("group_by") or []), {})]
    parts = list(params.get("partition_by") or [])
    return [
        (q, list(dict.fromkeys([*parts, *spec.get("group_by", [])])), dict(spec.get("levels", {})))
        for q, spec in (params.get("queries") or {}).items()
    ]


def _cells(release: Release, query: str) -> pd.DataFrame:
    data = release.data
    if "query" in data.columns:
        data = data[data["query"] == query]
    if "period" in data.columns:  # a continual count: its latest period
        data = data[data["period"].astype(str) == str(data["period"].astype(int).max())]
    return data


def _entry(names: Sequence[str], published: set[str], **fields: Any) -> dict[str, Any]:
    out = {"releases": list(names), "hypothetical": any(n not in published for n in names)}
    return out | fields


def _tables_pairwise(
    plan: Plan,
    releases: Mapping[str, Release],
    tables: Sequence[str],
    targets: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    published: set[str],
    known: Sequence[str] | None,
    checked: Sequence[Mapping[str, Any]] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from privpipe.pipelines.audit import summary_of

    s = plan.config.schema_
    qis, sa = list(s.quasi_identifiers), str(s.sensitive or "")
    linking: list[dict[str, Any]] = []
    composition: list[dict[str, Any]] = []
    views: dict[str, TargetView] = {}  # each table matched to the targets once, not per pair
    heads: dict[str, Coded] = {}  # each table's head encoded once, not per pair
    for a, b in itertools.combinations(tables, 2):
        ta, tb = releases[a].data, releases[b].data
        # the run's publication check aligned the published pairs already (same test)
        done = next((c for c in checked if list(c.get("tables") or []) == [a, b]), None)
        found = (
            row_order_alignment(
                coded_head(a, releases[a], heads),
                coded_head(b, releases[b], heads),
                hierarchies,
                names=(a, b),
            )
            if done is None
            else Alignment(
                a, b, int(done["rows"]), tuple(done["columns"]), float(done["agreement"]),
                float(done["chance"]), float(done["threshold"]),
            )
        )  # fmt: skip
        linking.append(
            _entry(
                (a, b), published,
                rows=found.rows, agreement=found.agreement, chance=found.chance,
                threshold=found.threshold, breach=found.aligned,
                finding=found.message() if found.aligned else (
                    f"tables {a!r} and {b!r} do not join row by row (agreement "
                    f"{found.agreement:.1%}, chance {found.chance:.1%})"
                ),
            )
        )  # fmt: skip
        if sa and sa in ta.columns and sa in tb.columns:
            comp = compose_tables(
                {n: summary_of(t, [*(q for q in qis if q in t.columns), sa])
                 for n, t in ((a, ta), (b, tb))},
                targets, qis, sa, hierarchies,
                guarantees={n: public_document(releases[n]).get("guarantee") for n in (a, b)},
                known=known, views=views,
            )  # fmt: skip
            d = comp.as_dict()
            composition.append(
                _entry((a, b), published, **{k: v for k, v in d.items() if k != "releases"})
            )
    return linking, composition


def _differencing(
    releases: Mapping[str, Release],
    tables: Sequence[str],
    counts: Sequence[str],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    qis: Sequence[str],
    published: set[str],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    truth = Truth(raw, hierarchies)  # shared by every table and DP query
    for t in tables:
        table = releases[t].data
        suppressed = suppressed_rows(table, [q for q in qis if q in table.columns])
        records = public_document(releases[t]).get("records") or {}
        for d in counts:
            queries = dp_queries(releases[d])
            for query, keys, levels in queries:
                if not truth.holds(keys):
                    continue  # a key the audit does not hold (not a QI or the SA)
                found = reproduced_cells(
                    table, _cells(releases[d], query), truth.frame(keys), keys, levels,
                    hierarchies, suppressed, names=(t, d, query),
                    true=truth.counts(keys, levels),
                )  # fmt: skip
                out.append(
                    _entry(
                        (t, d), published, attack="table counts", query=query,
                        keys=", ".join(keys), cells=found.cells, exact_cells=found.exact_cells,
                        share=found.exact_cells / found.cells if found.cells else 0.0,
                        structural=found.structural, breach=found.linked,
                        finding=found.message(),
                    )
                )  # fmt: skip
            # an exact record total beside the DP cells: the table's length (suppressed
            # rows included unless dropped) is the input's exact size
            shown = records.get("suppressed_as") != "drop" or bool(records.get("dropped"))
            length = records_of(table)  # the table's rows (a frequency table's weights)
            exact = shown and length + int(records.get("dropped") or 0) == records_of(raw)
            cells = sum(len(_cells(releases[d], q)) for q, _, _ in queries)
            single = exact and any(not keys for _, keys, _ in queries)
            out.append(
                _entry(
                    (t, d), published, attack="exact total", query="", keys="",
                    cells=cells, exact_cells=int(single), share=float(single),
                    structural=exact, breach=single,
                    finding=_total_finding(t, d, exact, single, cells),
                )
            )  # fmt: skip
    return out


def _total_finding(t: str, d: str, exact: bool, single: bool, cells: int) -> str:
    if not exact:
        return f"table {t!r} does not give the exact number of input records beside {d!r}"
    head = f"table {t!r} gives the exact number of input records (its length)"
    if single:
        return f"{head}; DP release {d!r} publishes that total with noise, which protects nothing"
    return (
        f"{head}; beside DP release {d!r}'s {cells} noisy cells it is one exact equation on "
        "their sum (an attacker who knows every other cell learns the last one with the "
        "other cells' noise only, not its own)"
    )


# --------------------------------------------------------------------------- reconstruction


@dataclass(frozen=True)
class _Artefact:
    name: str
    frame: pd.DataFrame  # label columns + "value"
    levels: dict[str, int]  # per column: the level of its labels
    kind: str  # exact | lower | noisy
    scale: float


def _table_levels(
    table: pd.DataFrame, cols: Sequence[str], hierarchies: Mapping[str, Hierarchy]
) -> dict[str, int]:
    """Per column published at one level in every row (full-domain recoding), its level;
    columns of mixed levels or labels outside the hierarchy (local recoding, ranges) are
    left out: counts grouped by the other columns are still exact."""
    out: dict[str, int] = {}
    for c in cols:
        h = hierarchies.get(c)
        labels = pd.Series(pd.unique(table[c])).astype(str)  # per distinct value
        if h is None:
            out[c] = 0
            continue
        level = _level_of(h)
        used = {level.get(v, -1) for v in labels if v != SUPPRESSED}
        if len(used) <= 1 and -1 not in used:
            out[c] = used.pop() if used else h.height
    return out


def _as_str(values: pd.Series) -> pd.Series:
    """``values`` as strings (the published table's text; ``per_distinct`` calls it once
    per distinct label)."""
    return values.astype(str)


def _noise_sd(data: pd.DataFrame, fallback: float) -> float:
    if {"ci_low", "ci_high"} <= set(data.columns) and len(data):
        width = pd.to_numeric(data["ci_high"]) - pd.to_numeric(data["ci_low"])
        return max(float(width.mean()) / (2 * 1.96), 1e-6)
    return max(fallback, 1e-6)


def _artefacts(
    names: Sequence[str],
    releases: Mapping[str, Release],
    columns: Sequence[str],
    qis: Sequence[str],
    hierarchies: Mapping[str, Hierarchy],
) -> list[_Artefact]:
    out: list[_Artefact] = []
    for n in names:
        r = releases[n]
        if r.kind in ANONYMITY_KINDS:
            cols = [c for c in columns if c in r.data.columns]
            levels = _table_levels(r.data, cols, hierarchies)
            if not levels:
                continue
            hidden = suppressed_rows(r.data, [q for q in qis if q in r.data.columns])
            rows = r.data.loc[~hidden, list(levels)]
            kept = pd.DataFrame(
                {c: per_distinct(rows[c], _as_str) for c in levels}, index=rows.index
            )  # the columns as strings, made per distinct label
            weights = (
                r.data.loc[~hidden, WEIGHT].to_numpy(dtype=np.int64)
                if WEIGHT in r.data.columns
                else np.ones(len(kept), dtype=np.int64)
            )  # a frequency table of the published rows: each row counts its weight
            frame = (
                kept.assign(value=weights)
                .groupby(list(levels), sort=False)["value"]
                .sum()
                .reset_index()
            )
            out.append(_Artefact(n, frame, levels, "lower" if hidden.any() else "exact", 1.0))
        elif r.kind in COUNT_KINDS:
            params = public_document(r).get("parameters") or {}
            for query, keys, levels in dp_queries(r):
                data = _cells(r, query)
                if not keys or any(k not in data.columns for k in keys):
                    continue
                noise = ((params.get("queries") or {}).get(query) or {}).get("count_noise") or {}
                sd = _noise_sd(data, float(noise.get("scale", 1.0)))
                frame = data[keys].astype(str).assign(value=pd.to_numeric(data["count"]))
                label = f"{n}/{query}" if query != n else n
                at = {k: int(levels.get(k, 0)) for k in keys}
                out.append(_Artefact(label, frame, at, "noisy", sd))
        elif r.kind == "local_dp":
            params = public_document(r).get("parameters") or {}
            attribute = params.get("attribute")
            if attribute and {"value", "estimate"} <= set(r.data.columns):
                frame = pd.DataFrame(
                    {attribute: r.data["value"].astype(str),
                     "value": pd.to_numeric(r.data["estimate"])}
                )  # fmt: skip
                out.append(_Artefact(n, frame, {attribute: 0}, "noisy", _noise_sd(r.data, 1.0)))
    return out


def reconstruction_domain(
    artefacts: Sequence[_Artefact],
    candidates: Sequence[str],
    hierarchies: Mapping[str, Hierarchy],
) -> dict[str, tuple[int, list[str]]]:
    """The reconstruction's columns: per column (level, labels). Columns that the most
    count artefacts publish below their top level come first (noisy ones before tables,
    then smaller domains); each at the finest level any artefact publishes it; greedily
    while the cells stay within MAX_CELLS and the columns within MAX_COLUMNS."""
    ranked = []
    for c in candidates:
        using = [a for a in artefacts if c in a.levels]
        h = hierarchies.get(c)
        if h is not None:
            using = [a for a in using if a.levels[c] < h.height]
        if not using:
            continue
        level = min(a.levels[c] for a in using)
        if h is not None:
            labels = [str(x) for x in pd.unique(h.labels(level))]
        else:
            seen = pd.concat([a.frame[c] for a in using]).astype(str)
            labels = sorted(set(seen) - {SUPPRESSED})
        noisy = sum(a.kind == "noisy" for a in using)
        ranked.append((-noisy, -len(using), len(labels), c, level, labels))
    ranked.sort()
    out: dict[str, tuple[int, list[str]]] = {}
    cells = 1
    for _, _, size, c, level, labels in ranked:
        if len(out) < MAX_COLUMNS and cells * size <= MAX_CELLS:
            out[c] = (level, labels)
            cells *= size
    return out


def _marginal(
    a: _Artefact, domain: Mapping[str, tuple[int, list[str]]], hierarchies: Mapping[str, Hierarchy]
) -> Marginal | None:
    cols = [c for c in domain if c in a.levels]
    if not cols:
        return None
    frame = (
        a.frame.groupby(cols, sort=False)["value"].sum().reset_index()
        if len(a.frame.columns) - 1 > len(cols)
        else a.frame
    )
    summed = max(len(a.frame) / max(len(frame), 1), 1.0)  # cells summed per marginal cell
    maps: list[np.ndarray] = []
    sizes: list[int] = []
    codes: list[np.ndarray] = []
    for c, (_, labels) in domain.items():
        if c not in cols:
            maps.append(np.zeros(len(labels), dtype=np.int64))
            sizes.append(1)
            continue
        names = pd.Index(sorted(set(frame[c].astype(str))), dtype=object)
        h = hierarchies.get(c)
        up = _ancestors(h, a.levels[c]) if h is not None else {v: v for v in labels}
        maps.append(
            np.asarray(names.get_indexer([up.get(v, "\x00") for v in labels]), dtype=np.int64)
        )
        sizes.append(len(names))
        codes.append(np.asarray(names.get_indexer(frame[c].astype(str)), dtype=np.int64))
    counts = np.zeros(int(np.prod(sizes)), dtype=np.float64)
    flat = np.ravel_multi_index(
        [codes.pop(0) if c in cols else np.zeros(len(frame), dtype=np.int64) for c in domain],
        sizes,
    )
    np.add.at(counts, flat, frame["value"].to_numpy(dtype=np.float64))
    kind = a.kind
    return Marginal(a.name, tuple(maps), tuple(sizes), counts, kind, a.scale * math.sqrt(summed))  # type: ignore[arg-type]


class _Prepared(NamedTuple):
    """One set's reconstruction program and the true table it is scored against;
    ``exact``: its exact (table) counts alone, when some counts are noisy."""

    domain: dict[str, tuple[int, list[str]]]
    sizes: list[int]
    marginals: list[Marginal]
    exact: list[Marginal]
    truth: np.ndarray


class _Reconstructions:
    """The reconstructions of one publication (its releases, the raw rows that score
    them) and what they share: each release's artefacts, the raw table's distinct values
    of a column (with their rows' codes), and solved programs (the same counts give the
    same table: the published set is in every set).

    With a ``solver`` thread the programs are solved there while the caller goes on
    (HiGHS releases the GIL: the solves overlap the other attacks' pandas work); the
    solver sees only the programs' numpy arrays, never a pandas object."""

    def __init__(
        self,
        releases: Mapping[str, Release],
        raw: pd.DataFrame,
        hierarchies: Mapping[str, Hierarchy],
        qis: Sequence[str],
        columns: Sequence[str],
        published: set[str],
        solver: ThreadPoolExecutor | None = None,
    ) -> None:
        self.releases, self.raw, self.hierarchies = releases, raw, hierarchies
        self.qis, self.columns, self.published = qis, columns, published
        self.solver = solver
        self.artefacts: dict[str, list[_Artefact]] = {}
        self.values: dict[str, tuple[np.ndarray, pd.Series]] = {}
        self.solved: dict[bytes, Future[Reconstruction]] = {}

    def artefacts_of(self, names: Sequence[str]) -> list[_Artefact]:
        for n in names:
            if n not in self.artefacts:
                self.artefacts[n] = _artefacts(
                    [n], self.releases, self.columns, self.qis, self.hierarchies
                )
        return [a for n in names for a in self.artefacts[n]]

    def distinct(self, column: str) -> tuple[np.ndarray, pd.Series]:
        """Per raw row: the code of its canonical value; and the distinct canonical values."""
        if column not in self.values:
            codes, uniques = pd.factorize(
                pd.Series(canonical_column(self.raw[column]), dtype=object).astype(str)
            )
            self.values[column] = (codes, pd.Series(uniques, dtype=object))
        return self.values[column]

    def solve(self, sizes: Sequence[int], marginals: Sequence[Marginal]) -> Future[Reconstruction]:
        """The program of these counts, solved once (on the solver thread if any)."""
        digest = hashlib.blake2b(repr(list(sizes)).encode(), digest_size=16)
        for m in marginals:
            digest.update(repr((m.sizes, m.kind, m.scale)).encode())
            for part in (*m.maps, np.asarray(m.counts, dtype=np.float64)):
                digest.update(np.ascontiguousarray(part).tobytes())
                digest.update(b"|")
        key = digest.digest()
        if key not in self.solved:
            args = (list(sizes), list(marginals))
            if self.solver is not None:
                self.solved[key] = self.solver.submit(_solve, *args)
            else:
                done: Future[Reconstruction] = Future()
                try:
                    done.set_result(_solve(*args))
                except Exception as error:  # raised where the result is read
                    done.set_exception(error)
                self.solved[key] = done
        return self.solved[key]

    def prepare(self, names: Sequence[str]) -> _Prepared | None:
        """The program of the counts of ``names`` (queued, with the tables-only one) and
        the true table; None when no domain or count fits."""
        hierarchies = self.hierarchies
        artefacts = self.artefacts_of(names)
        domain = reconstruction_domain(artefacts, self.columns, hierarchies)
        if not domain:
            return None
        marginals = [m for a in artefacts if (m := _marginal(a, domain, hierarchies)) is not None]
        if not marginals:
            return None
        sizes = [len(labels) for _, labels in domain.values()]
        truth_codes = []
        for c, (level, labels) in domain.items():
            h = hierarchies.get(c)
            codes, values = self.distinct(c)  # mapped once per distinct value
            mapped = values.map(_ancestors(h, level)) if h is not None else values
            found_at = pd.Index(labels, dtype=object).get_indexer(mapped.fillna("\x00"))
            truth_codes.append(np.asarray(found_at, dtype=np.int64)[codes])
        ok = np.all(np.stack(truth_codes) >= 0, axis=0)
        flat = np.ravel_multi_index([t[ok] for t in truth_codes], sizes)
        raw = self.raw
        weights = raw[WEIGHT].to_numpy(dtype=np.float64)[ok] if WEIGHT in raw.columns else None
        truth = np.rint(np.bincount(flat, weights, minlength=int(np.prod(sizes))))
        exact = [m for m in marginals if m.kind != "noisy"]
        self.solve(sizes, marginals)
        if exact and len(exact) < len(marginals):
            self.solve(sizes, exact)
        return _Prepared(domain, sizes, marginals, exact, truth.astype(np.int64))

    def score(self, prepared: _Prepared) -> dict[str, Any]:
        """The entry of one set: its reconstruction scored against the true table."""
        domain, sizes, marginals, exact, truth = prepared
        published = self.published
        try:
            found = self.solve(sizes, marginals).result()
        except ValueError as e:  # inconsistent exact counts: nothing fits, nothing to score
            names_used = sorted({m.name.split("/")[0] for m in marginals})
            return _entry(
                names_used, published, columns=", ".join(domain), cells=int(np.prod(sizes)),
                method="none", records=0, matched=0.0, chance=0.0, uniform=0.0,
                tables_only=0.0, breach=False,
                finding=f"no table fits the published counts ({e})",
            )  # fmt: skip
        matched = match_share(found.counts, truth)
        chance = match_share(independence(found.counts, sizes), truth)
        uniform = match_share(round_to(np.ones(truth.size), int(found.counts.sum())), truth)
        tables_only = 0.0
        if exact and len(exact) < len(marginals):  # what the tables alone give, to compare
            tables_only = match_share(self.solve(sizes, exact).result().counts, truth)
        elif exact:
            tables_only = matched
        baseline = max(chance, uniform, tables_only)
        breach = matched >= 0.9 and matched > baseline + 0.1
        used = sorted({m.name.split("/")[0] for m in marginals})
        text = (
            f"from the counts of {', '.join(used)} over ({', '.join(domain)}; "
            f"{int(np.prod(sizes))} cells) a table of {int(found.counts.sum())} records "
            f"consistent with them matches real records for {matched:.1%} of its records "
            f"(chance {max(chance, uniform):.1%}; the anonymised tables alone "
            f"{tables_only:.1%})"
        )
        return _entry(
            used, published,
            columns=", ".join(domain), cells=int(np.prod(sizes)), method=found.method,
            records=int(found.counts.sum()), matched=matched, chance=chance, uniform=uniform,
            tables_only=tables_only, breach=breach,
            finding=text + ("; the counts determine the microdata" if breach else ""),
        )  # fmt: skip


def _solve(sizes: list[int], marginals: list[Marginal]) -> Reconstruction:
    return reconstruct(sizes, marginals, time_limit=TIME_LIMIT)


def reconstruction_entry(
    names: Sequence[str],
    releases: Mapping[str, Release],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    qis: Sequence[str],
    columns: Sequence[str],
    published: set[str],
) -> dict[str, Any] | None:
    """Reconstruct microdata from the counts of ``names`` and score it against ``raw``
    (one set on its own; ``publication_attacks`` shares the work between its sets)."""
    runs = _Reconstructions(releases, raw, hierarchies, qis, columns, published)
    prepared = runs.prepare(names)
    return None if prepared is None else runs.score(prepared)


# --------------------------------------------------------------------------- entry points


def publication_attacks(
    plan: Plan,
    releases: Mapping[str, Release],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    checked: Mapping[str, Any] | None = None,
    targets: pd.DataFrame | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every publication attack on the published set and, hypothetically, on sets that
    involve candidates. Reads the public artefacts of ``releases``; ``raw`` (accepted
    rows: QIs and SA) gives the targets' QIs and scores. ``checked``: the run's
    publication check (``manifest["publication"]``), whose row-order alignments of the
    published tables are reused, not recomputed. ``raw`` may be the frequency table of
    the rows (column ``WEIGHT``); ``targets``: the attacker's sampled target rows (None:
    the configured sample of ``raw``'s rows)."""
    from privpipe.pipelines.audit import knowledge_of

    s = plan.config.schema_
    qis = list(s.quasi_identifiers)
    columns = [*qis, *([s.sensitive] if s.sensitive else [])]
    published = set(plan.config.published())
    chosen, known = raw if targets is None else targets, None  # every record, or the sample
    if plan.config.attacks is not None:
        knowledge = knowledge_of(plan.config.attacks)
        known = knowledge.known_qis(qis)
        if targets is None:
            chosen = knowledge.select_targets(expand_rows(raw))
    targets = chosen
    tables = [n for n, r in releases.items() if r.kind in ANONYMITY_KINDS]
    counts = [n for n, r in releases.items() if r.kind in COUNT_KINDS]
    out: dict[str, list[dict[str, Any]]] = {a: [] for a in ATTACKS}
    sets = [[n for n in releases if n in published]]
    if any(n not in published for n in releases):
        # hypothetically: each candidate added to the published set
        sets += [[*sets[0], n] for n in releases if n not in published]
    # the reconstructions' programs first, solved on a thread beside the other attacks
    solver = ThreadPoolExecutor(1, thread_name_prefix="privpipe-reconstruct")
    try:
        runs = _Reconstructions(releases, raw, hierarchies, qis, columns, published, solver)
        programs = [(names, runs.prepare(names)) for names in sets]
        out["row_linking"], out["composition"] = _tables_pairwise(
            plan, releases, tables, targets, hierarchies, published, known,
            list((checked or {}).get("row_order") or []),
        )  # fmt: skip
        out["differencing"] = _differencing(
            releases, tables, counts, raw, hierarchies, qis, published
        )
        for names, prepared in programs:
            if prepared is None:
                continue
            entry = runs.score(prepared)
            if entry not in out["reconstruction"]:
                out["reconstruction"].append(
                    entry | {"hypothetical": any(n not in published for n in names)}
                )
    finally:
        solver.shutdown(wait=True, cancel_futures=True)
    del out["across_runs"]  # only for several runs (privpipe report RUN1 RUN2)
    return out


def breach_findings(attacks: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """audit["findings"] lines for the entries that are breaches: one line each for what
    is published, one line per attack for the hypothetical ones (pairs with candidates:
    what publishing them would give; their sentences are in publication_attacks)."""
    lines = []
    hypothetical: dict[str, list[str]] = {}
    for attack, entries in attacks.items():
        for e in entries:
            if not e.get("breach"):
                continue
            if e.get("hypothetical"):
                hypothetical.setdefault(attack, []).append(" + ".join(e.get("releases") or []))
            else:
                lines.append(f"PUBLICATION ATTACK ({attack}): {e['finding']}")
    for attack, pairs in hypothetical.items():
        lines.append(
            f"PUBLICATION ATTACK, if candidates were published too ({attack}): {len(pairs)} "
            f"combination(s) would "
            f"be breached: {', '.join(pairs)} (details under publication attacks)"
        )
    return lines


def _charged(manifest: Mapping[str, Any], name: str) -> bool:
    charged = ((manifest.get("budget") or {}).get("charged_this_run")) or {}
    return name in charged


def across_runs(
    runs: Sequence[tuple[str, Path, Mapping[str, Any]]],
    targets: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    qis: Sequence[str],
    sa: str | None,
) -> list[dict[str, Any]]:
    """Releases of the same name published in two runs (``runs``: (label, run folder,
    manifest) in order; each run against the next), as the attacker holding both
    nights' public/ sees them: the two tables joined row by row and intersected
    (composition; ``targets``: the later run's records), and DP cells published twice
    averaged (what the two noisy answers give together, and whether the ledger charged
    both)."""
    from privpipe.reports import head_rows, load_release

    out: list[dict[str, Any]] = []
    for (la, da, ma), (lb, db, mb) in itertools.pairwise(runs):
        both = [n for n in ma.get("published") or [] if n in (mb.get("published") or [])]
        for name in both:
            pa, pb = da / "public" / name, db / "public" / name
            if not (pa / "release.json").is_file() and (pb / "release.json").is_file():
                continue
            ra, rb = load_release(pa), load_release(pb)
            runs_label = f"{la} vs {lb}"
            if ra.kind in ANONYMITY_KINDS:
                found = row_order_alignment(
                    head_rows(ra, ROW_ORDER_ROWS), head_rows(rb, ROW_ORDER_ROWS), hierarchies,
                    names=(la, lb),
                )  # fmt: skip
                out.append({
                    "releases": [name], "runs": runs_label, "attack": "row linking",
                    "agreement": found.agreement, "chance": found.chance,
                    "breach": found.aligned,
                    "finding": (found.message() if found.aligned else
                                f"{name!r} of {la} and of {lb} do not join row by row "
                                f"(agreement {found.agreement:.1%}, chance {found.chance:.1%})"),
                })  # fmt: skip
                if sa and sa in ra.data.columns and sa in rb.data.columns:
                    comp = compose_tables(
                        {f"{name}@{la}": ra.data, f"{name}@{lb}": rb.data}, targets, qis, sa,
                        hierarchies,
                        guarantees={f"{name}@{la}": public_document(ra).get("guarantee"),
                                    f"{name}@{lb}": public_document(rb).get("guarantee")},
                    )  # fmt: skip
                    d = comp.as_dict()
                    out.append({"releases": [name], "runs": runs_label, "attack": "composition"}
                               | {k: v for k, v in d.items() if k != "releases"})  # fmt: skip
            elif ra.kind in COUNT_KINDS and rb.kind in COUNT_KINDS:
                out.extend(_twice(name, runs_label, ra, rb, _charged(ma, name), _charged(mb, name)))
    return out


def _twice(
    name: str, runs_label: str, ra: Release, rb: Release, charged_a: bool, charged_b: bool
) -> list[dict[str, Any]]:
    """DP cells of one release published in two runs: their average and difference."""
    out: list[dict[str, Any]] = []
    ga, gb = public_document(ra).get("guarantee") or {}, public_document(rb).get("guarantee") or {}
    stream = ra.kind == "dp_continual_count"
    for query, keys, _ in dp_queries(rb):
        ca, cb = _cells(ra, query), _cells(rb, query)
        if any(k not in ca.columns or k not in cb.columns for k in keys):
            continue
        joined = (
            ca[[*keys, "count"]]
            .astype({k: str for k in keys})
            .merge(
                cb[[*keys, "count"]].astype({k: str for k in keys}), on=keys, suffixes=("_a", "_b")
            )
        )
        if joined.empty:
            continue
        a = pd.to_numeric(joined["count_a"]).to_numpy(dtype=np.float64)
        b = pd.to_numeric(joined["count_b"]).to_numpy(dtype=np.float64)
        sd = _noise_sd(cb, 1.0)
        eps_a, eps_b = float(ga.get("epsilon", 0.0)), float(gb.get("epsilon", 0.0))
        accounted = stream or (charged_a and charged_b)
        if stream:
            how = "one stream: the tree mechanism accounts for every period it publishes"
        elif accounted:
            how = f"the ledger charged both (epsilon {eps_a:g} + {eps_b:g} = {eps_a + eps_b:g})"
        else:
            how = "the ledger did NOT charge both: the second answer is unpaid"
        out.append({
            "releases": [name], "runs": runs_label, "attack": "averaging",
            "query": query, "cells": len(joined),
            "mean_abs_difference": float(np.mean(np.abs(a - b))),
            "noise_sd": sd, "averaged_sd": sd / math.sqrt(2),
            "epsilon_together": eps_a if stream else eps_a + eps_b,
            "charged_both": bool(accounted), "breach": not accounted,
            "finding": (
                f"{name!r} ({query}) published in {runs_label}: {len(joined)} cells twice; "
                f"averaging the two answers cuts the noise's sd from {sd:.1f} to "
                f"{sd / math.sqrt(2):.1f} on data that did not change; {how}"
            ),
        })  # fmt: skip
    return out
