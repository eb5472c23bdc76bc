"""Attacks against every release of a run, and audit.json (DESIGN.md "Outputs").

After the releases are staged, the driver reads what was published (data.csv and
release.json of each release) plus what the pipeline staged of the accepted input rows
in the run's private work folder (never every row: ``load_truth``): the frequency table
of their QI and sensitive columns and a keyed sample of target records. The targets'
QI values are what the attacker is assumed to know; the table scores and counts; attacks
read nothing else. The raw table itself is attacked
as the no-protection baseline.

- anonymised tables: homogeneity, background knowledge (b = 0…3, worst case or random),
  skewness, similarity (sensitive-value categories), linkage (prosecutor re-identification);
- DP releases: attribute inference from a (QI × sensitive) histogram's noisy cells,
  membership inference on a released count and a differencing attack on two releases
  that differ by one person, each simulated with the release's own noise scale and set
  beside the bound (e^ε+δ)/(1+e^ε).

Targets are records (rows), as in the literature's attacker model.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pandas as pd

from privpipe import timing
from privpipe.anonymity.hierarchy import Hierarchy, canonical_column
from privpipe.attacks import (
    AttackerKnowledge,
    AttackResult,
    background_knowledge,
    differencing_attack,
    histogram_attribute_inference,
    homogeneity,
    linkage,
    membership_inference,
    person_contribution,
    similarity,
    skewness,
)
from privpipe.attacks.common import (
    CellModel,
    LocalReportModel,
    PosteriorModel,
    PriorModel,
    RawRowsModel,
    TableModel,
    common_attack,
    forget_views,
    matched_view,
    public_prior,
)
from privpipe.attacks.matching import (
    WEIGHT,
    expand_rows,
    frequency_table,
    mark_distinct,
    read_coded,
    records_of,
)
from privpipe.attacks.publication import published_levels
from privpipe.dp.noise import SeededTestSampler, planned_guarantee
from privpipe.errors import InputDataError
from privpipe.pipelines.config import (
    ANONYMITY_KINDS,
    CONTINUAL_KINDS,
    DP_KINDS,
    TABLE_ATTACK_NAMES,
    AttacksConfig,
)
from privpipe.pipelines.plan import Plan
from privpipe.pipelines.pubattacks import across_runs, breach_findings, publication_attacks
from privpipe.timing import stage
from privpipe.workers import Worker, available_cores

if TYPE_CHECKING:  # reports (matplotlib) is imported only when a report is written
    from privpipe.reports import Release

RAW_TABLE = "attack_targets"
BASELINE = "raw"

_SUMMARIES: dict[tuple[int, tuple[str, ...]], tuple[pd.DataFrame, pd.DataFrame]] = {}
_SUMMARIES_KEPT = 32


def summary_of(data: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``data[columns]`` as a frequency table of distinct rows (attacks.matching
    ``frequency_table``), computed once per frame and columns: every attack on a table
    matches its classes, not its rows (the same view; the size is the number of
    distinct rows)."""
    key = (id(data), tuple(columns))
    hit = _SUMMARIES.get(key)
    if hit is not None and hit[0] is data:  # the frame itself is kept: its id is unique
        return hit[1]
    summary = frequency_table(data, columns)
    if len(_SUMMARIES) >= _SUMMARIES_KEPT:
        _SUMMARIES.pop(next(iter(_SUMMARIES)))
    _SUMMARIES[key] = (data, summary)
    return summary


def forget_summaries() -> None:
    """Drop the remembered frequency tables (end of a run's audit)."""
    _SUMMARIES.clear()


def attack_targets(
    knowledge: AttackerKnowledge, raw: pd.DataFrame, targets: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, np.ndarray]:
    """(the target records, their positions: matched_view's key): ``targets`` when the
    pipeline sampled them (``load_truth``), else the configured sample of ``raw``'s rows."""
    if targets is not None:
        return targets, np.arange(len(targets), dtype=np.int64)
    rows = expand_rows(raw)
    chosen = knowledge.target_rows(len(rows))
    return rows.iloc[chosen], chosen


def knowledge_of(cfg: AttacksConfig) -> AttackerKnowledge:
    """The attacker model of the config (background knowledge from its attack entry)."""
    bk = cfg.attacks().get("background_knowledge", {})
    return AttackerKnowledge(
        targets=cfg.targets,
        known=tuple(cfg.known) if cfg.known else None,
        background=int(bk.get("eliminate", 0)),
        background_mode=bk.get("mode", "worst"),
        tau=cfg.tau,
        seed=cfg.seed,
    )


def _table_attacks(
    published: pd.DataFrame,
    raw: pd.DataFrame,
    plan: Plan,
    hierarchies: Mapping[str, Hierarchy],
    guarantee: Mapping[str, Any] | None,
    reference: Mapping[str, float],
    levels: Mapping[str, int] | None = None,
    targets: pd.DataFrame | None = None,
) -> dict[str, AttackResult]:
    cfg = plan.config.attacks
    assert cfg is not None
    s = plan.config.schema_
    qis, sa = tuple(s.quasi_identifiers), str(s.sensitive)
    knowledge = knowledge_of(cfg)
    wanted = {k: v for k, v in cfg.attacks().items() if k in TABLE_ATTACK_NAMES}
    if not wanted:
        return {}
    chosen, rows = attack_targets(knowledge, raw, targets)
    view = matched_view(  # remembered: the common attacker matches the same targets
        published,
        chosen,
        qis,
        sa,
        {q: hierarchies[q] for q in qis if q in hierarchies},
        known=knowledge.known_qis(qis),
        target_rows=rows,
        levels=levels,
    )
    out: dict[str, AttackResult] = {}
    for name, params in wanted.items():
        if name == "homogeneity":
            out[name] = homogeneity(view, knowledge, guarantee)
        elif name == "background_knowledge":
            out[name] = background_knowledge(view, knowledge, guarantee)
        elif name == "skewness":
            threshold = float(params.get("threshold", 2.0))
            out[name] = skewness(view, guarantee, ratio_threshold=threshold, reference=reference)
        elif name == "similarity":
            out[name] = similarity(view, hierarchies[sa], knowledge, int(params.get("level", 1)))
        elif name == "linkage":
            risk = float(params.get("risk_threshold", 0.2))
            out[name] = linkage(view, guarantee, risk_threshold=risk)
    return out


def _dp_attacks(
    release: Release, raw: pd.DataFrame, plan: Plan, targets: pd.DataFrame | None = None
) -> dict[str, AttackResult]:
    """Attacks on one DP release: attribute inference where the histogram allows it, and
    membership/differencing simulated with the noise of its (first) count query."""
    cfg = plan.config.attacks
    assert cfg is not None
    wanted = cfg.attacks()
    s = plan.config.schema_
    sa = str(s.sensitive)
    doc = release.document
    params = doc["parameters"]
    planned = planned_guarantee(doc)  # an insecure-seed run claims none; attack the plan
    eps, delta = float(planned["epsilon"]), float(planned["delta"])
    out: dict[str, AttackResult] = {}
    queries: dict[str, Any] = params.get("queries", {})
    first: dict[str, Any] = next(iter(queries.values()), {}) if queries else {}
    keys = [*params.get("partition_by", []), *first.get("group_by", [])]
    levels = first.get("levels", {})
    qis_in = [k for k in keys if k in s.quasi_identifiers and not levels.get(k)]
    if (
        "attribute_inference" in wanted
        and doc["kind"] in ("dp_histogram", "dp_count")
        and len(queries) == 1
        and sa in keys
        and not levels.get(sa)
        and qis_in
        and len(qis_in) == len(keys) - 1
    ):
        histogram = release.data.assign(count=pd.to_numeric(release.data["count"]))
        knowledge = knowledge_of(cfg)
        out["attribute_inference"] = histogram_attribute_inference(
            histogram, attack_targets(knowledge, raw, targets)[0], qis_in, sa,
            epsilon=eps, delta=delta, knowledge=knowledge,
        )  # fmt: skip
    noise = first.get("count_noise")
    if noise and doc["kind"] in ("dp_count", "dp_histogram", "dp_count_distinct"):
        # a person is counted once per cell by a distinct count: L0 cells, one each
        distinct = doc["kind"] == "dp_count_distinct"
        shift = int(params.get("max_partitions") or 1) if distinct else None
        for name, fn in (
            ("membership", membership_inference),
            ("differencing", differencing_attack),
        ):
            if name in wanted:
                # the optimal test's success does not depend on the count: a simulation of
                # this query's noise, the count shifted by one person's full contribution
                # (the L1 sensitivity), against the bound of the query's own epsilon
                out[name] = fn(
                    0,
                    scale=float(noise["scale"]),
                    mechanism=noise["mechanism"],
                    sampler=SeededTestSampler(cfg.seed),  # a simulation, not a release
                    trials=int(wanted[name].get("trials", 10_000)),
                    epsilon=float(first.get("epsilon", eps)),
                    delta=delta,
                    sensitivity=float(noise["sensitivity"]),
                    seed=cfg.seed,
                    shift=shift or person_contribution(params, noise),  # one person's effect
                )
    return out


def report_support(reports: Any) -> np.ndarray:
    """(n x d) booleans: the values each person's report supports (GRR: the reported
    value; unary encodings: the set bits; local hashing: the values hashing to the
    reported bucket); a report supporting nothing supports every value."""
    from privpipe.dp.local import keyed_hash

    n, d = reports.n, reports.d
    if reports.protocol in ("rr", "grr"):
        support = np.zeros((n, d), dtype=bool)
        support[np.arange(n), np.asarray(reports.values, dtype=np.int64)] = True
    elif reports.bits is not None:
        support = reports.unpacked_bits().astype(bool)
    else:
        values = np.arange(d, dtype=np.int64)
        support = np.stack(
            [keyed_hash(reports.keys, int(v), reports.g) == reports.values for v in values], axis=1
        )
    support[~support.any(axis=1)] = True
    return support


def ml_guess(reports: Any, rng: np.random.Generator) -> np.ndarray:
    """The attacker's guess of each person's value from their own report alone: uniform
    among the values the report supports (GRR: the reported value; unary encodings: the
    set bits; local hashing: the values hashing to the reported bucket)."""
    if reports.protocol in ("rr", "grr"):
        return np.asarray(reports.values, dtype=np.int64)
    support = report_support(reports)
    weights = rng.random(support.shape) * support  # uniform choice among supported values
    return np.asarray(weights.argmax(axis=1), dtype=np.int64)


def _local_attack(
    release: Release, raw: pd.DataFrame, plan: Plan, targets: pd.DataFrame | None = None
) -> dict[str, AttackResult]:
    """The attacker reads a target's own local-DP report (simulated with the release's
    protocol and ε on the targets' true values) and guesses the value it supports; the
    bound and the MAP guess use the attribute's real distribution over the public domain
    (posterior odds <= e^ε × prior odds), beside the always-most-common guess."""
    from privpipe.attacks import report_attack
    from privpipe.attacks.ldp import map_guess
    from privpipe.dp.local import perturb
    from privpipe.dp.secure_random import SeededRandom

    cfg = plan.config.attacks
    assert cfg is not None
    params = release.document["parameters"]
    attribute, domain = params["attribute"], [str(v) for v in params["domain"]]
    if attribute not in raw.columns:
        return {}
    chosen = attack_targets(knowledge_of(cfg), raw, targets)[0]
    codes = pd.Categorical(canonical_column(chosen[attribute]), categories=domain).codes
    codes = codes.astype(np.int64)
    codes = codes[codes >= 0]  # values outside the public domain are not reported
    oracle = params["oracle"]
    source = SeededRandom(cfg.seed)  # a simulation of the attacker's view, not a release
    reports = perturb(oracle["protocol"], codes, float(oracle["epsilon"]), len(domain), source)
    guess = ml_guess(reports, np.random.default_rng(cfg.seed))
    everyone = pd.Categorical(canonical_column(raw[attribute]), categories=domain).codes
    weights = raw[WEIGHT].to_numpy(dtype=np.float64) if WEIGHT in raw.columns else None
    present = everyone >= 0
    prior = np.bincount(
        everyone[present], None if weights is None else weights[present], minlength=len(domain)
    ).astype(np.float64)
    eps = float(oracle["epsilon"])
    result = report_attack(
        codes, guess, epsilon=eps, domain_size=len(domain), prior=prior,
        map_guesses=map_guess(report_support(reports), prior, eps),
    )  # fmt: skip
    return {"ldp_report": result}


def _reference(raw: pd.DataFrame, sa: str) -> dict[str, float]:
    """The whole table's share of each sensitive value (canonical strings, as published);
    ``raw`` may be a frequency table (column ``WEIGHT``)."""
    values = pd.Series(canonical_column(raw[sa]))
    if WEIGHT in raw.columns:
        summed = pd.Series(raw[WEIGHT].to_numpy(dtype=np.float64)).groupby(values).sum()
        shares = (summed / summed.sum()).sort_values(ascending=False, kind="stable")
    else:
        shares = values.value_counts(normalize=True)
    return {str(k): float(v) for k, v in shares.items()}


ATTACKED_KINDS = (*ANONYMITY_KINDS, *DP_KINDS, "local_dp")


def load_releases(
    plan: Plan,
    staging: Path,
    kinds: Sequence[str],
    loaded: Mapping[str, Release] | None = None,
    work: Path | None = None,
) -> dict[str, Release]:
    """The staged releases of these kinds, each read once (data as published, release.json;
    an anonymised table as the frequency table of its rows, ``reports.load_release``, the
    one staged in the run's ``work`` folder when given); those in ``loaded`` are reused."""
    from privpipe.reports import load_release
    from privpipe.transforms.audit_truth import published_counts_path

    done = loaded or {}
    return {
        r.name: done.get(r.name)
        or load_release(
            staging / "releases" / r.name,
            None if work is None else published_counts_path(work, r.name),
        )
        for r in plan.config.releases
        if r.kind in kinds
    }


def run_attacks(
    plan: Plan,
    releases: Mapping[str, Release],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    control: pd.DataFrame | None = None,
    targets: pd.DataFrame | None = None,
) -> dict[str, dict[str, AttackResult]]:
    """Every configured attack on the baseline (``raw``) and on the ``releases`` (continual
    counts are published after the attacks, their state advancing last; the attacks on
    them are those of any DP count).

    ``raw`` holds the members (the published input's rows); ``control`` the control records
    of ``attacks.control`` (same columns, never in any release) or None without a control
    set: the common attacker's baseline (pipelines/control.py). ``raw`` may be the rows'
    frequency table (``load_truth``) and ``targets`` the pipeline's sample of target
    records (None: the configured sample of ``raw``'s rows)."""
    s = plan.config.schema_
    qis, sa = list(s.quasi_identifiers), str(s.sensitive)
    reference = _reference(raw, sa)
    results: dict[str, dict[str, AttackResult]] = {
        BASELINE: _table_attacks(
            summary_of(raw, [*qis, sa]),  # the raw table's distinct rows: the baseline
            raw,
            plan,
            hierarchies,
            None,
            reference,
            {q: 0 for q in qis},
            targets,
        )
    }
    wanted = plan.config.attacks.attacks() if plan.config.attacks else {}
    for name, release in releases.items():
        if release.kind in ANONYMITY_KINDS:
            results[name] = _table_attacks(
                summary_of(release.data, [*qis, sa]), raw, plan, hierarchies,
                planned_guarantee(release.document), reference,
                published_levels(release.document), targets,
            )  # fmt: skip
        elif release.kind in DP_KINDS:
            results[name] = _dp_attacks(release, raw, plan, targets)
        elif release.kind == "local_dp" and "ldp_report" in wanted:
            results[name] = _local_attack(release, raw, plan, targets)
    return results


# --------------------------------------------------------------------------- common attacker

COMMON_KINDS = (*ATTACKED_KINDS, "dp_continual_count", "dp_party_histogram")
COUNT_KINDS = ("dp_count", "dp_histogram")


def _cell_query(
    release: Release, sa: str, known: Sequence[str]
) -> tuple[pd.DataFrame, list[str], dict[str, int]] | None:
    """The noisy count cells of a count release (its query with the sensitive attribute
    among the keys and the most known keys), their key columns and levels."""
    params = release.parameters
    data = release.data
    if "count" not in data.columns:
        return None
    if release.kind in COUNT_KINDS:
        queries: dict[str, Any] = params.get("queries") or {}
        options = []
        for name, q in queries.items():
            keys = [*params.get("partition_by", []), *q.get("group_by", [])]
            cells = data[data["query"] == name] if "query" in data.columns else data
            rank = (sa in keys, sum(k in known for k in keys))
            options.append((rank, cells, keys, dict(q.get("levels") or {})))
        if not options:
            return None
        _, cells, keys, levels = max(options, key=lambda o: o[0])
        return cells, keys, {k: int(v) for k, v in levels.items()}
    if release.kind == "dp_continual_count":
        return data, list(params.get("group_by") or []), {}
    attribute = params.get("attribute")
    if release.kind == "dp_party_histogram" and attribute in data.columns:
        return data, [str(attribute)], {}
    return None


def common_model(
    release: Release, plan: Plan, hierarchies: Mapping[str, Hierarchy]
) -> tuple[PosteriorModel, float | None, float, float | None, float, str | None]:
    """The posterior model of one release for the common attacker, with the guarantee its
    bounds use: (model, ε between two values of one record, its δ, membership ε, δ, note).

    Central DP: a record's sensitive value moves one unit between two cells of each count
    query, a likelihood ratio of at most e^(2/scale) per discrete-Laplace query (≤ 2ε,
    group privacy of remove + add, which is used otherwise, with δ·(1 + e^ε))."""
    cfg = plan.config.attacks
    assert cfg is not None
    s = plan.config.schema_
    qis, sa = tuple(s.quasi_identifiers), str(s.sensitive)
    known = knowledge_of(cfg).known_qis(qis)
    doc = release.document
    if release.kind in ANONYMITY_KINDS:
        published = summary_of(release.data, [*qis, sa])
        model = TableModel(
            published, qis, sa, {q: hierarchies[q] for q in qis if q in hierarchies}, known,
            levels=published_levels(doc),
        )  # fmt: skip
        return model, None, 0.0, None, 0.0, None
    if release.kind == "local_dp":
        params = release.parameters
        oracle = dict(params["oracle"])
        ldp_eps = float(oracle["epsilon"])
        note = (
            None
            if params.get("attribute") == sa
            else (f"reports are of {params.get('attribute')!r}, not the sensitive attribute")
        )
        if note:
            return PriorModel(), None, 0.0, ldp_eps, 0.0, note
        domain = tuple(str(v) for v in canonical_column(np.asarray(params["domain"], dtype=object)))
        other = None if params.get("other") is None else str(params["other"])
        lmodel = LocalReportModel(domain, oracle, sa, release.data, seed=cfg.seed, other=other)
        return lmodel, ldp_eps, 0.0, ldp_eps, 0.0, None
    planned = planned_guarantee(doc)
    eps = float(planned.get("epsilon") or 0.0) if planned.get("epsilon") is not None else None
    delta = float(planned.get("delta") or 0.0)
    if eps is None:
        return PriorModel(), None, 0.0, None, 0.0, "the release states no epsilon"
    attr_eps, attr_delta = 2.0 * eps, min(1.0, (1.0 + math.exp(min(eps, 700.0))) * delta)
    noises = [q.get("count_noise") for q in (release.parameters.get("queries") or {}).values()]
    if (
        release.kind in COUNT_KINDS
        and noises
        and all(
            n and n.get("mechanism") == "discrete_laplace" and float(n.get("scale") or 0) > 0
            for n in noises
        )
    ):
        attr_eps = min(attr_eps, sum(2.0 / float(n["scale"]) for n in noises if n))
    found = (
        None
        if release.kind not in (*COUNT_KINDS, *CONTINUAL_KINDS, "dp_party_histogram")
        else _cell_query(release, sa, known)
    )
    if found is None:
        return PriorModel(), attr_eps, attr_delta, eps, delta, None
    cells, keys, levels = found
    cmodel = CellModel(cells, tuple(keys), levels, known, sa, dict(hierarchies))
    note = None
    if cmodel.method == "noisy cells" and any(k in known for k in keys):
        note = (
            "the bound limits what the release says about one record; correlations between "
            "the known quasi-identifiers and the sensitive value that it publishes for "
            "everyone can exceed it (compare control_accuracy)"
        )
    return cmodel, attr_eps, attr_delta, eps, delta, note


def run_common(
    plan: Plan,
    releases: Mapping[str, Release],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    control: pd.DataFrame | None = None,
    targets: pd.DataFrame | None = None,
) -> dict[str, dict[str, Any]]:
    """The common attacker (attacks.common) on the raw table (``BASELINE``) and every
    release: ``{name: {"attribute_inference": {...}, "membership": {...}}}``. ``raw``
    holds members only; ``control`` records of the same population not in the input
    (same columns), or None."""
    cfg = plan.config.attacks
    s = plan.config.schema_
    if cfg is None or not s.sensitive or s.sensitive not in raw.columns:
        return {}
    qis, sa = tuple(s.quasi_identifiers), str(s.sensitive)
    knowledge = knowledge_of(cfg)
    known = knowledge.known_qis(qis)
    chosen, rows = attack_targets(knowledge, raw, targets)
    members = chosen.set_axis(pd.Index(rows))  # positions: matched_view's key
    controls = None if control is None else knowledge.select_targets(control).reset_index(drop=True)
    raw_sa = raw[sa].to_numpy(dtype=object)
    weights = raw[WEIGHT].to_numpy() if WEIGHT in raw.columns else None
    population = public_prior(
        raw_sa, members[sa], None if controls is None else controls[sa], weights=weights
    )
    out = {
        BASELINE: common_attack(
            RawRowsModel(summary_of(raw, [*known, sa]), known, sa),
            members,
            raw_sa,
            sa,
            knowledge,
            control=controls,
            population=population,
        )
    }
    for name, release in releases.items():
        if release.kind not in COMMON_KINDS:
            continue
        model, attr_eps, attr_delta, eps, delta, note = common_model(release, plan, hierarchies)
        out[name] = common_attack(
            model, members, raw_sa, sa, knowledge, control=controls,
            attribute_epsilon=attr_eps, attribute_delta=attr_delta, epsilon=eps, delta=delta,
            note=note, population=population,
        )  # fmt: skip
    forget_views()
    return out


def common_releases(
    plan: Plan, staging: Path, loaded: Mapping[str, Release], work: Path | None = None
) -> dict[str, Release]:
    """Every staged release the common attacker reads (those read already reused)."""
    return load_releases(plan, staging, COMMON_KINDS, loaded, work)


def attacker_summary(
    plan: Plan, records: int, control: pd.DataFrame | None = None
) -> dict[str, Any]:
    """The attacker model of the run, for audit.json (``control``: the control records)."""
    from privpipe.pipelines.control import control_summary

    cfg = plan.config.attacks
    assert cfg is not None
    knowledge = knowledge_of(cfg)
    return {
        "targets": cfg.targets,
        "records": records,
        "known": list(knowledge.known_qis(plan.config.schema_.quasi_identifiers)),
        "background_knowledge": knowledge.background,
        "background_mode": knowledge.background_mode,
        "tau": knowledge.tau,
        "seed": knowledge.seed,
        "attacks": list(cfg.attacks()),
        "control": control_summary(plan, control),
    }


def audit_columns(plan: Plan) -> list[str]:
    """The columns the audit needs from the accepted rows: QIs and the sensitive attribute."""
    s = plan.config.schema_
    return [*s.quasi_identifiers, *([s.sensitive] if s.sensitive else [])]


def staged_targets(plan: Plan) -> int | None:
    """How many target records the pipeline samples for the attacks (``attacks.targets``),
    or None: no attacks, or every record a target (taken from the frequency table)."""
    cfg = plan.config.attacks
    if cfg is None or cfg.targets == "all":
        return None
    return int(cfg.targets)


def typed(table: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """A staged frequency table's columns (strings) back in the types the reader gives
    them (``Int64``, ``float64``), as the rows had them."""
    types = plan.column_types()
    out = {}
    for c in table.columns:
        kind = {"integer": "Int64", "float": "float64"}.get(str(types.get(c)))
        if c != WEIGHT and kind is not None:
            out[c] = _parsed(table[c], kind)
    return table.assign(**out) if out else table


def _parsed(column: pd.Series, dtype: str) -> pd.Series:
    """``pd.to_numeric(column).astype(dtype)``, parsed once per distinct string. Not
    ``attacks.publication.per_distinct``: its distinct values keep the missing one, and
    ``to_numeric`` beside a missing value goes through float64 (integers above 2^53
    change)."""
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    numbers = pd.to_numeric(pd.Series(uniques)).astype(dtype)
    taken = numbers.array.take(codes, allow_fill=True)  # -1: missing
    return pd.Series(taken, index=column.index, name=column.name, dtype=dtype)


def load_truth(plan: Plan, work: Path, name: str = RAW_TABLE) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the pipeline staged for the audit (transforms.audit_truth): the accepted rows'
    frequency table (audit columns and ``WEIGHT``) and the target records (the sampled
    rows; every record, from the table, when ``attacks.targets`` is all or absent). The
    targets frame's ``attrs["records"]`` holds how many rows the input had."""
    from privpipe.transforms.audit_truth import RECORDS

    # distinct rows (a FrequencyTable's, over the strings the read's types print, which
    # parse back to distinct values): a frequency table of all its columns is itself
    table = mark_distinct(typed(read_coded(work / f"{name}_counts.parquet"), plan))
    path = work / f"{name}.parquet"
    if path.exists():
        sample = pd.read_parquet(path)
        records = int(sample[RECORDS].iloc[0]) if len(sample) else 0
        targets = sample.drop(columns=[RECORDS])
    else:
        targets = expand_rows(table)
        records = len(targets)
    targets.attrs["records"] = records
    return table, targets


AUDIT_WORKER_ROWS: Final = 250_000
"""Accepted rows from which the publication attacks run in a worker process beside the
rest of the audit (below, a worker's start-up and its own reading of the staged tables
cost about what it saves)."""


WORKER_STAGE: Final = "worker:publication_attacks"


class PublicationAttacks:
    """The publication attacks in a worker process (``privpipe.workers``), beside the
    driver's common attacker and utility: it reads the staged truth and releases itself
    (from the private work folder; nothing is pickled but the plan, the paths, the
    hierarchies and the publication check) and returns the same entries as the call in
    ``write_audit``. Started when the pipeline ends (its imports overlap the DP noise and
    the attacks), sent its work once every release is staged; ``kill`` on any error."""

    def __init__(self) -> None:
        self.worker = Worker("the publication attacks", warm=(__name__,))

    def send(
        self,
        plan: Plan,
        staging: Path,
        work: Path,
        hierarchies: Mapping[str, Hierarchy],
        checked: Mapping[str, Any],
    ) -> None:
        self.worker.send(
            staged_publication_attacks, plan, staging, work, dict(hierarchies), dict(checked)
        )

    def result(self) -> dict[str, list[dict[str, Any]]]:
        """The entries; the worker's own seconds are timed as ``worker:publication_attacks``
        (beside the driver's stages, like the pipeline's: not part of their sum)."""
        entries, seconds = self.worker.result()
        clock = timing.current()
        if clock is not None:
            clock.add(WORKER_STAGE, seconds)
        return entries  # type: ignore[no-any-return]

    def kill(self) -> None:
        self.worker.kill()


def audit_worker(plan: Plan, rows: int) -> PublicationAttacks | None:
    """A worker for the publication attacks when the audit runs, the input is large enough
    (``AUDIT_WORKER_ROWS``) and there is a second core; else None (computed in line)."""
    if not wants_audit(plan) or rows < AUDIT_WORKER_ROWS or available_cores() < 2:
        return None
    try:
        return PublicationAttacks()
    except OSError:  # no process to be had (limits): the attacks run in line
        return None


def audited_releases(
    plan: Plan, staging: Path, loaded: Mapping[str, Release], work: Path | None
) -> dict[str, Release]:
    """Every staged release of the run, as the audit reads it (those in ``loaded`` reused)."""
    return load_releases(plan, staging, tuple({r.kind for r in plan.config.releases}), loaded, work)


def staged_publication_attacks(
    plan: Plan,
    staging: Path,
    work: Path,
    hierarchies: Mapping[str, Hierarchy],
    checked: Mapping[str, Any],
) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """``publication_attacks`` on what the run staged (its truth and every release, read
    as ``write_audit`` reads them) and the seconds it took: a worker's call."""
    t0 = time.perf_counter()
    raw, targets = load_truth(plan, work)
    releases = audited_releases(plan, staging, {}, work)
    try:
        entries = publication_attacks(plan, releases, raw, hierarchies, checked, targets)
    finally:
        forget_summaries()
    return entries, time.perf_counter() - t0


def wants_audit(plan: Plan) -> bool:
    """A report needs releases and quasi-identifiers (its workload), unless switched off."""
    rc = plan.config.report
    enabled = rc is None or rc.enabled
    return enabled and bool(plan.config.releases) and bool(plan.config.schema_.quasi_identifiers)


def write_audit(
    plan: Plan,
    staging: Path,
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    attacks: Mapping[str, Mapping[str, AttackResult]] | None,
    manifest: Mapping[str, Any],
    loaded: Mapping[str, Release],
    into: Path | None = None,
    common: Mapping[str, Mapping[str, Any]] | None = None,
    work: Path | None = None,
    control: pd.DataFrame | None = None,
    targets: pd.DataFrame | None = None,
    publication: PublicationAttacks | None = None,
) -> dict[str, Path]:
    """audit.json, report.md and report.html of the staged run (into ``into``, default the
    staging folder); releases already read for the attacks are not read again. ``common``:
    ``run_common``'s results (``releases.<name>.common``, ``baseline.common``). ``work``:
    the run's private work folder, whose DP cells (bounded, before noise) split each DP
    release's error into bounding bias and noise. ``publication``: the publication attacks
    running in a worker process since they could start; computed here without it."""
    from privpipe.pipelines.dp_release import bounded_truth
    from privpipe.reports import Run, audit_run, write_reports
    from privpipe.reports.decide import DEFAULT_MAX_ADVANTAGE, recommend

    rc = plan.config.report
    s = plan.config.schema_
    releases = audited_releases(plan, staging, loaded, work)
    run = Run(staging, manifest, releases)
    per_release = None
    baseline = None
    if attacks is not None:
        # plain dicts; reports.normalise_attacks keeps only whitelisted details (never the
        # raw values, e.g. the skewness attack's whole-table distribution)
        per_release = {
            name: {a: res.as_dict() for a, res in found.items()}
            for name, found in attacks.items()
            if name != BASELINE
        }
        baseline = {a: res.as_dict() for a, res in attacks[BASELINE].items()}
    with stage("utility"):  # the audit's figures: utility, workload, attacks' summaries
        audit = audit_run(
            run,
            raw,
            hierarchies=hierarchies,
            attacks=per_release,
            baseline_attacks=baseline,
            columns=list(rc.columns) if rc and rc.columns else audit_columns(plan),
            sensitive=s.sensitive,
            queries=[q.model_dump() for q in rc.queries] if rc else (),
            marginals=rc.marginals if rc else None,
            sweeps=plan.sweeps or None,
            common=common,
            bounded={
                name: bounded_truth(work, name, r.document)
                for name, r in releases.items()
                if work is not None and r.kind in DP_KINDS
            },
        )
    if attacks is not None:
        audit["attacker"] = attacker_summary(plan, records_of(raw), control)
    published = list(manifest.get("published") or [])
    candidates = list(manifest.get("candidates") or [])
    b = plan.config.budget
    audit_ledger = str(plan.resolve(b.audit_ledger)) if b is not None and b.audit_ledger else None
    note = (
        f"Published: {', '.join(published) or 'nothing'}. Candidates (computed and compared, "
        f"never published): {', '.join(candidates) or 'none'}. Every published DP release is "
        f"charged to the dataset's ledger {plan.ledger_path}; DP candidates are "
        + (f"charged to the separate audit ledger {audit_ledger}." if audit_ledger else
           "not charged to any ledger, as they never leave the operator.")
    )  # fmt: skip
    audit["budget"] = {"ledger": str(plan.ledger_path), "audit_ledger": audit_ledger, "note": note}
    charged = (manifest.get("budget") or {}).get("charged_this_run")
    audit["budget"] |= budget_figures(plan, releases, published, charged)
    audit["recommendation"] = recommend(
        audit, rc.max_advantage if rc is not None else DEFAULT_MAX_ADVANTAGE, published
    )
    audit.setdefault("methodology", {})["publication"] = note
    pub = dict(manifest.get("publication") or {})
    audit["publication"] = pub
    if pub.get("linked"):
        for problem in pub["linked"]:
            audit.setdefault("findings", []).append(
                f"LINKED RELEASES PUBLISHED (accept_linked_releases: true): {problem}"
            )
    # the publication as a whole: what the published set gives together (and, marked
    # hypothetical, what publishing a candidate beside it would give)
    if publication is not None:
        from privpipe.reports.render import render_figures

        with stage("report"):  # the plots read no key still to come: drawn while it comes
            figures = render_figures(audit)
        audit["publication_attacks"] = publication.result()
    else:
        figures = None
        with stage("publication_attacks"):
            audit["publication_attacks"] = publication_attacks(
                plan, releases, raw, hierarchies, pub, targets
            )
    audit.setdefault("findings", []).extend(breach_findings(audit["publication_attacks"]))
    forget_summaries()
    with stage("report"):
        return write_reports(into or staging, audit, figures)


def release_charge(release: Release) -> dict[str, Any] | None:
    """What a release's release.json says it charged: central DP ``charged``; local DP
    ``guarantee.ledger_epsilon``; a continual stream its event-level ε (charged once per
    stream). None for releases that spend no budget."""
    doc = release.document
    g = dict(planned_guarantee(doc))  # an insecure-seed run claims none, but was charged
    charged = doc.get("charged")
    if isinstance(charged, Mapping) and charged.get("epsilon") is not None:
        return {
            "epsilon": float(charged["epsilon"]),
            "delta": float(charged.get("delta") or 0.0),
            "unit": "person",
        }
    if g.get("ledger_epsilon") is not None:
        return {
            "epsilon": float(g["ledger_epsilon"]),
            "delta": float(g.get("delta") or 0.0),
            "unit": "person",
        }
    if g.get("model") == "continual" and g.get("epsilon") is not None:
        return {
            "epsilon": float(g["epsilon"]),
            "delta": float(g.get("delta") or 0.0),
            "unit": str(g.get("unit") or "event"),
            "note": str(g.get("charged") or "charged once per stream"),
        }
    return None


def budget_figures(
    plan: Plan,
    releases: Mapping[str, Release],
    published: Sequence[str],
    charged_this_run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``audit["budget"]`` ``releases`` (each DP release's charge from its release.json,
    and which ledger it went to) and ``remaining``/``spent``/``lifetime`` read from the
    dataset's ledger after this run (None, with ``ledger_note``, when it cannot be read).
    A published release the ledger did not charge in this run (a continual stream's later
    period) says so."""
    from privpipe.errors import PrivpipeError
    from privpipe.pipelines.dp_release import open_ledger

    b = plan.config.budget
    per: dict[str, Any] = {}
    for name, r in releases.items():
        charge = release_charge(r)
        if charge is None:
            continue
        if name in published:
            where = "dataset ledger"
        elif b is not None and b.audit_ledger:
            where = "audit ledger"
        else:
            where = "not charged (candidate, never published)"
        per[name] = {**charge, "published": name in published, "ledger": where}
        if name in published and charged_this_run is not None and name not in charged_this_run:
            per[name]["ledger"] = "dataset ledger (charged in an earlier run)"
    out: dict[str, Any] = {"releases": per, "remaining": None, "spent": None, "lifetime": None}
    if b is None or plan.ledger_path is None:
        out["ledger_note"] = "no budget: section in the config (no DP release)"
        return out
    try:
        with open_ledger(plan) as ledger:
            left, spent, life = ledger.remaining(), ledger.spent(), ledger.lifetime
    except PrivpipeError as exc:
        out["ledger_note"] = f"the ledger could not be read: {exc}"
        return out
    out["remaining"] = {"epsilon": float(left.epsilon), "delta": float(left.delta)}
    out["spent"] = {"epsilon": float(spent.epsilon), "delta": float(spent.delta)}
    out["lifetime"] = {"epsilon": float(life.epsilon), "delta": float(life.delta)}
    return out


def headline(results: Mapping[str, Mapping[str, AttackResult]]) -> dict[str, dict[str, float]]:
    """Per release: each attack's headline rate (for the manifest and the console)."""
    return {
        name: {a: float(r.rates["rate"]) for a, r in found.items()}
        for name, found in results.items()
    }


def keep_bounded_split(audit: dict[str, Any], previous: Mapping[str, Any]) -> None:
    """A rebuilt report has no work folder (the DP jobs' bounded cells are gone with the
    run): each DP release keeps the own-estimand figures and bias/noise split its run
    measured, from the previous audit.json, as attack results are kept."""
    before = previous.get("releases") or {}
    for name, entry in (audit.get("releases") or {}).items():
        old = (before.get(name) or {}).get("utility") or {}
        if old.get("noise") is None or (entry.get("utility") or {}).get("noise") is not None:
            continue
        for key in ("own", "bias", "noise", "split"):
            entry["utility"][key] = old.get(key)
        entry["summary"]["own_error"] = (before[name].get("summary") or {}).get("own_error")


def read_columns(plan: Plan, columns: list[str]) -> pd.DataFrame:
    """The input's ``columns`` read directly (``privpipe report`` rebuilding a finished run).

    Rows the pipeline rejected (wrong field count) are skipped here too; values are strings,
    which the audit canonicalises like the pipeline's typed values.
    """
    c = plan.config.input
    frames = []
    for path in plan.input_paths:
        if plan.input_format == "parquet":
            frames.append(pd.read_parquet(path, columns=columns).astype(str))
        elif plan.input_format == "jsonl":
            frames.append(pd.read_json(path, lines=True, dtype=False)[columns].astype(str))
        else:
            frames.append(
                pd.read_csv(
                    path,
                    sep=c.delimiter,
                    quotechar=c.quotechar,
                    encoding=c.encoding,
                    header=0 if c.header else None,
                    names=None if c.header else c.columns,
                    usecols=columns,
                    dtype=str,
                    keep_default_na=False,
                    on_bad_lines="skip",
                    encoding_errors="strict",
                )
            )
    return pd.concat(frames, ignore_index=True)


def members_columns(plan: Plan, run_dir: Path, columns: list[str]) -> pd.DataFrame:
    """The audit ``columns`` of a holdout run's members, split again with the run's key
    (``internal/holdout.key``): the input's own reader and the same holdout transform, so
    the rebuilt truth holds exactly the rows the run published from."""
    import tempfile

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from privpipe.pipelines.control import holdout_share, read_key
    from privpipe.pipelines.runner import new_pipeline
    from privpipe.transforms.holdout import MEMBERS, HoldOut
    from privpipe.transforms.io import ReadMicrodata
    from privpipe.transforms.sink import WriteTable

    key = read_key(run_dir)
    share = holdout_share(plan)
    if share is None:
        raise InputDataError(
            f"{run_dir}: the run held persons out but its config has no "
            "attacks.control.holdout any more; rebuild with the run's config"
        )
    unit = plan.config.schema_.privacy_unit
    with tempfile.TemporaryDirectory(prefix="privpipe-report-") as work:
        with new_pipeline(PipelineOptions()) as p, p:
            read = p | "Read" >> ReadMicrodata(plan.input_spec())
            _ = (
                (read["batches"] | "HoldOut" >> HoldOut(share, key, unit))[MEMBERS]
                | "Members" >> beam.Map(lambda df, c: df[c], columns)
                | "Write" >> (WriteTable(work, RAW_TABLE, columns, "parquet"))
            )
        return pd.read_parquet(Path(work) / f"{RAW_TABLE}.parquet")


def rebuild(run_dirs: list[Path], output: Path | None) -> Path:
    """``privpipe report``: the audit of finished runs rebuilt from their outputs and input.

    Attack results are taken from each run's audit.json (attacks are not re-run); utility
    is recomputed against the input named in the manifest. One run: its report files are
    replaced; several: a comparison (runs as series) is written to ``output``.
    """
    from privpipe.errors import ConfigError
    from privpipe.pipelines.hierarchies import HierarchyResolver
    from privpipe.pipelines.plan import load_plan
    from privpipe.reports import audit_run, compare_runs, load_run, write_reports
    from privpipe.reports.decide import DEFAULT_MAX_ADVANTAGE, recommend

    if len(run_dirs) > 1 and output is None:
        raise ConfigError("several runs are compared into a new folder: give --output DIR")
    audits = []
    labels: list[str] = []
    runs: list[tuple[str, Path, dict[str, Any]]] = []
    for d in run_dirs:
        manifest_path = d / "internal" / "manifest.json"
        if not manifest_path.is_file():
            raise InputDataError(
                f"{d}: not a privpipe run folder (no internal/manifest.json); give the run's "
                "output folder (the one holding public/ and internal/)"
            )
        manifest = json.loads(manifest_path.read_text())
        config = Path(manifest["config"])
        if not config.is_file():
            raise InputDataError(f"{d}: the run's config {config} is gone; cannot rebuild")
        inputs = manifest["input"]
        plan = load_plan(
            config, output_dir=d, input_override=inputs[0] if len(inputs) == 1 else None
        )
        cols = audit_columns(plan)
        held = (manifest.get("control") or {}).get("source") == "holdout"
        raw = members_columns(plan, d, cols) if held else read_columns(plan, cols)
        counts = {c: raw[c].value_counts() for c in cols}
        hierarchies = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)(counts)
        previous = {}
        if (d / "internal" / "audit.json").is_file():
            previous = json.loads((d / "internal" / "audit.json").read_text())
        attacks = {
            name: entry["attacks"]
            for name, entry in previous.get("releases", {}).items()
            if entry.get("attacks")
        }
        baseline = (previous.get("baseline") or {}).get("attacks")
        common = {
            name: entry["common"]
            for name, entry in previous.get("releases", {}).items()
            if entry.get("common")
        }
        if (previous.get("baseline") or {}).get("common"):
            common[BASELINE] = previous["baseline"]["common"]
        rc = plan.config.report
        audit = audit_run(
            load_run(d),
            raw,
            hierarchies=hierarchies,
            attacks=attacks or None,
            baseline_attacks=baseline,
            columns=list(rc.columns) if rc and rc.columns else cols,
            sensitive=plan.config.schema_.sensitive,
            queries=[q.model_dump() for q in rc.queries] if rc else (),
            marginals=rc.marginals if rc else None,
            sweeps=plan.sweeps or None,
            common=common or None,
        )
        for key in ("attacker", "publication", "budget", "publication_attacks"):
            if key in previous:
                audit[key] = previous[key]
        keep_bounded_split(audit, previous)
        audit["recommendation"] = recommend(
            audit, rc.max_advantage if rc is not None else DEFAULT_MAX_ADVANTAGE
        )
        note = (previous.get("methodology") or {}).get("publication")
        if note:
            audit.setdefault("methodology", {})["publication"] = note
        linked = [
            f
            for f in previous.get("findings") or []
            if f.startswith(("LINKED RELEASES", "PUBLICATION ATTACK"))
        ]
        if linked:
            audit.setdefault("findings", []).extend(linked)
        audits.append(audit)
        labels.append(str(manifest.get("run_id", d.name)))
        runs.append((labels[-1], d, manifest))
    if len(audits) == 1:
        target = output or run_dirs[0] / "internal"
        target.mkdir(parents=True, exist_ok=True)
        return write_reports(target, audits[0])["report.html"]
    assert output is not None
    output.mkdir(parents=True, exist_ok=True)
    combined = compare_runs(audits, labels)
    # the runs' public/ folders held together: the latest run's records are the targets
    s = plan.config.schema_
    targets = raw
    if plan.config.attacks is not None:
        targets = knowledge_of(plan.config.attacks).select_targets(raw)
    entries = across_runs(runs, targets, hierarchies, list(s.quasi_identifiers), s.sensitive)
    combined["publication_attacks"] = {"across_runs": entries}
    combined.setdefault("findings", []).extend(breach_findings({"across_runs": entries}))
    return write_reports(output, combined)["report.html"]
