"""Privacy models checked per equivalence class, and suppression with a limit.

Every model answers, vectorised over classes, which classes violate it (REFERENCE.md,
"Privacy models"). ``assess`` combines models with a suppression limit: the records of
classes that violate any model are suppressed (released with every QI ``*``); the node
satisfies the models when their number is at most ``floor(limit * |D|)``. The remaining
classes then satisfy every model, because each check depends only on the class itself
and, for t-closeness, on the fixed distribution p of the *whole* table D: as ARX does,
p is taken over the original table (suppressed records included) and is not recomputed
after suppression.

The suppressed block is a class (unlike ARX). An attacker who knows the target is in the
table and finds no kept class matching its QIs knows it is among the suppressed records
(published as ``*`` rows, or dropped: the attacker then knows it was dropped). So when
anything is suppressed, ``assess`` checks the block of all suppressed records as one more
class, and a node whose block violates a model does *not* satisfy the models (it is not
made safe by suppressing more: more suppressed records give a different node a chance,
and the search simply takes the best node whose block is safe). Where the block already
satisfies the models, the outcome is ARX's.

Privacy units: when the evaluator's summary carries a privacy unit, the models are checked
on the person-counted view of the classes (``Evaluator.in_units``): k counts distinct
persons; the SA counts of a class are distinct persons per SA value (a person with m
values in the class counts once for each, so q_E(s) = n_persons(E, s) / sum_s
n_persons(E, s), and p likewise over the table); and an l-diversity model (l > 1) also
fails a class in which one SA value is held by every person, because the attacker then
learns with certainty that the target has it (with one record per person that class is
homogeneous, which l > 1 excludes anyway). That last condition is not monotone, so it is
checked per node beside the models (``certain_values``), never used for pruning. The
suppression limit stays in records.

Monotonicity (``PrivacyModel.monotone``): if a node satisfies the model, so does every
generalisation of it, also with a suppression limit. True for k-anonymity and distinct
l-diversity only. Entropy and recursive (c,l)-diversity and t-closeness are monotone
without suppression (merging classes that satisfy them yields a class that does), but
not with suppression (merging a violating class into a satisfying one can produce a
larger violating class), so searches must check those nodes themselves.

Logarithms of entropy l-diversity are natural (the test compares with log l, so the base
does not matter). Threshold comparisons allow 1e-12 of floating-point noise.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from privpipe.errors import ConfigError

__all__ = [
    "Assessment",
    "DistinctLDiversity",
    "EntropyLDiversity",
    "KAnonymity",
    "PrivacyModel",
    "RecursiveCLDiversity",
    "TCloseness",
    "assess",
    "certain_values",
    "check_models",
    "class_distinct",
    "class_entropy",
    "describe_models",
    "max_suppressed",
    "recursive_cl_holds",
    "shared_by_all",
    "t_distance",
    "violating_classes",
]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
Distance: TypeAlias = Literal["equal", "ordered", "hierarchical"]

EPSILON: Final = 1e-12
"""Floating-point slack of threshold comparisons (entropy, t-closeness distances)."""


# --------------------------------------------------------------------------- statistics


def _needs_sa(classes: EquivalenceClasses, what: str) -> IntArray:
    if classes.cell_sa is None:
        raise ConfigError(f"{what} needs a sensitive attribute (schema.sensitive)")
    return classes.cell_sa


def shared_by_all(classes: EquivalenceClasses) -> BoolArray:
    """Per class: whether one SA value is held by every unit of the class. Only possible
    for a person-counted view (else it is a homogeneous class); all False for records."""
    if not classes.in_units or classes.cell_sa is None:
        return np.zeros(classes.n_classes, dtype=bool)
    top = np.zeros(classes.n_classes, dtype=np.int64)
    np.maximum.at(top, classes.cell_class, classes.cell_count)
    return np.asarray(top >= classes.sizes, dtype=np.bool_)


CERTAIN: Final = "no SA value held by every person"
"""The person-level l-diversity condition's name in ``Assessment.violations``."""


def certain_values(classes: EquivalenceClasses, models: Sequence[PrivacyModel]) -> BoolArray | None:
    """Per class of a person-counted view: whether one SA value is held by every person,
    when some l-diversity model (l > 1) asks for l-diversity; None when not applicable.

    Kept apart from the models' own checks because it is not monotone: two classes in
    which no value is shared by all can merge into one where one is (p1 {a}, p2 {b} and
    p1 {b}, p2 {a} give p1, p2 {a, b}), so it must never take part in the search's
    pruning by monotonicity."""
    wanted = any(
        isinstance(m, DistinctLDiversity | EntropyLDiversity | RecursiveCLDiversity) and m.l > 1
        for m in models
    )
    if not wanted or not classes.in_units:
        return None
    return shared_by_all(classes)


def class_distinct(classes: EquivalenceClasses) -> IntArray:
    """Number of distinct SA values per class."""
    _needs_sa(classes, "l-diversity")
    return np.bincount(classes.cell_class, minlength=classes.n_classes).astype(np.int64)


def _wsum(index: IntArray, weights: npt.ArrayLike, length: int) -> FloatArray:
    """Sum of ``weights`` per index (np.bincount with weights, typed as floats)."""
    return np.asarray(np.bincount(index, weights=weights, minlength=length), dtype=np.float64)


def _shares(classes: EquivalenceClasses) -> FloatArray:
    """q_E(s) of every cell: its count over its class's total (its size, for records)."""
    return classes.cell_count / classes.sa_totals()[classes.cell_class]


def class_entropy(classes: EquivalenceClasses) -> FloatArray:
    """Entropy -sum_s q_E(s) ln q_E(s) of the SA distribution of each class (nats)."""
    _needs_sa(classes, "entropy l-diversity")
    q = _shares(classes)
    terms = q * np.log(q)
    return -_wsum(classes.cell_class, terms, classes.n_classes)


def recursive_cl_holds(classes: EquivalenceClasses, c: float, l: int) -> BoolArray:  # noqa: E741
    """Whether each class satisfies r1 < c (r_l + ... + r_m) (counts sorted descending).

    r1 + ... + r_(l-1) are found by taking each class's largest count away l-1 times
    (cells are grouped by class: one ``reduceat`` each), not by sorting every cell by
    (class, count): a lexsort was ~20% of the 3M demo's recursive-l search."""
    _needs_sa(classes, "recursive (c,l)-diversity")
    cls = classes.cell_class
    counts = classes.cell_count
    n = classes.n_classes
    starts = classes.class_starts()
    if n == 0 or cls.shape[0] == 0 or bool(np.any(np.diff(np.append(starts, cls.shape[0])) == 0)):
        return _recursive_by_sorting(classes, c, l)  # a class without cells
    remaining = counts.astype(np.int64, copy=True)
    r1 = np.maximum.reduceat(remaining, starts)
    total = np.add.reduceat(remaining, starts)
    taken = np.zeros(n, dtype=np.int64)
    for step in range(l - 1):
        largest = r1 if step == 0 else np.maximum.reduceat(remaining, starts)
        taken += largest
        at = np.flatnonzero(remaining == largest[cls])  # a class's first such cell goes
        first = np.ones(at.shape[0], dtype=bool)
        np.not_equal(cls[at[1:]], cls[at[:-1]], out=first[1:])
        remaining[at[first]] = 0
    return r1 < c * (total - taken)


def _recursive_by_sorting(classes: EquivalenceClasses, c: float, l: int) -> BoolArray:  # noqa: E741
    """``recursive_cl_holds`` by sorting each class's counts (any classes)."""
    cls = classes.cell_class
    counts = classes.cell_count
    order = np.lexsort((-counts, cls))
    sorted_cls, sorted_counts = cls[order], counts[order]
    starts = classes.class_starts()
    rank = np.arange(sorted_cls.shape[0]) - starts[sorted_cls]
    top = np.zeros(classes.n_classes, dtype=np.int64)
    top[sorted_cls[rank == 0]] = sorted_counts[rank == 0]
    tail_weights = np.where(rank >= l - 1, sorted_counts, 0)
    tail = _wsum(sorted_cls, tail_weights, classes.n_classes)
    return top < c * tail


def t_distance(
    classes: EquivalenceClasses, distance: Distance, hierarchy: Hierarchy | None = None
) -> FloatArray:
    """Distance between each class's SA distribution q_E and the table's p (REFERENCE.md).

    ``equal``: 1/2 sum |q - p|. ``ordered``: (1/(m-1)) sum_i |sum_{j<=i} (q - p)_j| over
    the SA codes in order. ``hierarchical``: Li et al.'s EMD over ``hierarchy`` with
    ground distance height(lowest common ancestor)/H. It is computed as
    (1/(2H)) sum_{levels l<H} sum_{nodes N at l} |extra(N)|, which equals
    sum_N height(N)/H min(pos_extra(N), neg_extra(N)) because
    min(pos, neg) = (sum_children |extra| - |extra(N)|) / 2 (the sum telescopes).
    All three are sparse: only cells present in a class are visited.
    """
    _needs_sa(classes, "t-closeness")
    p = classes.sa_distribution
    assert p is not None
    if distance == "equal":
        return _hierarchical(classes, p, None)
    if distance == "hierarchical":
        if hierarchy is None:
            raise ConfigError("hierarchical t-closeness needs the SA hierarchy")
        _check_sa_hierarchy(classes.evaluator, hierarchy)
        return _hierarchical(classes, p, hierarchy)
    if distance == "ordered":
        return _ordered(classes, p)
    raise ConfigError(f"unknown t-closeness distance {distance!r}; use equal/ordered/hierarchical")


def _hierarchical(
    classes: EquivalenceClasses, p: FloatArray, hierarchy: Hierarchy | None
) -> FloatArray:
    """(1/(2H)) sum over levels < H of sum_N |q(N) - p(N)| (H = 1 is equal distance)."""
    sa = _needs_sa(classes, "t-closeness")
    n_classes = classes.n_classes
    q = _shares(classes)
    cls = classes.cell_class
    height = 1 if hierarchy is None else hierarchy.height
    total = np.zeros(n_classes, dtype=np.float64)
    for level in range(height):
        if level == 0:
            group_class, group_q, group_p = cls, q, p[sa]
        else:
            assert hierarchy is not None
            ids = hierarchy.label_ids(level)
            n_labels = int(ids.max()) + 1
            p_level = _wsum(ids, p, n_labels)
            key = cls * n_labels + ids[sa]
            if n_classes * n_labels <= 8 * key.shape[0] + 4096:  # dense: no sort
                dense = _wsum(key, q, n_classes * n_labels).reshape(n_classes, n_labels)
                total += np.abs(dense - p_level).sum(axis=1)
                continue
            groups, inverse = np.unique(key, return_inverse=True)
            group_q = _wsum(inverse.ravel(), q, int(groups.shape[0]))
            group_class = groups // n_labels
            group_p = p_level[groups % n_labels]
        # sum over all nodes |q - p| = sum over nodes with q > 0 of (|q - p| - p) + sum p
        terms = np.abs(group_q - group_p) - group_p
        total += _wsum(group_class, terms, n_classes) + 1.0
    return np.maximum(total / (2.0 * height), 0.0)


def _ordered(classes: EquivalenceClasses, p: FloatArray) -> FloatArray:
    """Ordered distance with sparse cells: sum |Q_E(i) - P(i)| over constant segments."""
    sa = _needs_sa(classes, "t-closeness")
    m = p.shape[0]
    n_classes = classes.n_classes
    if m <= 1:
        return np.zeros(n_classes, dtype=np.float64)
    cumulative_p = np.cumsum(p)[: m - 1]  # P(i), i = 0..m-2, non-decreasing
    prefix = np.concatenate([[0.0], np.cumsum(cumulative_p)])  # prefix[x] = sum_{i<x} P(i)
    cls = classes.cell_class
    sizes = classes.sa_totals()
    starts = classes.class_starts()
    # Q_E after each cell (exact integer cumulative counts, one division)
    running = np.cumsum(classes.cell_count)
    offset = running[starts] - classes.cell_count[starts]
    q_after = (running - offset[cls]) / sizes[cls]
    # the segment of each cell: from its SA code to the next cell's (or m-1 for the last)
    is_last = np.ones(cls.shape[0], dtype=bool)
    is_last[:-1] = cls[1:] != cls[:-1]
    seg_end = np.where(is_last, m - 1, np.concatenate([sa[1:], [m - 1]]))
    seg_start = np.minimum(sa, m - 1)
    split = np.clip(np.searchsorted(cumulative_p, q_after, side="left"), seg_start, seg_end)
    below = q_after * (split - seg_start) - (prefix[split] - prefix[seg_start])
    above = (prefix[seg_end] - prefix[split]) - q_after * (seg_end - split)
    total = _wsum(cls, below + above, n_classes)
    total += prefix[sa[starts]]  # before a class's first SA code, Q_E = 0 <= P
    return np.asarray(np.maximum(total / (m - 1), 0.0), dtype=np.float64)


def _check_sa_hierarchy(evaluator: Evaluator, hierarchy: Hierarchy) -> None:
    values = evaluator.summary.sa_values
    same = hierarchy.domain_size == evaluator.sa_domain and (
        values is None or list(values) == list(hierarchy.values)
    )
    if not same:
        raise ConfigError(
            f"the SA hierarchy {hierarchy.attribute!r} does not match the SA encoding of the "
            "summary; summarise with Summary.from_frame(..., sa_hierarchy=<that hierarchy>)"
        )


# --------------------------------------------------------------------------- models


class PrivacyModel(ABC):
    """A privacy model: which equivalence classes violate it."""

    monotone: ClassVar[bool] = False
    needs_sa: ClassVar[bool] = True

    @abstractmethod
    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        """Per class: True if the class violates the model."""

    @abstractmethod
    def describe(self) -> str:
        """Short text for messages, e.g. ``k=5``."""

    @abstractmethod
    def guarantee(self) -> dict[str, Any]:
        """The guarantee as release.json states it, e.g. ``{"k": 5}``."""

    def validate(self, evaluator: Evaluator) -> None:
        """ConfigError if the model cannot be checked on this evaluator's summary."""
        if self.needs_sa and not evaluator.use_sa:
            raise ConfigError(f"{self.describe()} needs a sensitive attribute (schema.sensitive)")


def _positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _number(value: object, name: str, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not (low <= number <= high) or math.isnan(number):
        raise ConfigError(f"{name} must lie in [{low}, {high}], got {value!r}")
    return number


@dataclass(frozen=True)
class KAnonymity(PrivacyModel):
    """k-anonymity: every class has at least k records. Monotone."""

    k: int
    monotone: ClassVar[bool] = True
    needs_sa: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", _positive_int(self.k, "k"))

    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        return classes.sizes < self.k

    def describe(self) -> str:
        return f"k={self.k}"

    def guarantee(self) -> dict[str, Any]:
        return {"k": self.k}


@dataclass(frozen=True)
class DistinctLDiversity(PrivacyModel):
    """Distinct l-diversity: at least l distinct SA values per class. Monotone."""

    l: int  # noqa: E741
    monotone: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "l", _positive_int(self.l, "l"))

    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        return class_distinct(classes) < self.l

    def describe(self) -> str:
        return f"l={self.l} (distinct)"

    def guarantee(self) -> dict[str, Any]:
        return {"l": self.l, "variant": "distinct"}


@dataclass(frozen=True)
class EntropyLDiversity(PrivacyModel):
    """Entropy l-diversity: entropy of the class's SA distribution >= log l. Not monotone
    with suppression (checked per node)."""

    l: float  # noqa: E741

    def __post_init__(self) -> None:
        object.__setattr__(self, "l", _number(self.l, "l", 1.0))

    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        return class_entropy(classes) < math.log(self.l) - EPSILON

    def describe(self) -> str:
        return f"l={self.l:g} (entropy)"

    def guarantee(self) -> dict[str, Any]:
        return {"l": self.l, "variant": "entropy"}


@dataclass(frozen=True)
class RecursiveCLDiversity(PrivacyModel):
    """Recursive (c,l)-diversity: r1 < c (r_l + ... + r_m). Not treated as monotone."""

    c: float
    l: int  # noqa: E741

    def __post_init__(self) -> None:
        object.__setattr__(self, "c", _number(self.c, "c", 0.0))
        if self.c <= 0:
            raise ConfigError(f"c must be positive, got {self.c!r}")
        object.__setattr__(self, "l", _positive_int(self.l, "l"))

    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        return ~recursive_cl_holds(classes, self.c, self.l)

    def describe(self) -> str:
        return f"(c={self.c:g}, l={self.l})-diversity (recursive)"

    def guarantee(self) -> dict[str, Any]:
        return {"l": self.l, "variant": "recursive", "c": self.c}


@dataclass(frozen=True)
class TCloseness(PrivacyModel):
    """t-closeness: distance(q_E, p) <= t, p the SA distribution of the whole table.

    ``ordered`` uses the SA codes' order (the summary's ``sa_values``: hierarchy rows, an
    explicit ``sa_order`` or sorted values); ``hierarchical`` needs the SA hierarchy the
    summary was encoded with. Not monotone with suppression (checked per node).
    """

    t: float
    distance: Distance = "equal"
    hierarchy: Hierarchy | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "t", _number(self.t, "t", 0.0, 1.0))
        if self.distance not in ("equal", "ordered", "hierarchical"):
            raise ConfigError(
                f"unknown t-closeness distance {self.distance!r}; use equal, ordered or "
                "hierarchical"
            )
        if self.distance == "hierarchical" and self.hierarchy is None:
            raise ConfigError("hierarchical t-closeness needs the hierarchy of the SA")

    def distances(self, classes: EquivalenceClasses) -> FloatArray:
        """The distance of every class."""
        return t_distance(classes, self.distance, self.hierarchy)

    def violating(self, classes: EquivalenceClasses) -> BoolArray:
        return self.distances(classes) > self.t + EPSILON

    def validate(self, evaluator: Evaluator) -> None:
        super().validate(evaluator)
        if self.hierarchy is not None and self.distance == "hierarchical":
            _check_sa_hierarchy(evaluator, self.hierarchy)

    def describe(self) -> str:
        return f"t={self.t:g} ({self.distance} distance)"

    def guarantee(self) -> dict[str, Any]:
        return {"t": self.t, "distance": self.distance}


# --------------------------------------------------------------------------- assessment


@functools.lru_cache(maxsize=256)
def max_suppressed(limit: float, n_records: int) -> int:
    """floor(limit * |D|), with the limit read as the decimal it was written as."""
    number = _number(limit, "suppression_limit", 0.0, 1.0)
    return math.floor(Decimal(repr(number)) * n_records)


def check_models(
    models: Sequence[PrivacyModel] | PrivacyModel, evaluator: Evaluator
) -> tuple[PrivacyModel, ...]:
    """The models as a non-empty tuple, validated against the evaluator (ConfigError)."""
    items = (models,) if isinstance(models, PrivacyModel) else tuple(models)
    if not items:
        raise ConfigError("no privacy model given (e.g. k-anonymity with k >= 2)")
    for model in items:
        if not isinstance(model, PrivacyModel):
            raise ConfigError(f"not a privacy model: {model!r}")
        model.validate(evaluator)
    return items


def describe_models(models: Sequence[PrivacyModel]) -> str:
    """``k=5, l=3 (distinct)``."""
    return ", ".join(model.describe() for model in models)


@dataclass(frozen=True, eq=False)
class Assessment:
    """The outcome of checking a node: which classes are suppressed and whether it passes.

    ``suppressed`` marks the classes violating at least one model (their records are
    suppressed); ``satisfied`` is True when ``suppressed_records <= max_suppressed`` and
    the suppressed block, as one class, satisfies every model (``block_violations``
    lists the models it violates). ``violations`` gives, per model, the records in
    classes violating it. ``unit`` is ``person`` when classes were counted in persons.
    """

    classes: EquivalenceClasses
    models: tuple[PrivacyModel, ...]
    suppression_limit: float
    suppressed: BoolArray
    suppressed_records: int
    max_suppressed: int
    satisfied: bool
    violations: dict[str, int]
    masks: tuple[BoolArray, ...]
    block_violations: tuple[str, ...] = ()
    unit: str = "rows"

    def needed_for(self, models: Sequence[PrivacyModel]) -> int:
        """Records that would be suppressed for a subset of ``models`` alone."""
        mask = np.zeros(self.classes.n_classes, dtype=bool)
        for model, bad in zip(self.models, self.masks, strict=True):
            if model in models:
                mask |= bad
        return int(self.classes.sizes[mask].sum())

    @property
    def levels(self) -> tuple[int, ...]:
        """The node's levels."""
        return self.classes.levels

    @property
    def suppressed_share(self) -> float:
        """Suppressed records over |D|."""
        return self.suppressed_records / self.classes.n_records

    @property
    def kept(self) -> BoolArray:
        """Classes released (not suppressed)."""
        return ~self.suppressed


def violating_classes(
    classes: EquivalenceClasses, models: Sequence[PrivacyModel]
) -> tuple[BoolArray, tuple[BoolArray, ...], BoolArray | None]:
    """Per class, checked in the evaluator's unit (``Evaluator.in_units``): whether it
    violates some model or the person-level condition, each model's own mask, and that
    condition's mask (``certain_values``; None when it does not apply)."""
    view = classes.evaluator.in_units(classes)  # the classes themselves without a unit
    violating = np.zeros(classes.n_classes, dtype=bool)
    masks = []
    for model in models:
        bad = model.violating(view)
        violating |= bad
        masks.append(bad)
    certain = certain_values(view, models)
    if certain is not None:
        violating |= certain
    return violating, tuple(masks), certain


def assess(
    classes: EquivalenceClasses,
    models: Sequence[PrivacyModel] | PrivacyModel,
    suppression_limit: float = 0.0,
) -> Assessment:
    """Check ``models`` on every class and apply the suppression limit (module docstring)."""
    items = (models,) if isinstance(models, PrivacyModel) else tuple(models)
    cap = max_suppressed(suppression_limit, classes.n_records)
    evaluator = classes.evaluator
    if evaluator.units is not None and not classes.in_units:
        early = _fails_in_records(classes, items, suppression_limit, cap)
        if early is not None:
            return early
    violating, masks, certain = violating_classes(classes, items)
    violations = {
        model.describe(): int(classes.sizes[bad].sum())
        for model, bad in zip(items, masks, strict=True)
    }
    if certain is not None:  # not a model's mask: it is not monotone (certain_values)
        violations[CERTAIN] = int(classes.sizes[certain].sum())
    needed = (
        int(classes.sizes[violating].sum())
        if len(items) > 1 or certain is not None
        else violations[items[0].describe()]
    )
    block: tuple[str, ...] = ()
    if needed and needed <= cap:  # the suppressed records are one more class
        whole = evaluator.block(classes, violating)
        block = tuple(m.describe() for m in items if bool(m.violating(whole)[0]))
        certain = certain_values(whole, items)
        if certain is not None and bool(certain[0]):
            block += (CERTAIN,)
    return Assessment(
        classes,
        items,
        float(suppression_limit),
        violating,
        needed,
        cap,
        needed <= cap and not block,
        violations,
        tuple(masks),
        block,
        "person" if evaluator.summary.has_units else "rows",
    )


def _fails_in_records(
    classes: EquivalenceClasses,
    models: tuple[PrivacyModel, ...],
    limit: float,
    cap: int,
) -> Assessment | None:
    """A shortcut for person-counted classes: a class violating k or distinct l in records
    violates it in persons too (persons <= records; the same SA values), so when those
    violations alone exceed the limit the node fails without counting persons. The
    assessment then holds the record-level violations (a lower bound of the suppression
    the node needs), and those models' masks are subsets of the person-level ones.
    None when the shortcut does not decide."""
    bounded = [m for m in models if isinstance(m, KAnonymity | DistinctLDiversity)]
    if not bounded:
        return None
    masks = []
    violating = np.zeros(classes.n_classes, dtype=bool)
    for model in models:
        bad = model.violating(classes) if model in bounded else np.zeros_like(violating)
        masks.append(bad)
        violating |= bad
    needed = int(classes.sizes[violating].sum())
    if needed <= cap:
        return None
    pairs = zip(models, masks, strict=True)
    violations = {m.describe(): int(classes.sizes[b].sum()) for m, b in pairs}
    return Assessment(
        classes,
        models,
        float(limit),
        violating,
        needed,
        cap,
        False,
        violations,
        tuple(masks),
        (),
        "person",
    )
