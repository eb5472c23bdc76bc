"""Re-identification risk of a transformation (prosecutor, journalist, marketer models).

A record's risk is the probability that an attacker who knows its QI values picks it
out of the records sharing its generalised QI values (REFERENCE.md; El Emam's models as
ARX reports them):

- Prosecutor: the attacker knows the target is in the table: risk 1/|E|. Average risk
  over records = #classes / |D| (ARX's "success rate"), highest = 1/min |E|, records at
  risk = share of records with risk > threshold (default 0.2, i.e. classes below 5),
  uniques = share of records alone in their class.
- Journalist: the attacker does not know the target is in the table and links against
  a population table (a superset of it): risk 1/|F_E|, F_E the population records with
  the same generalised QIs. Without a population summary the population *is* the table,
  and journalist risk equals prosecutor risk. Uniques are then population uniques.
- Marketer: the expected share of records re-identified when the attacker links every
  record: (1/|D|) sum_E |E| / |F_E|, which is #classes / |D| when the population is the
  table.

Suppressed records are released with every QI ``*`` and, as ARX does, are left out by
default: risks and shares are over the released (kept) records. With
``include_suppressed=True`` they count as one more class (all ``*``), of the suppressed
records (and, for the journalist, of the population records outside the kept classes).

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from privpipe.errors import InputDataError

__all__ = [
    "DEFAULT_THRESHOLD",
    "RiskProfile",
    "RiskSummary",
    "journalist",
    "marketer",
    "population_sizes",
    "prosecutor",
    "risk_profile",
]

IntArray: TypeAlias = npt.NDArray[np.int64]

DEFAULT_THRESHOLD: Final = 0.2
"""Records whose risk is above this are "at risk"."""


@dataclass(frozen=True)
class RiskSummary:
    """Risk of one attacker model over the records considered (shares are of them)."""

    model: str
    average: float
    highest: float
    records_at_risk: float
    uniques: float
    threshold: float
    records: int
    classes: int

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return asdict(self)


def _sizes(values: npt.ArrayLike) -> IntArray:
    sizes = np.asarray(values, dtype=np.int64).ravel()
    if sizes.size and int(sizes.min()) < 1:
        raise ValueError("class sizes must be positive")
    return sizes


def _summary(model: str, sizes: IntArray, population: IntArray, threshold: float) -> RiskSummary:
    records = int(sizes.sum())
    if records == 0:
        return RiskSummary(model, 0.0, 0.0, 0.0, 0.0, threshold, 0, 0)
    risk = 1.0 / population
    return RiskSummary(
        model,
        float(np.dot(sizes, risk)) / records,
        float(risk.max()),
        float(sizes[risk > threshold].sum()) / records,
        float(sizes[population == 1].sum()) / records,
        float(threshold),
        records,
        int(sizes.shape[0]),
    )


def prosecutor(sizes: npt.ArrayLike, threshold: float = DEFAULT_THRESHOLD) -> RiskSummary:
    """Prosecutor risk from the class sizes |E| (record risk 1/|E|)."""
    array = _sizes(sizes)
    return _summary("prosecutor", array, array, threshold)


def journalist(
    sizes: npt.ArrayLike,
    population: npt.ArrayLike | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> RiskSummary:
    """Journalist risk: record risk 1/|F_E| with ``population`` the matching population
    class sizes (aligned with ``sizes``); without it, the table is the population."""
    array = _sizes(sizes)
    pop = array if population is None else _sizes(population)
    if pop.shape != array.shape or (pop < array).any():
        raise InputDataError(
            "population class sizes must align with the sample classes and be at least as "
            "large (the population must contain the sample)"
        )
    return _summary("journalist", array, pop, threshold)


def marketer(sizes: npt.ArrayLike, population: npt.ArrayLike | None = None) -> float:
    """Marketer risk: (1/|D|) sum_E |E| / |F_E| (= #classes / |D| without a population)."""
    array = _sizes(sizes)
    pop = array if population is None else _sizes(population)
    records = int(array.sum())
    return float(np.dot(array, 1.0 / pop)) / records if records else 0.0


def population_sizes(classes: EquivalenceClasses, population: Summary) -> IntArray:
    """Size of the population class matching each class (same QIs, hierarchies, levels).

    InputDataError if a class has no or fewer population records than sample records.
    """
    sample = classes.evaluator
    if population.qi_names != sample.qi_names:
        raise InputDataError(
            f"the population has quasi-identifiers {population.qi_names}, the table "
            f"{sample.qi_names}; they must match"
        )
    pop_classes = Evaluator(population, sample.hierarchies, use_sa=False).classes(classes.levels)
    index = pop_classes.lookup(classes.labels)
    if (index < 0).any():
        raise InputDataError(
            f"{int((index < 0).sum())} equivalence classes of the table have no record in the "
            "population; the population must contain every record of the table"
        )
    sizes = pop_classes.sizes[index]
    if (sizes < classes.sizes).any():
        raise InputDataError(
            "some equivalence classes are larger in the table than in the population; the "
            "population must contain every record of the table"
        )
    return sizes


@dataclass(frozen=True)
class RiskProfile:
    """The three attacker models for one release."""

    prosecutor: RiskSummary
    journalist: RiskSummary
    marketer: float
    suppressed_records: int
    population_given: bool

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {
            "prosecutor": self.prosecutor.as_dict(),
            "journalist": self.journalist.as_dict(),
            "marketer": self.marketer,
            "suppressed_records": self.suppressed_records,
            "population_given": self.population_given,
        }


def risk_profile(
    classes: EquivalenceClasses,
    suppressed: npt.ArrayLike | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    population: Summary | None = None,
    include_suppressed: bool = False,
) -> RiskProfile:
    """Prosecutor, journalist and marketer risk of a node with its suppressed classes."""
    mask = (
        np.zeros(classes.n_classes, dtype=bool)
        if suppressed is None
        else np.asarray(suppressed, dtype=bool)
    )
    if mask.shape != (classes.n_classes,):
        raise ValueError("suppressed must have one flag per equivalence class")
    kept = classes.sizes[~mask]
    n_suppressed = int(classes.sizes[mask].sum())
    pop = None if population is None else population_sizes(classes, population)[~mask]
    if include_suppressed and n_suppressed:
        kept = np.append(kept, n_suppressed)
        if pop is not None:
            assert population is not None
            pop = np.append(pop, population.n_records - int(pop.sum()))
    return RiskProfile(
        prosecutor(kept, threshold),
        journalist(kept, pop, threshold),
        marketer(kept, pop),
        n_suppressed,
        population is not None,
    )
