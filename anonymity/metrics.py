"""Utility / information-loss metrics of a transformation (ARX definitions, REFERENCE.md).

All metrics are losses: **lower is better**, and the input table (every QI at level 0,
nothing suppressed) scores the minimum (0 for Loss, precision, non-uniform entropy and
KL divergence). Each is computed from an ``EquivalenceClasses`` and the mask of
suppressed classes (an ``Assessment``'s ``suppressed``), never from rows.

- Loss (Iyengar; ARX's default, gs-factor 0.5 so generalisation and suppression weigh
  alike): per QI j, a record's share is |leaves under its label| / |dom_j| (|dom_j| = the
  hierarchy's number of raw values), 1 if suppressed; IL_j = (sum share - |D|/|dom_j|) /
  (|D| - |D|/|dom_j|). ``value`` is ARX's geometric mean (prod (1 + IL_j))^(1/n) - 1;
  the arithmetic mean and each IL_j are reported too. A QI with one raw value has IL 0.
- Discernibility: sum over kept classes |E|^2 + sum over suppressed classes |D| |E|.
- AECS: |D| / (kept classes + 1 if anything is suppressed).
- Precision: mean over QIs of level_j / height_j per record, a suppressed record counting
  as full height (1).
- Non-uniform entropy, as ARX's non-monotonic variant: per QI, sum over all records of
  log2(count(g(v)) / count(v)) (counts over the whole table), plus, for suppressed
  records, log2(S / count_S(g(v))) with S the suppressed records and count_S among them
  (the second generalisation step, g(v) -> ``*``). Summed over QIs.
- KL divergence: sum over distinct raw QI tuples t of P(t) log2(P(t) / Q(t)), Q spreading
  each generalised class uniformly over the raw tuples it covers (the product of its
  labels' leaf counts; all raw tuples for suppressed records). ARX sums the same term
  once per *row* instead of once per distinct tuple; this follows the definition.

``Metric`` objects (``get_metric``) serve the search: ``value`` on a node, whether the
metric is monotone along generalisation without suppression, and optional cheap lower
bounds for many nodes at once (valid with any suppression, since suppression only adds
loss), which let the optimal search stop early.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from privpipe.errors import ConfigError

__all__ = [
    "METRICS",
    "LossResult",
    "Metric",
    "Metrics",
    "all_metrics",
    "average_class_size",
    "discernibility",
    "get_metric",
    "input_metrics",
    "kl_divergence",
    "loss",
    "non_uniform_entropy",
    "precision",
]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


def _mask(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None) -> BoolArray:
    if suppressed is None:
        return np.zeros(classes.n_classes, dtype=bool)
    mask = np.asarray(suppressed, dtype=bool)
    if mask.shape != (classes.n_classes,):
        raise ValueError("suppressed must have one flag per equivalence class")
    return mask


def _suppressed_records(classes: EquivalenceClasses, mask: BoolArray) -> int:
    return int(classes.sizes[mask].sum())


# --------------------------------------------------------------------------- Loss


@dataclass(frozen=True)
class LossResult:
    """Loss: ``value`` (geometric mean, ARX's default), ``arithmetic`` mean, per-QI IL_j."""

    value: float
    arithmetic: float
    per_attribute: dict[str, float]


def _il(total_numerator: int, n: int, domain: int) -> float:
    """IL_j from sum over records of |leaves| (+ |dom| per suppressed record), exactly:
    (sum share - n/dom) / (n - n/dom) = (numerator - n) / (n dom - n)."""
    if domain <= 1 or n == 0:
        return 0.0
    return max((total_numerator - n) / (n * domain - n), 0.0)


def _geometric(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    return float(math.prod(1.0 + v for v in values) ** (1.0 / len(values)) - 1.0)


def loss(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None) -> LossResult:
    """ARX's Loss of a node (module docstring); lower is better, 0 for the input table."""
    mask = _mask(classes, suppressed)
    ev = classes.evaluator
    n = ev.n_records
    kept = ~mask
    supp = _suppressed_records(classes, mask)
    per: dict[str, float] = {}
    for j, (name, level) in enumerate(zip(ev.qi_names, classes.levels, strict=True)):
        info = ev.qi_info(j)
        domain = info.hierarchy.domain_size
        leaves = info.leaves[level][classes.local_labels(j)]
        numerator = int(np.dot(classes.sizes[kept], leaves[kept])) + supp * domain
        per[name] = _il(numerator, n, domain)
    values = list(per.values())
    arithmetic = sum(values) / len(values) if values else 0.0
    return LossResult(_geometric(values), arithmetic, per)


def _loss_per_level(ev: Evaluator) -> list[list[float]]:
    """IL_j without suppression for every QI and level (a function of the level only)."""
    n = ev.n_records
    table = []
    for j in range(len(ev.qi_names)):
        info = ev.qi_info(j)
        domain = info.hierarchy.domain_size
        row = []
        for level in range(info.hierarchy.levels):
            numerator = int(np.dot(info.label_counts[level], info.leaves[level]))
            row.append(_il(numerator, n, domain))
        table.append(row)
    return table


# --------------------------------------------------------------------------- others


def discernibility(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None) -> float:
    """sum_kept |E|^2 + sum_suppressed |D| |E| (Bayardo & Agrawal); lower is better."""
    mask = _mask(classes, suppressed)
    sizes = classes.sizes
    kept = sizes[~mask]
    return float(int(np.dot(kept, kept)) + classes.n_records * _suppressed_records(classes, mask))


def average_class_size(
    classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None
) -> float:
    """AECS: |D| / (kept classes, + 1 if anything is suppressed); lower is better."""
    mask = _mask(classes, suppressed)
    groups = int((~mask).sum()) + (1 if mask.any() else 0)
    return classes.n_records / max(groups, 1)


def precision(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None) -> float:
    """Sweeney's precision loss: mean over QIs of level/height per record (1 if suppressed)."""
    mask = _mask(classes, suppressed)
    ev = classes.evaluator
    n = ev.n_records
    supp = _suppressed_records(classes, mask)
    parts = [
        ((n - supp) * level / height + supp) / n if height else supp / n
        for level, height in zip(classes.levels, ev.heights, strict=True)
    ]
    return sum(parts) / len(parts) if parts else 0.0


def _entropy_per_level(ev: Evaluator) -> list[list[float]]:
    """Per QI and level: sum over records of log2(count(g(v)) / count(v))."""
    table = []
    for j in range(len(ev.qi_names)):
        info = ev.qi_info(j)
        counts = info.value_counts.astype(np.float64)
        row = []
        for level in range(info.hierarchy.levels):
            generalised = info.label_counts[level][info.local[level]].astype(np.float64)
            row.append(float(np.dot(counts, np.log2(generalised / counts))))
        table.append(row)
    return table


def non_uniform_entropy(
    classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None
) -> float:
    """Non-uniform entropy (ARX's non-monotonic variant, module docstring), in bits."""
    mask = _mask(classes, suppressed)
    ev = classes.evaluator
    base = _entropy_per_level(ev)
    total = sum(base[j][level] for j, level in enumerate(classes.levels))
    supp = _suppressed_records(classes, mask)
    if supp:
        sizes = classes.sizes[mask]
        for j in range(len(classes.levels)):
            labels = classes.local_labels(j)[mask]
            counts = np.bincount(labels, weights=sizes)
            counts = counts[counts > 0]
            total += float(np.dot(counts, np.log2(supp / counts)))
    return max(total, 0.0)


def kl_divergence(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None) -> float:
    """KL divergence (bits) of the node's spread-out distribution from the input's."""
    mask = _mask(classes, suppressed)
    ev = classes.evaluator
    n = ev.n_records
    tuple_of_row, first_row = ev.qi_tuples()
    p = np.bincount(tuple_of_row, weights=ev.summary.counts) / n
    tuple_class = classes.row_classes()[first_row]
    log_area = np.zeros(classes.n_classes, dtype=np.float64)
    log_all = 0.0
    for j, level in enumerate(classes.levels):
        info = ev.qi_info(j)
        log_area += np.log2(info.leaves[level][classes.local_labels(j)].astype(np.float64))
        log_all += math.log2(info.hierarchy.domain_size)
    supp = _suppressed_records(classes, mask)
    log_q_class = np.log2(classes.sizes / n) - log_area
    if supp:
        log_q_class = np.where(mask, math.log2(supp / n) - log_all, log_q_class)
    log_q = log_q_class[tuple_class]
    return max(float(np.dot(p, np.log2(p) - log_q)), 0.0)


# --------------------------------------------------------------------------- bundles


@dataclass(frozen=True)
class Metrics:
    """Every metric of one node (all losses: lower is better)."""

    loss: LossResult
    discernibility: float
    average_class_size: float
    precision: float
    non_uniform_entropy: float
    kl_divergence: float
    suppressed_records: int

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON (release.json ``metrics``)."""
        return {
            "loss": self.loss.value,
            "loss_arithmetic": self.loss.arithmetic,
            "loss_per_attribute": dict(self.loss.per_attribute),
            "discernibility": self.discernibility,
            "average_class_size": self.average_class_size,
            "precision": self.precision,
            "non_uniform_entropy": self.non_uniform_entropy,
            "kl_divergence": self.kl_divergence,
            "suppressed_records": self.suppressed_records,
        }


def all_metrics(classes: EquivalenceClasses, suppressed: npt.ArrayLike | None = None) -> Metrics:
    """All metrics of a node with the given suppressed classes."""
    mask = _mask(classes, suppressed)
    return Metrics(
        loss(classes, mask),
        discernibility(classes, mask),
        average_class_size(classes, mask),
        precision(classes, mask),
        non_uniform_entropy(classes, mask),
        kl_divergence(classes, mask),
        _suppressed_records(classes, mask),
    )


def input_metrics(evaluator: Evaluator) -> Metrics:
    """Metrics of the input table: every QI at level 0, nothing suppressed."""
    return all_metrics(evaluator.classes((0,) * len(evaluator.qi_names)))


# --------------------------------------------------------------------------- for the search


class Metric(ABC):
    """A metric as the search uses it (lower is better)."""

    name: ClassVar[str]
    monotone_without_suppression: ClassVar[bool]
    """Non-decreasing along generalisation when nothing is suppressed."""

    @abstractmethod
    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        """The metric of a node with these suppressed classes."""

    def lower_bounds(self, evaluator: Evaluator, nodes: IntArray) -> FloatArray | None:
        """Per node (rows of levels): a lower bound valid with any suppression, or None.

        Bounds are non-decreasing along generalisation and equal the value when nothing is
        suppressed.
        """
        return None


class _Loss(Metric):
    name = "loss"
    monotone_without_suppression = True

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return loss(classes, suppressed).value

    def lower_bounds(self, evaluator: Evaluator, nodes: IntArray) -> FloatArray:
        table = _loss_per_level(evaluator)
        product = np.ones(nodes.shape[0], dtype=np.float64)
        for j, row in enumerate(table):
            product *= 1.0 + np.asarray(row, dtype=np.float64)[nodes[:, j]]
        return np.asarray(product ** (1.0 / len(table)) - 1.0, dtype=np.float64)


class _Discernibility(Metric):
    name = "discernibility"
    monotone_without_suppression = True

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return discernibility(classes, suppressed)


class _AverageClassSize(Metric):
    name = "aecs"
    monotone_without_suppression = True

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return average_class_size(classes, suppressed)


class _Precision(Metric):
    name = "precision"
    monotone_without_suppression = True

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return precision(classes, suppressed)

    def lower_bounds(self, evaluator: Evaluator, nodes: IntArray) -> FloatArray:
        heights = np.maximum(np.asarray(evaluator.heights, dtype=np.float64), 1.0)
        return np.asarray((nodes / heights).mean(axis=1), dtype=np.float64)


class _Entropy(Metric):
    name = "entropy"
    monotone_without_suppression = True

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return non_uniform_entropy(classes, suppressed)

    def lower_bounds(self, evaluator: Evaluator, nodes: IntArray) -> FloatArray:
        table = _entropy_per_level(evaluator)
        total = np.zeros(nodes.shape[0], dtype=np.float64)
        for j, row in enumerate(table):
            total += np.asarray(row, dtype=np.float64)[nodes[:, j]]
        return np.maximum(total, 0.0)


class _KLDivergence(Metric):
    name = "kl_divergence"
    monotone_without_suppression = False  # not assumed

    def value(self, classes: EquivalenceClasses, suppressed: BoolArray) -> float:
        return kl_divergence(classes, suppressed)


METRICS: dict[str, Metric] = {
    "loss": _Loss(),
    "discernibility": _Discernibility(),
    "aecs": _AverageClassSize(),
    "average_class_size": _AverageClassSize(),
    "precision": _Precision(),
    "entropy": _Entropy(),
    "non_uniform_entropy": _Entropy(),
    "kl_divergence": _KLDivergence(),
    "kl": _KLDivergence(),
}
"""Metrics by name (with aliases); all are losses, lower is better."""


def get_metric(name: str | Metric) -> Metric:
    """The metric called ``name`` (ConfigError listing the choices if unknown)."""
    if isinstance(name, Metric):
        return name
    metric = METRICS.get(str(name).strip().lower().replace("-", "_"))
    if metric is None:
        raise ConfigError(
            f"unknown metric {name!r}; use one of loss, discernibility, aecs, precision, "
            "entropy, kl_divergence"
        )
    return metric
