"""The anonymisation API for notebooks, and the steps the Beam pipeline runs separately.

``anonymize(df, spec, hierarchies)`` does the whole release on a DataFrame:

1. summarise the QIs and the SA (``Summary.from_frame``);
2. ``plan_recoding`` on the summary only (the pipeline runs it on one worker): refuse
   unreachable guarantees with the numbers, search the lattice (``optimal`` /
   ``heuristic``) or run Mondrian, and turn the result into a ``Recoding`` (published
   labels per distinct raw QI tuple), with its metrics and risk before and after;
3. ``publish`` the rows: recode, drop suppressed rows if ``suppressed: drop``, keep the
   QI and SA columns only; **no other column is ever published** (person ids, names,
   attributes outside the schema are left out of the release);
4. ``verify_table`` recounts the output on a separate code path; if it fails, nothing is
   released (``PrivacyRefusal``, exit 4);
5. ``release_document`` is release.json's content; ``verified`` is true only when step 4
   passed.

The published table is in a uniformly random order drawn from the OS CSPRNG
(``dp.secure_random.SecureRandom.permutation``), a fresh one per call: row i of two
releases of the same data is not the same record, and the order says nothing about the
input order or about which rows belong to one person. Tests may pass a seeded source
(``order=SeededRandom(seed)``); nothing else does.

Metrics are ``anonymity.quality.recoding_metrics`` for both the input (every QI at
level 0) and the output, so full-domain and Mondrian releases are comparable (flat keys:
``loss``, ``loss_arithmetic``, ``loss_per_attribute``, ...). Risk
(prosecutor, journalist with the table as population, marketer) is computed on the
published class sizes; suppressed records are left out, as ARX does.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.models import PrivacyModel
from privpipe.anonymity.mondrian import mondrian
from privpipe.anonymity.quality import measure_recoding, summary_rows
from privpipe.anonymity.recoding import Recoding
from privpipe.anonymity.risk import journalist, marketer, prosecutor
from privpipe.anonymity.search import SearchResult, search
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import Summary, group_rows, resolve_hierarchies
from privpipe.anonymity.transformation import Evaluator
from privpipe.anonymity.verify import (
    Verification,
    persons_per_group,
    verify_grid_labels,
    verify_table,
)
from privpipe.dp.secure_random import RandomSource, SecureRandom
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

__all__ = [
    "AnonymizedRelease",
    "InputBaseline",
    "RecodingPlan",
    "anonymize",
    "identity_recoding",
    "input_baseline",
    "input_sa_distribution",
    "person_class_sizes",
    "plan_recoding",
    "publish",
    "recoding_from_search",
    "release_document",
    "shuffled",
]

IntArray: TypeAlias = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class RecodingPlan:
    """What to publish, decided on the summary: the recoding and how it was found.

    ``search`` describes the run (algorithm, ``transformation`` levels per QI or Mondrian
    ``partitions``, ``nodes_checked``, ``seconds``, ``suppressed_records``). Metrics and
    risk are JSON-ready dicts. ``input_records`` and ``input_sa_distribution`` (SA value
    -> share of the whole input, every value of the SA domain) are what the verification
    of the published table needs.
    """

    recoding: Recoding
    search: dict[str, Any]
    metrics_input: dict[str, Any]
    metrics_output: dict[str, Any]
    risk_input: dict[str, Any]
    risk_output: dict[str, Any]
    input_records: int
    input_sa_distribution: dict[str, float] | None

    @property
    def suppressed_records(self) -> int:
        """Records the recoding suppresses."""
        return int(self.search["suppressed_records"])


@dataclass(frozen=True, eq=False)
class AnonymizedRelease:
    """A verified release: the table to publish and everything release.json says."""

    table: pd.DataFrame
    recoding: Recoding
    plan: RecodingPlan
    verification: Verification
    document: dict[str, Any]


# --------------------------------------------------------------------------- recodings


def _distinct_tuples(summary: Summary) -> IntArray:
    """The distinct raw QI tuples of the summary, sorted (as ``np.unique(axis=0)``, but
    with one packed int64 key per tuple instead of a sort of rows)."""
    if summary.n_distinct == 0:
        return np.zeros((0, summary.n_qi), dtype=np.int64)
    _, first = summary.qi_groups()
    return np.asarray(summary.qi_codes[first], dtype=np.int64)


def recoding_from_search(
    result: SearchResult, summary: Summary, hierarchies: Mapping[str, Hierarchy]
) -> Recoding:
    """The recoding of a full-domain search result: every distinct raw QI tuple of the
    summary gets its labels at the chosen levels; tuples in suppressed classes are ``*``."""
    codes = _distinct_tuples(summary)
    classes = result.classes
    if classes.evaluator.summary is summary:  # the tuples are rows of the evaluator's summary
        index = classes.row_classes(summary.qi_groups()[1])
    else:
        index = classes.classify(codes)
    if (index < 0).any():
        raise RuntimeError("a QI tuple of the summary is in no class of the search result")
    suppressed = result.assessment.suppressed[index]
    # "levels" is also the level hint quality.recoding_metrics reads labels with
    description = {"type": "full_domain", "algorithm": result.algorithm, "levels": result.levels}
    return _full_domain(summary, hierarchies, codes, result.transformation, suppressed, description)


def identity_recoding(
    summary: Summary, hierarchies: Mapping[str, Hierarchy], tuples: IntArray | None = None
) -> Recoding:
    """The input as a recoding: every QI at level 0, nothing suppressed (input metrics).
    ``tuples`` are the summary's distinct raw QI tuples when already at hand (shared)."""
    codes = _distinct_tuples(summary) if tuples is None else tuples
    nothing = np.zeros(codes.shape[0], dtype=bool)
    levels = [0] * summary.n_qi
    return _full_domain(summary, hierarchies, codes, levels, nothing, {"type": "identity"})


def _full_domain(
    summary: Summary,
    hierarchies: Mapping[str, Hierarchy],
    codes: IntArray,
    levels: Sequence[int],
    suppressed: npt.NDArray[np.bool_],
    description: Mapping[str, Any],
) -> Recoding:
    """The recoding of ``codes`` at one level per QI, from the hierarchies' label ids at
    those levels (as ``full_domain_labels`` would label them, without a label per tuple)."""
    chosen = [hierarchies[name] for name in summary.qi_names]
    return Recoding.from_label_ids(
        summary.qi_names,
        codes,
        [
            h.label_ids(int(lv))[codes[:, j]]
            for j, (h, lv) in enumerate(zip(chosen, levels, strict=True))
        ],
        [h.label_names(int(lv)) for h, lv in zip(chosen, levels, strict=True)],
        suppressed,
        description,
    )


@dataclass(frozen=True, eq=False)
class InputBaseline:
    """The input's own scores on a summary (every QI at level 0, nothing suppressed): the
    metrics and the class sizes the input risk is computed from (records, or persons when
    the summary has units). They depend on the summary and its hierarchies only, not on the
    release, so the releases of one summary can share one (``plan_recoding(baselines=)``)."""

    metrics: dict[str, Any]
    sizes: IntArray


def input_baseline(
    summary: Summary, hierarchies: Mapping[str, Hierarchy], tuples: IntArray | None = None
) -> InputBaseline:
    """Measure the input as a recoding (``identity_recoding``; ``tuples`` as there). Its
    labels are the level-0 labels, read at level 0 whatever ``numeric`` says, so no
    release's settings enter."""
    if summary.n_qi and summary.n_distinct and _level_zero_is_identity(summary, hierarchies):
        return _identity_baseline(summary)
    return measured_baseline(summary, hierarchies, tuples)


def measured_baseline(
    summary: Summary, hierarchies: Mapping[str, Hierarchy], tuples: IntArray | None = None
) -> InputBaseline:
    """``input_baseline`` measured on the identity recoding, whatever level 0 is."""
    identity = identity_recoding(summary, hierarchies, tuples)
    metrics, sizes = measure_recoding(identity, summary, hierarchies, levels=[0] * summary.n_qi)
    if summary.has_units:  # risk per person: 1 / persons in the class
        sizes = person_class_sizes(identity, summary)
    return InputBaseline(_plain(metrics), sizes)


def _level_zero_is_identity(summary: Summary, hierarchies: Mapping[str, Hierarchy]) -> bool:
    """Whether every QI's level 0 gives each raw value a label of its own, one leaf under
    it and no two labels with one string: then each distinct QI tuple is a class of its own."""
    for h in resolve_hierarchies(summary.qi_names, hierarchies):
        ids, names = h.label_ids(0), h.label_names(0)
        if np.unique(ids).shape[0] != ids.shape[0] or (h.leaves_under(0) != 1).any():
            return False
        if len({str(v) for v in names.tolist()}) != names.shape[0]:
            return False
    return True


def _identity_baseline(summary: Summary) -> InputBaseline:
    """What ``measure_recoding`` finds for the input when level 0 is the identity, without
    recoding or reading a label: no loss, entropy, divergence or suppression (each value
    read as itself), and each distinct QI tuple a class of its records (its persons for
    the risk). The figures are those of the measure exactly (a test compares them)."""
    tuple_of_row, first = summary.qi_groups()
    n_tuples = int(first.shape[0])
    weights = summary.counts.astype(np.float64)
    records = np.rint(np.bincount(tuple_of_row, weights=weights, minlength=n_tuples))
    records = records.astype(np.int64)
    n = summary.n_records
    metrics: dict[str, Any] = {
        "loss": 0.0,
        "loss_arithmetic": 0.0,
        "loss_per_attribute": dict.fromkeys(summary.qi_names, 0.0),
        "discernibility": float(int(np.dot(records, records))),
        "average_class_size": n / max(n_tuples, 1),
        "precision": 0.0,
        "non_uniform_entropy": 0.0,
        "kl_divergence": 0.0,
        "suppressed_records": 0,
        "classes": n_tuples,
    }
    sizes = records
    if summary.has_units:  # distinct persons per tuple
        units = summary.dense_units()
        sizes = persons_per_group(tuple_of_row, n_tuples, units.ids, units.n_units)
    return InputBaseline(_plain(metrics), sizes)


def input_sa_distribution(summary: Summary) -> dict[str, float] | None:
    """SA value -> share of all input records, over the whole SA domain, in code order
    (the order ordered t-closeness uses); None without an SA. With privacy units, the
    share of (person, value) pairs: distinct persons with the value over the sum of
    that over all values (the p of person-level t-closeness)."""
    if not summary.has_sa:
        return None
    counts = summary.sa_counts()
    if summary.unit_codes is not None:
        counts = summary.sa_unit_counts()
    values = summary.sa_values
    names = [str(v) for v in values] if values is not None else [str(i) for i in range(len(counts))]
    total = float(counts.sum())
    return {name: float(count) / total for name, count in zip(names, counts, strict=True)}


def _risk(sizes: IntArray, suppressed: int, unit: str = "rows") -> dict[str, Any]:
    """Risk figures of classes of ``sizes`` (records, or persons with ``unit: person``:
    a person's prosecutor risk is 1 / persons in the class)."""
    return {
        "prosecutor": prosecutor(sizes).as_dict(),
        "journalist": journalist(sizes).as_dict(),
        "marketer": marketer(sizes),
        "suppressed_records": int(suppressed),
        "unit": unit,
    }


def person_class_sizes(recoding: Recoding, summary: Summary) -> IntArray:
    """Distinct persons per published class of ``recoding`` (kept classes only; suppressed
    tuples left out as the record-level risk does), classes in order of their first
    tuple. Integer keys throughout: a class id per tuple from its factorised labels; when
    each person's rows share one tuple, the sum of the class's tuples' persons, else the
    distinct (class, person) pairs of the kept summary rows, packed in one int64."""
    assert summary.unit_codes is not None
    n_tuples = recoding.n_tuples
    if n_tuples == 0 or summary.n_distinct == 0:
        return np.zeros(0, dtype=np.int64)
    row = summary_rows(recoding, summary)  # the recoding's row of each summary row
    if (row < 0).any():
        raise RuntimeError("a QI tuple of the summary is not in the recoding")
    columns = [_label_ids(ids, names) for ids, names in recoding.label_factors()]
    group, first = group_rows(columns, [int(c.max()) + 1 for c in columns])
    rank = np.empty(first.shape[0], dtype=np.int64)  # classes in order of first tuple
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    kept_tuples = ~np.asarray(recoding.suppressed, dtype=bool)
    units = summary.dense_units()
    unit_tuple = row[units.first_rows]  # the tuple of each person's first row
    if np.array_equal(unit_tuple[units.ids], row):  # each person's rows share one tuple
        persons = np.bincount(unit_tuple, minlength=n_tuples)
        sizes = np.bincount(
            rank[group][kept_tuples], weights=persons[kept_tuples], minlength=first.shape[0]
        )
        sizes = np.rint(sizes).astype(np.int64)
        return np.asarray(sizes[sizes > 0], dtype=np.int64)
    kept = kept_tuples[row]
    cls = rank[group][row][kept]
    sizes = persons_per_group(cls, first.shape[0], units.ids[kept], units.n_units)
    return np.asarray(sizes[sizes > 0], dtype=np.int64)


def _label_ids(raw: npt.NDArray[Any], uniques: npt.NDArray[Any]) -> IntArray:
    """One id per distinct label *as a string* (``1`` and ``"1"`` are one class), from a
    column's factorised labels (``Recoding.label_factors``): the distinct values' strings
    factorised, then gathered per tuple (a string copy of every tuple's label took
    seconds at 10M rows)."""
    ids = np.asarray(pd.factorize(np.asarray(uniques).astype(str))[0], dtype=np.int64)
    return ids[np.asarray(raw, dtype=np.int64)]


# --------------------------------------------------------------------------- planning


def _check_summary(summary: Summary, spec: AnonymizationSpec) -> None:
    if summary.qi_names != spec.qis:
        raise ConfigError(
            f"the summary has quasi-identifiers {list(summary.qi_names)}, the release "
            f"{list(spec.qis)}; summarise with the release's quasi-identifiers in its order"
        )
    if spec.kind != "k_anonymity" and (not summary.has_sa or summary.sa_name != spec.sensitive):
        raise ConfigError(
            f"kind {spec.kind} needs a summary of the sensitive attribute {spec.sensitive!r}"
        )
    if summary.n_records == 0:
        raise InputDataError("no records to anonymise: the input has no rows")
    if (spec.unit == "person") != summary.has_units:
        raise ConfigError(
            f"the release counts {spec.unit} but the summary was built "
            f"{'with' if summary.has_units else 'without'} a privacy unit; summarise with "
            "Summary.from_frame(..., unit=spec.unit_by)"
        )


def plan_recoding(
    summary: Summary,
    spec: AnonymizationSpec,
    hierarchies: Mapping[str, Hierarchy],
    sa_hierarchy: Hierarchy | None = None,
    baselines: MutableMapping[Summary, InputBaseline] | None = None,
) -> RecodingPlan:
    """Decide the recoding on the summary: feasibility, search or Mondrian, metrics, risk.

    ``baselines``: the input's own scores (``input_baseline``) already measured, by summary
    (the releases of one summary share them); this summary's is measured here if absent,
    after the search, on a thread beside the output's metrics, and added.

    Raises PrivacyRefusal (exit 4) with the numbers when the guarantee is unreachable
    (k above |D|, l above the distinct SA values, or no transformation within the
    suppression limit), ConfigError for settings that do not fit the data.
    """
    _check_summary(summary, spec)
    distinct_sa = int((summary.sa_counts() > 0).sum()) if summary.has_sa else None
    spec.check_feasible(summary.n_units, distinct_sa)
    models = spec.models(sa_hierarchy)
    recoding, info = _search_recoding(summary, spec, hierarchies, models)
    baseline = None if baselines is None else baselines.get(summary)
    # once the search's caches are freed: the input's scores (if not measured yet), the
    # output's person class sizes and the input's SA shares on threads beside the output's
    # metrics (numpy's sorts and gathers run without the GIL); leaving the block waits for
    # them all, whatever was raised
    with ThreadPoolExecutor(2, thread_name_prefix="privpipe-measures") as pool:
        measuring = None
        if baseline is None:
            # a full-domain recoding is keyed by exactly the summary's sorted distinct tuples
            tuples = recoding.codes if spec.algorithm != "mondrian" else None
            measuring = pool.submit(input_baseline, summary, hierarchies, tuples)
        persons = pool.submit(person_class_sizes, recoding, summary) if summary.has_units else None
        sa_shares = pool.submit(input_sa_distribution, summary)
        metrics_output, output_sizes = measure_recoding(
            recoding, summary, hierarchies, numeric=spec.numeric
        )
    if measuring is not None:
        baseline = measuring.result()
        if baselines is not None:
            baselines[summary] = baseline
    assert baseline is not None
    suppressed = summary.n_records - int(output_sizes.sum())
    if suppressed != info["suppressed_records"]:
        raise PrivacyRefusal(
            f"the recoding suppresses {suppressed} records but the {info['algorithm']} "
            f"result reports {info['suppressed_records']}; nothing is published"
        )
    info["unit"] = spec.unit
    if persons is not None:
        output_sizes = persons.result()
    return RecodingPlan(
        recoding,
        info,
        copy.deepcopy(baseline.metrics),  # each plan its own: the baseline may be shared
        _plain(metrics_output),
        _risk(baseline.sizes, 0, spec.unit),
        _risk(output_sizes, suppressed, spec.unit),
        summary.n_records,
        sa_shares.result(),
    )


def _search_recoding(
    summary: Summary,
    spec: AnonymizationSpec,
    hierarchies: Mapping[str, Hierarchy],
    models: Sequence[PrivacyModel],
) -> tuple[Recoding, dict[str, Any]]:
    """The recoding ``spec`` asks for (Mondrian, or the lattice search's optimum) and the
    figures of how it was found; the privacy refusals of the search are raised here."""
    started = time.perf_counter()
    info: dict[str, Any]
    if spec.algorithm == "mondrian":
        outcome = mondrian(
            summary,
            hierarchies,
            models,
            numeric=spec.numeric,
            suppression_limit=spec.suppression_limit,
        )
        recoding = outcome.recoding
        info = {
            "algorithm": "mondrian",
            "partitions": int(outcome.partitions),
            "numeric": list(spec.numeric),
            "seconds": outcome.seconds,
            "suppressed_records": int(outcome.suppressed_records),
        }
    else:
        # models blind to the SA (k-anonymity) count classes without SA cells
        evaluator = Evaluator(summary, hierarchies, use_sa=any(m.needs_sa for m in models))
        resolved = resolve_hierarchies(spec.qis, hierarchies)
        lattice = evaluator.lattice(
            [spec.min_levels.get(q, 0) for q in spec.qis],
            [spec.max_levels.get(q, h.height) for q, h in zip(spec.qis, resolved, strict=True)],
        )
        result = search(
            evaluator,
            models,
            algorithm=spec.algorithm,
            suppression_limit=spec.suppression_limit,
            metric=spec.metric,
            lattice=lattice,
            time_limit=spec.time_limit_s,
            sa_cells=False,  # the recoding needs the classes, not their SA cells
        )
        recoding = recoding_from_search(result, summary, hierarchies)
        info = {
            "algorithm": result.algorithm,
            "transformation": dict(result.levels),
            "metric": result.metric,
            "value": result.value,
            "nodes_checked": result.nodes_checked,
            "lattice_size": result.lattice_size,
            "proven_optimal": result.proven_optimal,
            "seconds": result.seconds,
            "suppressed_records": int(result.suppressed_records),
        }
        del evaluator, result  # free the search's per-row caches before measuring
    info["total_seconds"] = time.perf_counter() - started
    return recoding, info


# --------------------------------------------------------------------------- publishing


def publish(
    frame: pd.DataFrame,
    spec: AnonymizationSpec,
    recoding: Recoding,
    hierarchies: Mapping[str, Hierarchy],
) -> tuple[pd.DataFrame, int]:
    """Recode a frame (or a batch) for publication: the QI and SA columns only, QIs as
    published labels, suppressed rows all ``*`` or dropped. Returns the table and the
    number of suppressed records in it. The rows keep the input order: this is a step,
    not a publication — ``anonymize`` and the Beam writer shuffle before anything is
    written."""
    table, suppressed = _recode(frame, spec, recoding, hierarchies)
    if spec.suppressed == "drop":
        table = table.loc[~suppressed]
    return table.reset_index(drop=True), int(suppressed.sum())


def _recode(
    frame: pd.DataFrame,
    spec: AnonymizationSpec,
    recoding: Recoding,
    hierarchies: Mapping[str, Hierarchy],
) -> tuple[pd.DataFrame, npt.NDArray[np.bool_]]:
    """Every row recoded (suppressed ones as ``*``) and which rows are suppressed."""
    columns = [*spec.qis, *([spec.sensitive] if spec.sensitive else [])]
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise InputDataError(f"column(s) {absent} not in the data; fix the schema or the input")
    recoded, suppressed = recoding.apply(frame[columns], hierarchies)
    return recoded[columns], np.asarray(suppressed, dtype=bool)


def shuffled(table: pd.DataFrame, order: RandomSource | None = None) -> pd.DataFrame:
    """The rows of ``table`` in a uniformly random order (CSPRNG unless a test passes a
    seeded ``order`` source), with a fresh 0..n-1 index."""
    source = SecureRandom() if order is None else order
    return table.iloc[source.permutation(len(table))].reset_index(drop=True)


def _transformation(spec: AnonymizationSpec, plan: RecodingPlan) -> dict[str, Any]:
    if spec.algorithm == "mondrian":
        return {
            "type": "local_recoding",
            "algorithm": "mondrian",
            "partitions": plan.search.get("partitions"),
            "numeric": list(spec.numeric),
        }
    return {"type": "full_domain", "levels": dict(plan.search.get("transformation", {}))}


def release_document(
    spec: AnonymizationSpec, plan: RecodingPlan, verification: Verification
) -> dict[str, Any]:
    """release.json's content: what was promised, how it was reached, what it cost, and
    whether the published table passed the independent check (``verified``)."""
    document: dict[str, Any] = {}
    if spec.name:
        document["name"] = spec.name
    document.update(
        {
            "kind": spec.kind,
            "parameters": spec.parameters(),
            "guarantee": spec.guarantee(),
            "transformation": _transformation(spec, plan),
            "search": dict(plan.search),
            "records": {
                "input": plan.input_records,
                "published": verification.records,
                "suppressed": verification.suppressed_records,
                "suppressed_as": spec.suppressed,
            },
            "metrics": {"input": plan.metrics_input, "output": plan.metrics_output},
            "risk": {"input": plan.risk_input, "output": plan.risk_output},
            "verification": verification.as_dict(),
            "verified": bool(verification.ok),
        }
    )
    plain: dict[str, Any] = _plain(document)
    return plain


def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy scalars and arrays to Python, tuples to lists, non-finite
    floats to None (strict JSON has no NaN)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- all at once


def anonymize(
    df: pd.DataFrame,
    spec: AnonymizationSpec,
    hierarchies: Mapping[str, Hierarchy],
    *,
    sa_hierarchy: Hierarchy | None = None,
    order: RandomSource | None = None,
) -> AnonymizedRelease:
    """Anonymise a DataFrame per ``spec`` and verify the result (module docstring).

    ``hierarchies`` maps each QI to its hierarchy; ``sa_hierarchy`` (the SA's) is needed
    for hierarchical t-closeness and, when given, fixes the SA domain. Raises
    PrivacyRefusal (exit 4) when the guarantee is unreachable or the output fails
    verification, InputDataError (exit 3) for values missing from a hierarchy. The table
    is in a uniformly random order (``shuffled``; ``order`` is for tests only).
    """
    sa = spec.sensitive
    unit = spec.unit_by
    summary = Summary.from_frame(
        df, spec.qis, sa, hierarchies, sa_hierarchy if sa else None, unit=unit
    )
    plan = plan_recoding(summary, spec, hierarchies, sa_hierarchy)
    recoded, mask = _recode(df, spec, plan.recoding, hierarchies)
    suppressed = int(mask.sum())
    keep = ~mask if spec.suppressed == "drop" else np.ones(len(df), dtype=bool)
    others = [c for c in (sa, unit) if c is not None]
    dropped = df.loc[mask, others] if spec.suppressed == "drop" else None
    # one uniformly random order for the table and the person of each of its rows
    perm = (SecureRandom() if order is None else order).permutation(int(keep.sum()))
    table = recoded.loc[keep].reset_index(drop=True).iloc[perm].reset_index(drop=True)
    units = None if unit is None else df[unit].to_numpy()[keep][perm]
    verification = verify_table(
        table,
        spec,
        input_records=len(df),
        suppressed_records=suppressed,
        input_sa_distribution=plan.input_sa_distribution,
        sa_hierarchy=sa_hierarchy,
        units=units,
        dropped=dropped,
    )
    if suppressed != plan.suppressed_records:
        raise PrivacyRefusal(
            f"recoding the rows suppressed {suppressed} records, the plan {plan.suppressed_records}"
            "; nothing is published"
        )
    if not verification.ok:
        raise PrivacyRefusal(f"{spec.describe()}: {verification.message()}")
    off_grid = verify_grid_labels(table, spec, hierarchies)
    if off_grid:
        raise PrivacyRefusal(f"{spec.describe()}: {'; '.join(off_grid)}; nothing is published")
    document = release_document(spec, plan, verification)
    return AnonymizedRelease(table, plan.recoding, plan, verification, document)
