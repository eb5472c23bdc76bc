"""Independent verification of a published anonymised table (DESIGN.md "Fail closed").

The search and Mondrian decide what to publish; this module checks what *is* published,
on a separate code path: it does not import the privacy models, metrics, evaluator or
search, and recounts the equivalence classes of the output table with plain pandas and
numpy, so a bug there cannot hide itself. A release is written only if every check
passes (REFERENCE.md, "Privacy models"):

- every equivalence class (rows with identical published QI labels) has >= k records;
- l-diversity: distinct (>= l distinct SA values), entropy (-sum q ln q >= ln l) or
  recursive (r1 < c (r_l + ... + r_m), counts sorted descending);
- t-closeness: distance(q_E, p) <= t, p the SA distribution of the whole *input* table
  (``input_sa_distribution``, suppressed records included, as the search uses it), with
  the equal, ordered or hierarchical distance written out from the formulas;
- at most floor(suppression_limit * input_records) records are suppressed;
- no record is lost or invented: published + dropped = input records;
- Mondrian: every label of a numeric QI lies on the public grid of its hierarchy
  (``verify_grid_labels``; ``anonymity.grid``), so no range ends on a member's own value.

Suppressed records are a class (unlike ARX): an attacker who finds no kept class for a
target knows it is among them. With ``suppressed: star`` they are the rows whose QIs are
all ``*``, and the whole all-``*`` group (with any genuine class generalised to ``*``
everywhere) is checked as one class, which is what a reader of the table sees. With
``suppressed: drop`` they are absent from the table; their counts are passed separately
(``dropped_counts``) and checked as one class, and without them the check fails. The
number of suppressed records is always passed explicitly.

Privacy units (``spec.unit == "person"``): the counts carry the person id column
(``spec.unit_column``), and every class must hold >= k distinct persons; the SA counts
of a class are distinct persons per SA value (q_E(s) = persons with s / sum over s), an
l-diversity class fails when one SA value is held by every person in it, and p is the
input's person-level distribution (``input_sa_distribution``, as the plan computes it).

Ordered distance orders the SA values numerically when all are numbers, else in the order
of ``input_sa_distribution``'s keys (pass them in the SA domain's order). SA values are
matched as strings (numbers without a spurious ``.0``, like hierarchies match them). The
hierarchical distance walks ``sa_hierarchy`` level by level. Thresholds allow 1e-12 of
floating-point noise, as the search does.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.arrays import sorted_unique
from privpipe.anonymity.grid import interval_grid
from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy, canonical_scalar
from privpipe.anonymity.spec import AnonymizationSpec

__all__ = [
    "MAX_FAILURES",
    "Verification",
    "persons_per_group",
    "verify_counts",
    "verify_grid_labels",
    "verify_table",
]

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]

MAX_FAILURES: Final = 10
"""Failure messages listed per check; the rest are counted."""
EPSILON: Final = 1e-12
"""Floating-point slack of the entropy and distance comparisons."""
_CHUNK_CELLS: Final = 2_000_000
"""Dense (classes x SA values) matrices are built in chunks of about this many cells."""


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one published table.

    ``failures`` are messages for people (the class, the numbers, the threshold); at most
    ``MAX_FAILURES`` per check, then a count. ``classes``/``smallest_class`` are over the
    published (not suppressed) equivalence classes; ``checked`` says what was verified.
    """

    ok: bool
    failures: list[str]
    classes: int
    smallest_class: int
    suppressed_records: int
    checked: list[str]
    records: int = 0
    distances: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON (release.json ``verification``)."""
        return asdict(self)

    def message(self) -> str:
        """One paragraph for a refusal."""
        return "the published table failed verification: " + "; ".join(self.failures)


# --------------------------------------------------------------------------- helpers


def _category_codes(column: pd.Series) -> IntArray:
    """A categorical's codes as int64 (a copy, never a view of the column's), a missing
    cell coded as one value after the categories."""
    codes: IntArray = column.cat.codes.to_numpy().astype(np.int64)
    codes[codes < 0] = len(column.cat.categories)
    return codes


def _coded(column: pd.Series) -> tuple[IntArray, npt.NDArray[np.object_]]:
    """Per row a code, and per code its canonical string (missing cells as ``""``): rows
    share a code exactly when their strings are equal."""
    if isinstance(column.dtype, pd.CategoricalDtype):  # its codes as they are (no hashing)
        raw, uniques = _category_codes(column), column.cat.categories
    else:
        raw, uniques = pd.factorize(column, use_na_sentinel=True)
        raw = np.asarray(raw, dtype=np.int64)
        raw[raw < 0] = len(uniques)
    strings = np.array([canonical_scalar(v) for v in uniques] + [""], dtype=object)
    same, names = pd.factorize(strings)  # distinct values may share one string
    if np.array_equal(same, np.arange(len(strings))):  # no two share one: codes as they are
        return raw, np.asarray(names, dtype=object)
    return np.asarray(same, dtype=np.int64)[raw], np.asarray(names, dtype=object)


def _persons(column: pd.Series) -> IntArray:
    """Codes that tell persons apart: a categorical's own codes (its categories are
    distinct, so are its codes: the frequency table's codes of the persons' hashes), the
    64-bit hashes of the ids (a ``uint64`` column) factorised, else their canonical
    strings."""
    if isinstance(column.dtype, pd.CategoricalDtype):  # missing: one value, as ``_coded``
        return _category_codes(column)
    if column.dtype == np.uint64:
        return np.asarray(pd.factorize(column.to_numpy(dtype=np.uint64))[0], dtype=np.int64)
    return _coded(column)[0]


def _joint(codes: Sequence[IntArray], sizes: Sequence[int]) -> IntArray:
    """One int64 key per row for its tuple of codes (``codes[j]`` in 0..sizes[j]-1):
    equal tuples, equal keys. Mixed-radix, re-densified before the key space would pass
    2^62, so any number of columns fits."""
    key = np.zeros(codes[0].shape[0] if codes else 0, dtype=np.int64)
    space = 1
    for column, size in zip(codes, sizes, strict=True):
        size = max(int(size), 1)
        if space * size >= 1 << 62:
            key = np.asarray(pd.factorize(key)[0], dtype=np.int64)
            space = max(int(key.max()) + 1 if key.size else 1, 1)
        key = key * size + column
        space *= size
    return key


def _dense(key: IntArray) -> tuple[IntArray, int]:
    """Ids 0..n-1 of the distinct keys, in order of first appearance, and n."""
    ids = np.asarray(pd.factorize(key)[0], dtype=np.int64)
    return ids, int(ids.max()) + 1 if ids.size else 0


def persons_per_group(group: IntArray, n_groups: int, person: IntArray, n_persons: int) -> IntArray:
    """How many distinct persons each group holds (a person's several rows in a group count
    once): the distinct (group, person) pairs, sorted as int64 keys (a sort of values, no
    hash table), counted by group."""
    persons = max(n_persons, 1)
    if n_groups * persons < 1 << 62:
        pairs = sorted_unique(group * persons + person)
        return np.bincount(pairs // persons, minlength=n_groups).astype(np.int64)
    once = ~pd.Series(_joint([group, person], [n_groups, n_persons])).duplicated()
    return np.bincount(group[once.to_numpy()], minlength=n_groups).astype(np.int64)


def _firsts(ids: IntArray, n: int) -> IntArray:
    """The first row of each id."""
    first = np.zeros(n, dtype=np.int64)
    if n:
        first[ids[::-1]] = np.arange(ids.shape[0])[::-1]
    return first


def _cap(limit: float, records: int) -> int:
    """floor(limit * records), the limit read as the decimal it was written as."""
    return math.floor(Decimal(repr(float(limit))) * records)


def _pct(share: float) -> str:
    return f"{share * 100:.4g}%"


def _report(
    failures: list[str], indices: IntArray, message: Callable[[int], str], what: str
) -> None:
    """Messages for the first MAX_FAILURES failing classes, then how many more fail."""
    for c in indices[:MAX_FAILURES].tolist():
        failures.append(message(int(c)))
    if indices.shape[0] > MAX_FAILURES:
        failures.append(f"... and {indices.shape[0] - MAX_FAILURES} more classes violate {what}")


# --------------------------------------------------------------------------- entry points


def verify_table(
    table: pd.DataFrame,
    spec: AnonymizationSpec,
    *,
    input_records: int,
    suppressed_records: int,
    input_sa_distribution: Mapping[str, float] | None = None,
    sa_hierarchy: Hierarchy | None = None,
    units: npt.ArrayLike | None = None,
    dropped: pd.DataFrame | None = None,
) -> Verification:
    """Verify a published table (one row per published record): count, then
    ``verify_counts``. Columns other than the QIs and the SA are a failure: nothing
    else may be published. With ``spec.unit == "person"``, ``units`` holds the person id
    of every row of ``table`` (kept apart: it is never published). ``dropped`` holds the
    rows dropped by ``suppressed: drop`` (their SA and person id columns)."""
    wanted = [*spec.qis, *([spec.sensitive] if spec.sensitive else [])]
    extra = [str(c) for c in table.columns if c not in wanted]
    absent = [c for c in wanted if c not in table.columns]
    if absent:
        return _broken(f"the table lacks column(s) {absent}", suppressed_records)
    frame = table[wanted]
    unit = spec.unit_by
    keys = list(wanted)
    if unit is not None:
        if units is None:
            return _broken(f"unit: person but no person ids ({unit}) given", suppressed_records)
        frame = frame.assign(**{unit: np.asarray(units, dtype=object)})
        keys.append(unit)
    counts = frame.groupby(keys, sort=False, dropna=False).size().reset_index(name="count")
    dropped_counts = None
    if dropped is not None:
        rest = [c for c in keys if c not in spec.qis]
        dropped_counts = (
            dropped.groupby(rest, sort=False, dropna=False).size().reset_index(name="count")
            if rest
            else pd.DataFrame({"count": [len(dropped)]})
        )
    result = verify_counts(
        counts,
        spec,
        input_records=input_records,
        suppressed_records=suppressed_records,
        input_sa_distribution=input_sa_distribution,
        sa_hierarchy=sa_hierarchy,
        dropped_counts=dropped_counts,
    )
    if not extra:
        return result
    failures = [
        f"column(s) {extra} would be published but are neither quasi-identifiers nor the "
        "sensitive attribute",
        *result.failures,
    ]
    return Verification(
        False,
        failures,
        result.classes,
        result.smallest_class,
        result.suppressed_records,
        result.checked,
        result.records,
        result.distances,
    )


def _broken(text: str, suppressed_records: int) -> Verification:
    return Verification(False, [text], 0, 0, suppressed_records, [], 0)


def verify_counts(
    class_counts: pd.DataFrame,
    spec: AnonymizationSpec,
    *,
    input_records: int,
    suppressed_records: int,
    input_sa_distribution: Mapping[str, float] | None = None,
    sa_hierarchy: Hierarchy | None = None,
    dropped_counts: pd.DataFrame | None = None,
) -> Verification:
    """Verify the counts of each (published QI labels, SA value) of a table to publish.

    ``class_counts`` has the QI columns, the SA column (if the spec has one), the person
    id column with ``unit: person``, and ``count``. ``dropped_counts`` (SA, person id,
    ``count``; no QIs) are the records ``suppressed: drop`` leaves out, checked as the
    suppressed block. ``suppressed_records`` is how many records were suppressed (present as
    all-``*`` rows with ``suppressed: star``, absent with ``drop``). ``input_records``
    is |D| of the input; ``input_sa_distribution`` (SA value -> share of D) is needed
    for t-closeness, ``sa_hierarchy`` for the hierarchical distance.
    """
    qis = list(spec.qis)
    sa = spec.sensitive
    needs_sa = spec.kind != "k_anonymity"
    unit = spec.unit_by
    wanted = [*qis, *([sa] if sa and needs_sa else []), *([unit] if unit else []), "count"]
    absent = [c for c in wanted if c not in class_counts.columns]
    if absent:
        return _broken(f"the class counts lack column(s) {absent}", suppressed_records)
    if spec.suppressed == "drop" and suppressed_records > 0:
        if dropped_counts is None:
            return _broken(
                f"{suppressed_records} records were dropped but their counts were not given; "
                "the dropped block (a class for an attacker) cannot be checked",
                suppressed_records,
            )
        block = dropped_counts.assign(**dict.fromkeys(qis, SUPPRESSED))
        class_counts = pd.concat([class_counts, block[wanted]], ignore_index=True)
    count = pd.to_numeric(class_counts["count"], errors="coerce")
    if count.isna().any() or (count < 0).any() or (count != np.floor(count)).any():
        return _broken("the class counts must be non-negative integers", suppressed_records)
    frame = class_counts.loc[count.to_numpy() > 0]
    counts = count.to_numpy()[count.to_numpy() > 0].astype(np.int64)
    failures: list[str] = []
    checked: list[str] = []

    # ------------------------------------------------------------- records and suppression
    coded = [_coded(frame[q]) for q in qis]  # per QI: codes of the rows, their labels
    all_star = np.ones(len(frame), dtype=bool)
    for codes, labels in coded:
        all_star &= (labels == SUPPRESSED)[codes]
    star_records = int(counts[all_star].sum())
    dropped = suppressed_records if spec.suppressed == "drop" else 0
    published = int(counts.sum())
    if spec.suppressed == "drop" and dropped_counts is not None:
        # the dropped block's own rows, not the claimed figure, are taken off the total
        block_rows = int(pd.to_numeric(dropped_counts["count"]).sum())
        published -= block_rows
        if block_rows != suppressed_records:
            failures.append(
                f"the dropped block holds {block_rows} records, but {suppressed_records} "
                "are claimed suppressed"
            )
    if suppressed_records < 0:
        failures.append(f"suppressed_records is negative ({suppressed_records})")
    if published + dropped != input_records:
        diff = input_records - published - dropped
        what = f"{diff} record(s) lost" if diff > 0 else f"{-diff} record(s) more than the input"
        failures.append(
            f"the table has {published} records + {dropped} dropped = {published + dropped}, "
            f"but the input had {input_records} ({what})"
        )
    checked.append(f"records: {published} published + {dropped} dropped = {input_records} input")
    cap = _cap(spec.suppression_limit, input_records)
    if suppressed_records > cap:
        failures.append(
            f"{suppressed_records} records suppressed, more than the limit "
            f"floor({spec.suppression_limit:g} x {input_records}) = {cap}"
        )
    checked.append(
        f"suppression: {suppressed_records} <= {cap} "
        f"({_pct(spec.suppression_limit)} of {input_records} records)"
    )
    if spec.suppressed == "star" and star_records < suppressed_records:
        failures.append(
            f"{suppressed_records} records were suppressed but the table has only "
            f"{star_records} rows with every quasi-identifier '*'"
        )

    # ------------------------------------------------------------- classes
    # every row is in a class: the all-'*' block is a class too
    class_of, n_classes = _dense(  # rows with equal labels, in order of first appearance
        _joint([codes for codes, _ in coded], [len(labels) for _, labels in coded])
    )
    sizes = np.bincount(class_of, weights=counts, minlength=n_classes).astype(np.int64)
    person = None
    n_persons = 0
    if unit is not None:  # distinct persons: one (class, person) pair each
        person = _persons(frame[unit])
        n_persons = int(person.max()) + 1 if person.size else 0
        sizes = persons_per_group(class_of, n_classes, person, n_persons)
    what = "persons" if unit is not None else "records"
    first = _firsts(class_of, n_classes)
    names = _Names(qis, coded, first)
    smallest = int(sizes.min()) if n_classes else 0

    _report(
        failures,
        np.flatnonzero(sizes < spec.k),
        lambda c: f"class {names[c]} has {sizes[c]} {what}, fewer than k={spec.k}",
        f"k={spec.k}",
    )
    checked.append(f"k={spec.k} on {n_classes} classes (smallest {smallest} {what})")

    distances: dict[str, float] = {}
    if needs_sa and sa is not None and n_classes:
        cells = _sa_cells(class_of, n_classes, _coded(frame[sa]), counts, person, n_persons)
        if spec.kind == "l_diversity":
            _check_l(spec, cells, sizes, names, failures, checked)
            if person is not None:
                top = cells.groupby("cls")["n"].max().reindex(range(n_classes), fill_value=0)
                every = np.flatnonzero(top.to_numpy(np.int64) >= sizes)
                _report(
                    failures,
                    every,
                    lambda c: (
                        f"class {names[c]}: one {sa} value is held by all its {sizes[c]} "
                        "persons (certain disclosure)"
                    ),
                    "person-level l-diversity",
                )
        else:
            distances = _check_t(
                spec, cells, sizes, names, input_sa_distribution, sa_hierarchy, failures, checked
            )
    return Verification(
        not failures,
        failures,
        n_classes,
        smallest,
        int(suppressed_records),
        checked,
        published,
        distances,
    )


class _Names:
    """Names of classes for messages (built only for the classes named)."""

    def __init__(
        self,
        qis: Sequence[str],
        coded: Sequence[tuple[IntArray, npt.NDArray[np.object_]]],
        first: IntArray,
    ):
        self.qis = qis
        self.coded = coded
        self.first = first

    def __getitem__(self, c: int) -> str:
        row = int(self.first[c])
        pairs = zip(self.qis, self.coded, strict=True)
        shown = (f"{q}={labels[codes[row]]}" for q, (codes, labels) in pairs)
        return "[" + ", ".join(shown) + "]"


def _sa_cells(
    class_of: IntArray,
    n_classes: int,
    sa: tuple[IntArray, npt.NDArray[np.object_]],
    counts: IntArray,
    person: IntArray | None,
    n_persons: int,
) -> pd.DataFrame:
    """(cls, sa, n) per class and SA value present, sorted by class then SA string: ``n``
    the records, or with persons the distinct persons, holding the value in the class."""
    codes, values = sa
    pair, n_pairs = _dense(_joint([class_of, codes], [n_classes, len(values)]))
    if person is None:
        n = np.bincount(pair, weights=counts, minlength=n_pairs)
    else:  # each (class, value, person) once
        n = persons_per_group(pair, n_pairs, person, n_persons)
    first = _firsts(pair, n_pairs)
    cls, value = class_of[first], codes[first]
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(len(values))
    order = np.lexsort((rank[value], cls))
    return pd.DataFrame(
        {
            "cls": cls[order],
            "sa": pd.Series(values[value[order]], dtype=object),
            "n": np.asarray(n, dtype=np.int64)[order],
        }
    )


# --------------------------------------------------------------------------- l-diversity


def _check_l(
    spec: AnonymizationSpec,
    cells: pd.DataFrame,
    sizes: IntArray,
    names: _Names,
    failures: list[str],
    checked: list[str],
) -> None:
    assert spec.l is not None
    n_classes = sizes.shape[0]
    cls = cells["cls"].to_numpy(dtype=np.int64)
    n = cells["n"].to_numpy(dtype=np.int64)
    sa = spec.sensitive
    what = f"l={spec.l:g} ({spec.variant})"
    if spec.variant == "distinct":
        distinct = np.bincount(cls, minlength=n_classes)

        def few(c: int) -> str:
            values = cells.loc[cls == c, "sa"].tolist()
            shown = ", ".join(map(repr, values[:3])) + (" ..." if len(values) > 3 else "")
            return (
                f"class {names[c]} has {distinct[c]} distinct {sa} value(s) ({shown}), "
                f"fewer than l={spec.l:g}"
            )

        _report(failures, np.flatnonzero(distinct < spec.l), few, what)
        checked.append(f"l={spec.l:g} (distinct) on {n_classes} classes")
    elif spec.variant == "entropy":
        totals = np.bincount(cls, weights=n, minlength=n_classes)  # = sizes for records
        q = n / totals[cls]
        entropy = -np.bincount(cls, weights=q * np.log(q), minlength=n_classes)
        floor = math.log(spec.l)
        _report(
            failures,
            np.flatnonzero(entropy < floor - EPSILON),
            lambda c: (
                f"class {names[c]}: entropy of {sa} {entropy[c]:.6g} < "
                f"log(l={spec.l:g}) = {floor:.6g}"
            ),
            what,
        )
        checked.append(f"l={spec.l:g} (entropy) on {n_classes} classes")
    else:
        assert spec.c is not None
        order = np.lexsort((-n, cls))
        s_cls, s_n = cls[order], n[order]
        starts = np.searchsorted(s_cls, np.arange(n_classes))
        rank = np.arange(s_cls.shape[0]) - starts[s_cls]
        top = np.zeros(n_classes, dtype=np.int64)
        top[s_cls[rank == 0]] = s_n[rank == 0]
        weights = np.where(rank >= int(spec.l) - 1, s_n, 0)
        tail = np.bincount(s_cls, weights=weights, minlength=n_classes)
        c_value = spec.c
        _report(
            failures,
            np.flatnonzero(~(top < c_value * tail)),
            lambda c: (
                f"class {names[c]}: most frequent {sa} count r1={top[c]} is not below "
                f"c x (r{int(spec.l or 0)} + ... + rm) = {c_value:g} x {int(tail[c])} = "
                f"{c_value * tail[c]:g}"
            ),
            what,
        )
        checked.append(f"(c={spec.c:g}, l={spec.l:g}) recursive on {n_classes} classes")


# --------------------------------------------------------------------------- t-closeness


def _numeric_order(values: Sequence[str]) -> list[str] | None:
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return None
    if not all(math.isfinite(x) for x in numbers):
        return None
    return [v for _, v in sorted(zip(numbers, values, strict=True), key=lambda p: p[0])]


def _check_t(
    spec: AnonymizationSpec,
    cells: pd.DataFrame,
    sizes: IntArray,
    names: _Names,
    distribution: Mapping[str, float] | None,
    hierarchy: Hierarchy | None,
    failures: list[str],
    checked: list[str],
) -> dict[str, float]:
    assert spec.t is not None
    sa = spec.sensitive
    if distribution is None or not distribution:
        failures.append("t-closeness cannot be verified without the input SA distribution")
        return {}
    keys = [canonical_scalar(k) for k in distribution]
    shares = np.array([float(v) for v in distribution.values()], dtype=np.float64)
    if len(set(keys)) != len(keys) or not np.isfinite(shares).all() or (shares < 0).any():
        failures.append("the input SA distribution has repeated values or invalid shares")
        return {}
    if abs(float(shares.sum()) - 1.0) > 1e-9:
        failures.append(f"the input SA distribution sums to {shares.sum():.12g}, not 1")
        return {}
    if spec.distance == "hierarchical":
        if hierarchy is None:
            failures.append("hierarchical t-closeness cannot be verified without the SA hierarchy")
            return {}
        key_codes = hierarchy.encode(pd.Series(keys, dtype=object))
        if (key_codes < 0).any():
            failures.append(f"{sa} values of the input are not in the SA hierarchy")
            return {}
        p = np.zeros(hierarchy.domain_size, dtype=np.float64)
        np.add.at(p, key_codes, shares)
        column = hierarchy.encode(pd.Series(cells["sa"].to_numpy(), dtype=object))
    else:
        order = _numeric_order(keys) if spec.distance == "ordered" else None
        domain = order if order is not None else keys
        index = pd.Index(domain, dtype=object)
        p = shares[pd.Index(keys, dtype=object).get_indexer(index)]
        column = index.get_indexer(pd.Index(cells["sa"].to_numpy(), dtype=object))
    unknown = column < 0
    if unknown.any():
        values = sorted(set(cells.loc[unknown, "sa"].tolist()))[:5]
        failures.append(f"{sa} value(s) {values} are published but not in the input distribution")
        return {}
    cls = cells["cls"].to_numpy(dtype=np.int64)
    n = cells["n"].to_numpy(dtype=np.float64)
    n_classes = sizes.shape[0]
    totals = np.bincount(cls, weights=n, minlength=n_classes)  # = sizes for records
    m = p.shape[0]
    distance = np.zeros(n_classes, dtype=np.float64)
    step = max(1, _CHUNK_CELLS // max(m, 1))
    bounds = np.searchsorted(cls, np.arange(0, n_classes + step, step))
    for i, start in enumerate(range(0, n_classes, step)):
        stop = min(start + step, n_classes)
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        q = np.zeros((stop - start, m), dtype=np.float64)
        q[cls[lo:hi] - start, column[lo:hi]] = n[lo:hi] / totals[cls[lo:hi]]
        if spec.distance == "equal":
            distance[start:stop] = 0.5 * np.abs(q - p).sum(axis=1)
        elif spec.distance == "ordered":
            distance[start:stop] = _ordered(q, p)
        else:
            assert hierarchy is not None
            distance[start:stop] = _hierarchical(q, p, hierarchy)
    t = spec.t
    _report(
        failures,
        np.flatnonzero(distance > t + EPSILON),
        lambda c: (
            f"class {names[c]} ({sizes[c]} records): {spec.distance} distance of its "
            f"{sa} distribution to the table's is {distance[c]:.6g} > t={t:g}"
        ),
        f"t={t:g}",
    )
    largest = float(distance.max()) if n_classes else 0.0
    checked.append(
        f"t={spec.t:g} ({spec.distance} distance) on {n_classes} classes (largest {largest:.6g})"
    )
    return {"largest": largest, "mean": float(distance.mean()) if n_classes else 0.0}


def _ordered(q: FloatArray, p: FloatArray) -> FloatArray:
    """(1/(m-1)) sum_i |sum_{j<=i} (q - p)_j| per row of q."""
    m = p.shape[0]
    if m <= 1:
        return np.zeros(q.shape[0], dtype=np.float64)
    return np.asarray(np.abs(np.cumsum(q - p, axis=1)).sum(axis=1) / (m - 1), dtype=np.float64)


def _hierarchical(q: FloatArray, p: FloatArray, hierarchy: Hierarchy) -> FloatArray:
    """Li et al.: extra = q - p at the leaves, summed up the tree; each inner node N costs
    height(N)/H x min(positive extra, negative extra of its children)."""
    height = hierarchy.height
    cost = np.zeros(q.shape[0], dtype=np.float64)
    if height == 0:
        return cost
    extra = q - p  # per node of the current level (level 0: the leaves = raw codes)
    child_ids = np.arange(hierarchy.domain_size)
    for level in range(1, height + 1):
        ids = np.asarray(hierarchy.label_ids(level), dtype=np.int64)
        n_parents = int(ids.max()) + 1
        parent = np.zeros(extra.shape[1], dtype=np.int64)
        parent[child_ids] = ids  # the parent of each node of the level below
        member = np.zeros((extra.shape[1], n_parents), dtype=np.float64)
        member[np.arange(extra.shape[1]), parent] = 1.0
        positive = np.clip(extra, 0.0, None) @ member
        negative = np.clip(-extra, 0.0, None) @ member
        cost += (level / height) * np.minimum(positive, negative).sum(axis=1)
        extra = extra @ member
        child_ids = ids
    return cost


def verify_grid_labels(
    table: pd.DataFrame, spec: AnonymizationSpec, hierarchies: Mapping[str, Hierarchy]
) -> list[str]:
    """Failures (empty if none): labels of a Mondrian release's numeric QIs that are not
    ranges over whole cells of the public grid of the QI's hierarchy (``anonymity.grid``),
    or, where the hierarchy defines no interval grid, not labels of the hierarchy.
    ``table`` is the published table or its class counts (only distinct labels are read)."""
    if spec.algorithm != "mondrian":
        return []
    failures: list[str] = []
    for name in spec.numeric:
        if name not in table.columns or name not in hierarchies:
            failures.append(f"quasi-identifier {name!r}: no column or hierarchy to check")
            continue
        hierarchy = hierarchies[name]
        labels = [str(v) for v in pd.unique(table[name].dropna().astype(str))]
        labels = [v for v in labels if v != SUPPRESSED]
        grid = interval_grid(hierarchy)
        if grid is None:
            known = {str(v) for lv in range(hierarchy.levels) for v in hierarchy.label_names(lv)}
            bad = [v for v in labels if v not in known]
            where = "are not labels of its hierarchy (which defines no interval grid)"
        else:
            bad = [v for v, ok in zip(labels, grid.on_grid(labels), strict=True) if not ok]
            where = f"are not ranges over whole intervals of its hierarchy's level {grid.level}"
        if bad:
            shown = ", ".join(repr(v) for v in bad[:MAX_FAILURES])
            failures.append(f"quasi-identifier {name!r}: {len(bad)} label(s) {where}: {shown}")
    return failures
