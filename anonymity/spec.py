"""What an anonymised release must guarantee, and how it is computed: ``AnonymizationSpec``.

One frozen, validated value per release: the privacy model and its parameters (k; l with
its variant and c; t with its distance), the suppression limit and how suppressed
records are published, and how the recoding is searched (algorithm, metric, level
bounds, time limit, numeric QIs for Mondrian). Bad values raise ``ConfigError`` (exit 2)
at construction; ``check_feasible`` refuses, with the numbers, guarantees no table of
that size or SA diversity can reach (``PrivacyRefusal``, exit 4). ``guarantee`` is the
``guarantee`` object of release.json exactly as DESIGN.md shows it, plus the
suppression limit.

Pure core: the standard library and ``anonymity`` only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, cast

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.metrics import get_metric
from privpipe.anonymity.models import (
    DistinctLDiversity,
    EntropyLDiversity,
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
    TCloseness,
)
from privpipe.errors import ConfigError, PrivacyRefusal

__all__ = [
    "ALGORITHMS",
    "DISTANCES",
    "KINDS",
    "VARIANTS",
    "AnonymizationSpec",
]

Kind: TypeAlias = Literal["k_anonymity", "l_diversity", "t_closeness"]
Variant: TypeAlias = Literal["distinct", "entropy", "recursive"]
Distance: TypeAlias = Literal["equal", "ordered", "hierarchical"]
Algorithm: TypeAlias = Literal["optimal", "heuristic", "mondrian"]
SuppressedAs: TypeAlias = Literal["star", "drop"]
Unit: TypeAlias = Literal["person", "rows"]

KINDS: Final = ("k_anonymity", "l_diversity", "t_closeness")
VARIANTS: Final = ("distinct", "entropy", "recursive")
DISTANCES: Final = ("equal", "ordered", "hierarchical")
ALGORITHMS: Final = ("optimal", "heuristic", "mondrian")
SUPPRESSED_AS: Final = ("star", "drop")
UNITS: Final = ("person", "rows")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _choice(value: object, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True)
class AnonymizationSpec:
    """One anonymised release: model, parameters, suppression and search settings.

    ``k`` applies to every kind (l-diversity and t-closeness default to k=1, i.e. no
    extra k). ``l`` is an integer for the distinct and recursive variants, a number for
    entropy. ``c`` is required by, and only allowed with, the recursive variant; ``t``
    lies in (0, 1]. ``suppression_limit`` is the share of records that may be
    suppressed, in [0, 1). ``suppressed``: ``"star"`` publishes suppressed records with
    every QI ``*``, ``"drop"`` leaves them out. ``numeric`` lists QIs Mondrian publishes
    as ranges (Mondrian only). ``min_levels``/``max_levels`` bound the lattice per QI
    (full-domain algorithms). ``name`` is the release's name, for release.json.
    ``unit``: ``"person"`` counts every class in distinct persons of ``unit_column`` (the
    privacy unit; required then), ``"rows"`` in records (ARX's semantics).
    """

    kind: Kind
    qis: tuple[str, ...]
    sensitive: str | None = None
    k: int = 1
    l: int | float | None = None  # noqa: E741 - the parameter's name in the literature
    variant: Variant = "distinct"
    c: float | None = None
    t: float | None = None
    distance: Distance = "equal"
    suppression_limit: float = 0.0
    algorithm: Algorithm = "optimal"
    metric: str = "loss"
    min_levels: Mapping[str, int] = field(default_factory=dict)
    max_levels: Mapping[str, int] = field(default_factory=dict)
    time_limit_s: float = 60.0
    suppressed: SuppressedAs = "star"
    numeric: tuple[str, ...] = ()
    name: str | None = None
    unit: Unit = "rows"
    unit_column: str | None = None

    def __post_init__(self) -> None:
        try:
            self._validate()
        except ConfigError as error:
            if self.name:
                raise ConfigError(f"release {self.name!r}: {error}") from None
            raise

    # ----------------------------------------------------------------- validation

    def _validate(self) -> None:
        _choice(self.kind, KINDS, "kind")
        if isinstance(self.qis, str) or not isinstance(self.qis, Sequence):
            raise ConfigError(f"qis must be a list of column names, got {self.qis!r}")
        qis = tuple(self.qis)
        if not qis or not all(isinstance(q, str) and q for q in qis):
            raise ConfigError(f"qis must be a non-empty list of column names, got {list(qis)}")
        if len(set(qis)) != len(qis):
            raise ConfigError(f"quasi-identifiers listed twice: {list(qis)}")
        object.__setattr__(self, "qis", qis)
        if self.sensitive is not None:
            if not isinstance(self.sensitive, str) or not self.sensitive:
                raise ConfigError(f"sensitive must be a column name, got {self.sensitive!r}")
            if self.sensitive in qis:
                raise ConfigError(
                    f"{self.sensitive!r} is both a quasi-identifier and the sensitive attribute"
                )
        elif self.kind != "k_anonymity":
            raise ConfigError(f"kind {self.kind} needs a sensitive attribute (sensitive)")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"k must be an integer >= 1, got {self.k!r}")
        self._validate_l()
        self._validate_t()
        limit = self.suppression_limit
        if not _is_number(limit) or not 0.0 <= float(limit) < 1.0:
            raise ConfigError(f"suppression_limit must be a number in [0, 1), got {limit!r}")
        _choice(self.algorithm, ALGORITHMS, "algorithm")
        get_metric(self.metric)  # ConfigError for unknown names
        self._validate_levels()
        time_limit = self.time_limit_s
        if not _is_number(time_limit) or not 0.0 < float(time_limit) < math.inf:
            raise ConfigError(f"time_limit_s must be a positive number, got {time_limit!r}")
        _choice(self.suppressed, SUPPRESSED_AS, "suppressed")
        numeric = tuple(self.numeric)
        stray = [q for q in numeric if q not in qis]
        if stray:
            raise ConfigError(f"numeric lists {stray}, which are not quasi-identifiers {list(qis)}")
        if numeric and self.algorithm != "mondrian":
            raise ConfigError(
                "numeric (QIs published as ranges) applies only to algorithm: mondrian; "
                f"full-domain algorithms publish hierarchy labels (algorithm {self.algorithm})"
            )
        object.__setattr__(self, "numeric", numeric)
        if self.name is not None and not isinstance(self.name, str):
            raise ConfigError(f"name must be a string, got {self.name!r}")
        _choice(self.unit, UNITS, "unit")
        if self.unit == "person" and not self.unit_column:
            raise ConfigError(
                "unit: person needs schema.privacy_unit (the column of the person id); set "
                "it, or use unit: rows"
            )
        if self.unit_column is not None and self.unit_column in (*qis, self.sensitive):
            raise ConfigError(
                f"the privacy unit {self.unit_column!r} is also a QI or the sensitive attribute"
            )

    @property
    def unit_by(self) -> str | None:
        """The column classes are counted by (the person id), None for records."""
        return self.unit_column if self.unit == "person" else None

    def _validate_l(self) -> None:
        if self.kind != "l_diversity":
            if self.l is not None:
                raise ConfigError(f"l applies only to kind l_diversity, not {self.kind}")
            if self.c is not None:
                raise ConfigError(f"c applies only to kind l_diversity, not {self.kind}")
            return
        _choice(self.variant, VARIANTS, "variant")
        l = self.l  # noqa: E741
        if self.variant == "entropy":
            if not _is_number(l) or not 2.0 <= float(cast(float, l)) < math.inf:
                raise ConfigError(f"l must be a number >= 2, got {l!r}")
        elif isinstance(l, bool) or not isinstance(l, int) or l < 2:
            raise ConfigError(
                f"l must be an integer >= 2 for {self.variant} l-diversity, got {l!r}"
            )
        if self.variant == "recursive":
            c = self.c
            if c is None:
                raise ConfigError("variant recursive needs c (e.g. c: 4)")
            if not _is_number(c) or not 0.0 < float(c) < math.inf:
                raise ConfigError(f"c must be a positive number, got {c!r}")
        elif self.c is not None:
            raise ConfigError(f"c applies only to variant recursive, not {self.variant}")

    def _validate_t(self) -> None:
        if self.kind != "t_closeness":
            if self.t is not None:
                raise ConfigError(f"t applies only to kind t_closeness, not {self.kind}")
            return
        t = self.t
        if not _is_number(t) or not 0.0 < float(cast(float, t)) <= 1.0:
            raise ConfigError(f"t must be a number in (0, 1], got {t!r}")
        _choice(self.distance, DISTANCES, "distance")

    def _validate_levels(self) -> None:
        bounds: dict[str, dict[str, int]] = {}
        for what, levels in (("min_levels", self.min_levels), ("max_levels", self.max_levels)):
            if not isinstance(levels, Mapping):
                raise ConfigError(f"{what} must map quasi-identifiers to levels, got {levels!r}")
            clean: dict[str, int] = {}
            for qi, level in levels.items():
                if qi not in self.qis:
                    raise ConfigError(f"{what}: {qi!r} is not a quasi-identifier {list(self.qis)}")
                if isinstance(level, bool) or not isinstance(level, int) or level < 0:
                    raise ConfigError(f"{what}.{qi} must be an integer >= 0, got {level!r}")
                clean[qi] = int(level)
            bounds[what] = clean
            object.__setattr__(self, what, clean)
        for qi, low in bounds["min_levels"].items():
            high = bounds["max_levels"].get(qi)
            if high is not None and low > high:
                raise ConfigError(f"min_levels.{qi}={low} is above max_levels.{qi}={high}")

    # ----------------------------------------------------------------- models

    def models(self, sa_hierarchy: Hierarchy | None = None) -> list[PrivacyModel]:
        """The privacy models the search or Mondrian must satisfy (k only when k > 1).

        Hierarchical t-closeness needs ``sa_hierarchy`` (ConfigError without it).
        """
        out: list[PrivacyModel] = []
        if self.k > 1 or self.kind == "k_anonymity":
            out.append(KAnonymity(self.k))
        if self.kind == "l_diversity":
            assert self.l is not None
            if self.variant == "distinct":
                out.append(DistinctLDiversity(int(self.l)))
            elif self.variant == "entropy":
                out.append(EntropyLDiversity(float(self.l)))
            else:
                assert self.c is not None
                out.append(RecursiveCLDiversity(self.c, int(self.l)))
        elif self.kind == "t_closeness":
            assert self.t is not None
            if self.distance == "hierarchical" and sa_hierarchy is None:
                raise ConfigError(
                    f"hierarchical t-closeness needs the hierarchy of {self.sensitive!r} "
                    f"(hierarchies.{self.sensitive})"
                )
            hierarchy = sa_hierarchy if self.distance == "hierarchical" else None
            out.append(TCloseness(self.t, self.distance, hierarchy))
        return out

    def guarantee(self) -> dict[str, Any]:
        """release.json's ``guarantee``: ``{"k": 5, "l": 3, "variant": "recursive", "c": 4,
        "suppression_limit": 0.0}``, ``{"k": 5, "t": 0.2, "distance": "hierarchical", …}``."""
        out: dict[str, Any] = {"k": self.k}
        if self.kind == "l_diversity":
            out["l"] = self.l
            out["variant"] = self.variant
            if self.variant == "recursive":
                out["c"] = self.c
        elif self.kind == "t_closeness":
            out["t"] = self.t
            out["distance"] = self.distance
        out["suppression_limit"] = self.suppression_limit
        out["unit"] = self.unit
        return out

    def describe(self) -> str:
        """The guarantee for messages: ``k=5, l=3 (recursive, c=4)``."""
        text = f"k={self.k}"
        if self.kind == "l_diversity":
            extra = f", c={self.c:g}" if self.variant == "recursive" and self.c else ""
            text += f", l={self.l:g} ({self.variant}{extra})"
        elif self.kind == "t_closeness" and self.t is not None:
            text += f", t={self.t:g} ({self.distance} distance)"
        return text

    def parameters(self) -> dict[str, Any]:
        """Every setting of the release, as plain values (release.json ``parameters``)."""
        out: dict[str, Any] = {
            "quasi_identifiers": list(self.qis),
            "sensitive": self.sensitive,
            **{key: value for key, value in self.guarantee().items()},
            "algorithm": self.algorithm,
            "suppressed": self.suppressed,
        }
        if self.algorithm == "mondrian":
            out["numeric"] = list(self.numeric)
        else:
            out["metric"] = self.metric
            out["min_levels"] = dict(self.min_levels)
            out["max_levels"] = dict(self.max_levels)
            if self.algorithm == "heuristic":
                out["time_limit_s"] = self.time_limit_s
        return out

    # ----------------------------------------------------------------- data checks

    def check_feasible(self, records: int, sensitive_values: int | None = None) -> None:
        """Refuse (PrivacyRefusal, exit 4) a guarantee no transformation can reach here.

        ``records`` is |D|; ``sensitive_values`` the number of distinct SA values in D.
        Every published class needs k records and (l-diversity) l distinct SA values, and
        at least one class is published since the suppression limit is below 100%.
        """
        if records < self.k:
            raise PrivacyRefusal(
                f"{self._who()}k={self.k} but the table has {records} record"
                f"{'' if records == 1 else 's'}; no equivalence class can reach k, lower k"
            )
        if self.kind == "l_diversity" and sensitive_values is not None:
            assert self.l is not None
            if sensitive_values < self.l:
                raise PrivacyRefusal(
                    f"{self._who()}l={self.l:g} but {self.sensitive} has only "
                    f"{sensitive_values} distinct value{'' if sensitive_values == 1 else 's'}; "
                    f"no equivalence class can be {self.variant} l-diverse, lower l"
                )

    def _who(self) -> str:
        return f"release {self.name!r}: " if self.name else ""
