"""The YAML config as an immutable, validated model, and its JSON Schema.

Every key of DESIGN.md's config contract is a field here. Models are frozen,
strict (a quoted "5" is not the integer 5) and forbid unknown keys, so a typo
fails loudly with the nearest valid key instead of being ignored. Semantic
rules that span sections (a QI needs a hierarchy, names are unique, ...) live
in `PrivpipeConfig._check_semantics`. `configs/schema.json` is generated from
these models (`privpipe schema`), and a test keeps the committed copy in sync.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import math
import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from privpipe.errors import ConfigError

ColumnType = Literal["string", "integer", "float"]
InputFormat = Literal["csv", "parquet", "jsonl"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_KEY_MARK = "\x00"  # brackets an offending key inside a message, so the formatter can move it


class _Model(BaseModel):
    """Base of every config section: frozen, strict, unknown keys rejected with a hint."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            allowed = set(cls.model_fields)
            allowed |= {f.alias for f in cls.model_fields.values() if f.alias}
            unknown = [k for k in data if k not in allowed]
            if unknown:
                key = str(unknown[0])
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ValueError(
                    f"{_KEY_MARK}{key}{_KEY_MARK}unknown key; {hint}"
                    f"allowed keys here: {', '.join(sorted(allowed))}"
                )
        return data


# --------------------------------------------------------------------------- input


MIN_SPLIT_MB = 1 / 16  # 64 KiB: split_mb 1e-9 turned a 5 s read into 193 s (issue 17)


class InputConfig(_Model):
    """Where the microdata is and how to parse it."""

    path: str | list[str] = Field(
        description="File, list of files or glob, relative to the config file's folder."
    )
    format: InputFormat | None = Field(
        default=None, description="csv, parquet or jsonl; default: from the file extension."
    )
    delimiter: str = Field(default=",", min_length=1, max_length=1)
    quotechar: str = Field(default='"', min_length=1, max_length=1)
    encoding: str = "utf-8"
    header: bool = True
    columns: list[str] | None = Field(
        default=None, description="Column names when the CSV has no header row."
    )
    batch_rows: int = Field(default=65_536, ge=1, description="Rows per batch on the hot path.")
    split_mb: float = Field(
        default=8,
        ge=MIN_SPLIT_MB,
        allow_inf_nan=False,
        description="Target size of the byte ranges read in parallel (at least 1/16: "
        "smaller ranges cost more in per-range work than they save).",
    )
    multiline_records: bool = Field(
        default=False,
        description="Quoted fields may contain newlines; disables byte-range splitting.",
    )
    max_rejected_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Share of rows that may be rejected before the run fails (exit 3).",
    )

    @model_validator(mode="after")
    def _columns_when_headerless(self) -> InputConfig:
        if not self.header and not self.columns:
            raise ValueError("header: false needs 'columns' (the column names in file order)")
        return self


# -------------------------------------------------------------------------- schema


class SchemaConfig(_Model):
    """Roles of the columns."""

    quasi_identifiers: list[str] = Field(default_factory=list)
    sensitive: str | None = None
    privacy_unit: str | None = Field(
        default=None, description="Column identifying a person; null = one row per person."
    )
    types: dict[str, ColumnType] = Field(
        default_factory=dict,
        description="Column types (default string); integer/float columns reject unparsable rows.",
    )
    max_units: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Public upper bound on the number of privacy units (persons; rows when "
            "privacy_unit is null). Required when a DP release uses delta > 0, which must "
            "be below 1/max_units; a larger data set is refused."
        ),
    )


# --------------------------------------------------------------------- hierarchies


class MaskSpec(_Model):
    digits: int | None = Field(default=None, ge=1, description="Length of every code.")
    char: str = Field(default="*", min_length=1, max_length=1)


class IntervalSpec(_Model):
    widths: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(min_length=1)
    start: float = Field(default=0.0, allow_inf_nan=False)
    lower: float | None = Field(default=None, allow_inf_nan=False)
    upper: float | None = Field(default=None, allow_inf_nan=False)


DateLevel = Literal["week", "month", "year", "decade"]


def _default_date_levels() -> list[DateLevel]:
    return ["month", "year"]


class DateSpec(_Model):
    levels: list[DateLevel] = Field(default_factory=lambda: _default_date_levels(), min_length=1)
    format: str = "%Y-%m-%d"


class PrefixSpec(_Model):
    lengths: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1,
        description="Letters/digits each level keeps, strictly decreasing (separators kept "
        "between them), e.g. [2] for PUMA 01-01301 -> state 01.",
    )


class CodesSpec(_Model):
    files: list[str] = Field(
        min_length=1,
        description="CSV code lists, each 'code,parent' with a header: the first maps the raw "
        "values, each next one the parents of the one before.",
    )
    delimiter: str = Field(default=",", min_length=1, max_length=1)


def _scalar_text(value: object, where: str) -> object:
    """A YAML integer written as a code (``01: a`` reads as 1) becomes its text; a float
    or boolean is refused with the fix (quote it)."""
    if isinstance(value, bool | float):
        raise ValueError(
            f"{where} {value!r}: YAML reads it as a {type(value).__name__}, not text; "
            "quote it in the YAML as written (e.g. '1.50', 'yes')"
        )
    if isinstance(value, int):
        return str(value)
    return value


HIERARCHY_KINDS = ("file", "mask", "prefix", "intervals", "dates", "groups", "codes")


class HierarchyConfig(_Model):
    """One generalisation hierarchy: an ARX CSV file or one builder."""

    file: str | None = Field(default=None, description="ARX CSV hierarchy: raw;level1;...;*")
    delimiter: str = Field(default=";", min_length=1, max_length=1)
    mask: MaskSpec | None = None
    prefix: PrefixSpec | None = None
    intervals: IntervalSpec | None = None
    dates: DateSpec | None = None
    groups: list[dict[str, str]] | None = Field(
        default=None,
        min_length=1,
        description="Explicit groupings: level 1 maps raw values to groups, level 2 maps those...",
    )
    codes: CodesSpec | None = None
    map: dict[str, str] = Field(
        default_factory=dict,
        description="Raw values to treat as another value of the hierarchy (e.g. '?': '*').",
    )

    @field_validator("groups", mode="before")
    @classmethod
    def _group_codes_as_text(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        return [
            {
                _scalar_text(k, "key"): _scalar_text(v, f"the group of {k!r} is")
                for k, v in level.items()
            }
            if isinstance(level, dict)
            else level
            for level in value
        ]

    @field_validator("map", mode="before")
    @classmethod
    def _map_codes_as_text(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        return {
            _scalar_text(k, "key"): _scalar_text(v, f"the value of {k!r} is")
            for k, v in value.items()
        }

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> HierarchyConfig:
        given = [k for k in HIERARCHY_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise ValueError(
                f"give exactly one of {', '.join(HIERARCHY_KINDS)} (got {what}), "
                "e.g. {file: hierarchies/age.csv} or {mask: {digits: 5}}"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in HIERARCHY_KINDS if getattr(self, k) is not None)


# ------------------------------------------------------------------------ releases


class _Release(_Model):
    name: str = Field(pattern=NAME_PATTERN, description="Folder name under releases/.")


Metric = Literal["loss", "discernibility", "precision", "entropy", "aecs", "kl"]
Algorithm = Literal["optimal", "heuristic", "mondrian"]


class _AnonymityRelease(_Release):
    suppression_limit: float = Field(default=0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    algorithm: Algorithm = "optimal"
    metric: Metric = "loss"
    min_levels: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    max_levels: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    time_limit_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    suppressed: Literal["star", "drop"] = Field(
        default="star", description="Suppressed records as '*' rows, or dropped."
    )
    unit: Literal["person", "rows"] | None = Field(
        default=None,
        description=(
            "What k and the SA counts of a class count: distinct persons "
            "(schema.privacy_unit) or rows (ARX). Default: person with a privacy_unit, "
            "else rows."
        ),
    )

    def counts_in(self, privacy_unit: str | None) -> Literal["person", "rows"]:
        """The unit classes are counted in (the default resolved)."""
        if self.unit is not None:
            return self.unit
        return "person" if privacy_unit else "rows"


class KAnonymityRelease(_AnonymityRelease):
    kind: Literal["k_anonymity"]
    k: int = Field(ge=2)


class LDiversityRelease(_AnonymityRelease):
    kind: Literal["l_diversity"]
    k: int = Field(default=1, ge=1)
    l: int = Field(ge=2)  # noqa: E741 - the field's own name in the literature
    variant: Literal["distinct", "entropy", "recursive"] = "distinct"
    c: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _c_for_recursive(self) -> LDiversityRelease:
        if self.variant == "recursive" and self.c is None:
            raise ValueError("variant: recursive needs 'c' (e.g. c: 4)")
        if self.variant != "recursive" and self.c is not None:
            raise ValueError(f"'c' applies only to variant: recursive, not {self.variant}")
        return self


class TClosenessRelease(_AnonymityRelease):
    kind: Literal["t_closeness"]
    k: int = Field(default=1, ge=1)
    t: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    distance: Literal["equal", "ordered", "hierarchical"] = "equal"


class DPQueryConfig(_Model):
    """One query of a DP release; the queries share the release's budget by weight."""

    name: str = Field(pattern=NAME_PATTERN, description="Name of the query in data.csv.")
    group_by: list[str] = Field(default_factory=list)
    levels: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="Hierarchy level per group_by column (0 = raw)."
    )
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)


class _DPRelease(_Release):
    kind: str
    epsilon: float = Field(gt=0, allow_inf_nan=False, description="Total epsilon of the release.")
    delta: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="Total delta: private partition selection and the discrete Gaussian.",
    )
    mechanism: Literal["discrete_laplace", "discrete_gaussian"] = "discrete_laplace"
    group_by: list[str] = Field(default_factory=list)
    levels: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="Hierarchy level per group_by column (0 = raw)."
    )
    queries: list[DPQueryConfig] | None = Field(
        default=None,
        min_length=1,
        description="Several queries sharing epsilon by weight (sequential composition).",
    )
    partition_by: list[str] = Field(
        default_factory=list,
        description="Columns splitting persons into disjoint groups (parallel composition).",
    )
    bound_to_one_group: bool = Field(
        default=False,
        description="Keep each person in one partition_by group (chosen at random) instead "
        "of refusing persons in several groups.",
    )
    max_partitions: int = Field(default=1, ge=1, description="L0: cells per person.")
    max_contributions_per_partition: int = Field(
        default=1, ge=1, description="Linf: rows per person and cell."
    )
    partitions: Literal["auto", "public", "private"] = Field(
        default="auto",
        description="public: every cell of the domain is released; private: cells are "
        "selected with (epsilon, delta); auto: public when every key column has a domain.",
    )
    domain: dict[str, list[str]] = Field(
        default_factory=dict, description="Public domain of key columns (values or labels)."
    )
    selection: Literal["truncated_geometric", "laplace"] = "truncated_geometric"
    selection_share: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="Share of each query's epsilon spent selecting private partitions.",
    )
    clamp: bool = Field(default=True, description="Post-processing: negative counts to 0.")
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)

    @field_validator("partition_by", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def query_list(self) -> list[DPQueryConfig]:
        """The release's queries; a release without ``queries`` is one query named after it."""
        if self.queries is not None:
            return list(self.queries)
        return [DPQueryConfig(name=self.name, group_by=self.group_by, levels=self.levels)]

    def key_columns(self) -> list[str]:
        """Every column that names a released cell: partition_by, then all group_by."""
        cols = list(self.partition_by)
        for q in self.query_list():
            cols += [c for c in q.group_by if c not in cols]
        return cols


class _DPCounts(_DPRelease):
    consistent: bool = Field(
        default=False,
        description="Adjust each query to its coarser version among the queries (same "
        "group_by, higher levels) so cells add up; post-processing.",
    )


class DPCountRelease(_DPCounts):
    kind: Literal["dp_count"]


class DPHistogramRelease(_DPCounts):
    kind: Literal["dp_histogram"]


class _DPValueRelease(_DPRelease):
    value: str = Field(description="Numeric column summed or averaged.")
    bounds: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(
        min_length=2,
        max_length=2,
        description="Clamping bounds [lower, upper] of the value column.",
    )
    resolution: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="Fixed-point step of released sums."
    )
    round: int | None = Field(
        default=None, ge=0, le=12, description="Post-processing: decimals of released values."
    )

    @model_validator(mode="after")
    def _ordered_bounds(self) -> _DPValueRelease:
        lo, hi = self.bounds
        if lo > hi:
            raise ValueError(f"bounds: lower {lo:g} is above upper {hi:g}; swap them")
        if lo == hi == 0:
            raise ValueError("bounds: [0, 0] makes every value 0; give the value's real range")
        return self


class DPSumRelease(_DPValueRelease):
    kind: Literal["dp_sum"]


class DPMeanRelease(_DPValueRelease):
    kind: Literal["dp_mean"]
    count_share: float = Field(
        default=0.5, gt=0, lt=1, allow_inf_nan=False, description="Share of epsilon for the count."
    )


class DPVarianceRelease(_DPValueRelease):
    """Variance or standard deviation of the clamped value per cell (noisy count, sum and
    sum of squares of the centred fixed-point values, epsilon split in three)."""

    kind: Literal["dp_variance", "dp_stddev"]


class DPQuantileRelease(_DPValueRelease):
    """Quantiles of the clamped value per cell by the exponential mechanism over the public
    grid lower + i·resolution; the quantiles split epsilon evenly."""

    kind: Literal["dp_quantile", "dp_median"]
    quantiles: list[Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]] | None = Field(
        default=None,
        min_length=1,
        description="Quantiles released per cell, e.g. [0.5, 0.9] (dp_median: [0.5]).",
    )

    def quantile_list(self) -> list[float]:
        """The configured quantiles, ascending (dp_median: the median)."""
        return sorted(self.quantiles) if self.quantiles else [0.5]

    @model_validator(mode="after")
    def _quantiles(self) -> DPQuantileRelease:
        if self.kind == "dp_median" and self.quantiles not in (None, [0.5]):
            raise ValueError("quantiles: dp_median releases the median; use kind dp_quantile")
        if self.kind == "dp_quantile" and not self.quantiles:
            raise ValueError("quantiles: dp_quantile needs quantiles, e.g. [0.5, 0.9]")
        if self.quantiles and len(set(self.quantiles)) != len(self.quantiles):
            raise ValueError("quantiles: a quantile is listed twice")
        return self


class DPCountDistinctRelease(_DPRelease):
    """Distinct persons (schema.privacy_unit) per cell; without a unit, rows."""

    kind: Literal["dp_count_distinct"]


class DPTopKRelease(_DPRelease):
    kind: Literal["dp_top_k", "dp_mode"]
    value: str = Field(description="Column whose most frequent values are released.")
    k: int = Field(default=1, ge=1, description="How many values per group (dp_mode: 1).")


LOCAL_PROTOCOLS = ("auto", "rr", "grr", "sue", "oue", "blh", "olh")
LocalProtocol = Literal["auto", "rr", "grr", "sue", "oue", "blh", "olh"]
MAX_LOCAL_EPSILON = 30.0  # dp.local.MAX_EPSILON (the pure core refuses more)
MAX_HORIZON = 1 << 40  # dp.continual.MAX_HORIZON


class LocalDPParties(_Model):
    """Multiparty noise beside a local DP release: parties by a column, or m even parties."""

    column: str | None = Field(default=None, description="Column naming each row's party.")
    count: int | None = Field(default=None, ge=1, description="m parties, persons split evenly.")

    @model_validator(mode="after")
    def _one_of(self) -> LocalDPParties:
        if (self.column is None) == (self.count is None):
            raise ValueError("give exactly one of column or count, e.g. {count: 10}")
        return self


class _PublicValuesRelease(_Release):
    """A histogram of one attribute over its public domain, one value per person."""

    attribute: str = Field(description="Column whose value each person reports.")
    domain: list[str] | None = Field(
        default=None,
        min_length=1,
        description="The attribute's public values (default: its file/groups hierarchy).",
    )
    other: str | None = Field(
        default=None,
        min_length=1,
        description="Report values outside the domain as this extra value (default: refuse).",
    )


class LocalDPRelease(_PublicValuesRelease):
    """Local DP frequency estimates of one attribute (each person randomises their value)."""

    kind: Literal["local_dp"]
    epsilon: float = Field(
        gt=0, allow_inf_nan=False, description="Local epsilon of each person's report."
    )
    protocol: LocalProtocol = Field(
        default="auto",
        description="rr (2 values), grr, sue, oue, blh, olh; auto: lowest variance for (eps, d).",
    )
    write_reports: bool = Field(
        default=False, description="Also write reports.csv: the perturbed reports only."
    )
    parties: LocalDPParties | None = Field(
        default=None,
        description="Also publish a multiparty histogram (each party noises its own counts).",
    )
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)

    def key_columns(self) -> list[str]:
        """Columns the release reads."""
        party = [self.parties.column] if self.parties and self.parties.column else []
        return [self.attribute, *[c for c in party if c != self.attribute]]


class PartyConfig(_Model):
    """Which party of a multiparty release this run is (the same release_id and count in
    every party's config)."""

    release_id: str = Field(
        pattern=NAME_PATTERN, description="The joint release's id, the same for every party."
    )
    index: int = Field(ge=0, description="This party's index, 0..count-1, each used once.")
    count: int = Field(ge=1, description="m: the number of parties.")


class PartyHistogramRelease(_PublicValuesRelease):
    """One party's noisy share of a multiparty histogram: its own rows + its own noise."""

    kind: Literal["dp_party_histogram"]
    epsilon: float = Field(
        gt=0, allow_inf_nan=False, description="Epsilon of the share (and of the aggregate)."
    )
    party: PartyConfig
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)

    def key_columns(self) -> list[str]:
        """Columns the release reads."""
        return [self.attribute]


class ContinualCountRelease(_Release):
    """A count (total or per public cell) published every period with the tree mechanism."""

    kind: Literal["dp_continual_count"]
    epsilon: float = Field(
        gt=0, allow_inf_nan=False, description="Epsilon of the whole stream (charged once)."
    )
    horizon: int = Field(ge=1, le=MAX_HORIZON, description="T: periods the stream covers.")
    period: int | None = Field(
        default=None, ge=1, description="The period this run publishes (or run --period N)."
    )
    group_by: list[str] = Field(default_factory=list)
    domain: dict[str, list[str]] = Field(
        default_factory=dict, description="Public domain of group_by columns."
    )
    pan_private: bool = Field(
        default=False, description="The stored state never holds a raw count (pan-privacy)."
    )
    state: str | None = Field(
        default=None,
        description="SQLite state file; default <ledger folder>/<name>.<release>.continual.sqlite.",
    )
    max_partitions: int = Field(default=1, ge=1, description="L0: cells per person per period.")
    max_contributions_per_partition: int = Field(
        default=1, ge=1, description="Linf: rows per person, cell and period."
    )
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)
    unit: Literal["event", "person"] = Field(
        default="event",
        description="event: epsilon protects one period of a person (event-level ledger "
        "entry); person: the whole horizon of a person (person-level entry).",
    )
    max_periods_per_person: int | None = Field(
        default=None,
        ge=1,
        description="unit person: periods a person may appear in (only the horizon: "
        "fewer cannot be enforced without remembering persons across periods).",
    )

    def key_columns(self) -> list[str]:
        return list(self.group_by)


Release = Annotated[
    KAnonymityRelease
    | LDiversityRelease
    | TClosenessRelease
    | DPCountRelease
    | DPHistogramRelease
    | DPSumRelease
    | DPMeanRelease
    | DPVarianceRelease
    | DPQuantileRelease
    | DPCountDistinctRelease
    | DPTopKRelease
    | LocalDPRelease
    | PartyHistogramRelease
    | ContinualCountRelease,
    Field(discriminator="kind"),
]
ANONYMITY_KINDS = ("k_anonymity", "l_diversity", "t_closeness")
DP_KINDS = (
    "dp_count",
    "dp_histogram",
    "dp_sum",
    "dp_mean",
    "dp_top_k",
    "dp_mode",
    "dp_count_distinct",
    "dp_variance",
    "dp_stddev",
    "dp_quantile",
    "dp_median",
)
LOCAL_KINDS = ("local_dp", "dp_party_histogram")
CONTINUAL_KINDS = ("dp_continual_count",)
RELEASE_KINDS = ANONYMITY_KINDS + DP_KINDS + LOCAL_KINDS + CONTINUAL_KINDS
BUDGETED = (_DPRelease, _PublicValuesRelease, ContinualCountRelease)  # charged to the ledger
DPRelease = (
    DPCountRelease
    | DPHistogramRelease
    | DPSumRelease
    | DPMeanRelease
    | DPVarianceRelease
    | DPQuantileRelease
    | DPCountDistinctRelease
    | DPTopKRelease
)
STATIC_HIERARCHY_KINDS = ("file", "groups", "codes")  # known without reading data


# ------------------------------------------------------------------------- attacks

TABLE_ATTACK_NAMES = ("homogeneity", "background_knowledge", "skewness", "similarity", "linkage")
DP_ATTACK_NAMES = ("attribute_inference", "membership", "differencing", "ldp_report")
ATTACK_NAMES = TABLE_ATTACK_NAMES + DP_ATTACK_NAMES
ATTACK_PARAMETERS: dict[str, dict[str, type]] = {
    "homogeneity": {},
    "background_knowledge": {"eliminate": int, "mode": str},
    "skewness": {"threshold": float},
    "similarity": {"level": int},
    "linkage": {"risk_threshold": float},
    "attribute_inference": {},
    "membership": {"trials": int},
    "differencing": {"trials": int},
    "ldp_report": {},
}


def _all_attacks() -> list[str | dict[str, dict[str, Any]]]:
    return [*ATTACK_NAMES]


class ControlConfig(_Model):
    """Where the control records come from (anonymeter's baseline, REFERENCE.md): records
    of the same population that are not in the published input."""

    holdout: float | None = Field(
        default=None,
        gt=0,
        le=0.5,
        allow_inf_nan=False,
        description="Share of persons (schema.privacy_unit, else rows) held out of the input "
        "before anything is profiled, searched, counted or published; chosen by a keyed hash "
        "with a fresh secret key per run. Held-out persons are in no release.",
    )
    file: str | None = Field(
        default=None,
        description="Records of the same population known not to be in the input (same "
        "columns, read like the input), relative to the config.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ControlConfig:
        if (self.holdout is None) == (self.file is None):
            raise ValueError(
                "give exactly one of holdout: <share in (0, 0.5]> (persons held out of the "
                "input) or file: <path> (records known not to be in the input)"
            )
        return self

    @field_validator("holdout", mode="before")
    @classmethod
    def _share(cls, value: Any) -> Any:
        """A share written as an integer (1) is still a number, refused by the range."""
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class AttacksConfig(_Model):
    """What the attacker knows and which attacks run against every release."""

    run: list[str | dict[str, dict[str, Any]]] = Field(
        default_factory=_all_attacks,
        description="Attacks by name, or {name: {parameter: value}}; default all.",
    )
    targets: Literal["all"] | Annotated[int, Field(ge=1)] = Field(
        default="all", description="Target records: all, or a seeded sample of N."
    )
    seed: int = Field(default=0, description="Seed of the target sample and simulations.")
    known: list[str] | None = Field(
        default=None, description="QIs the attacker knows (default all)."
    )
    tau: float = Field(
        default=0.5, gt=0, le=1, allow_inf_nan=False, description="Disclosure confidence."
    )
    control: ControlConfig | None = Field(
        default=None,
        description="Control records for the common attacker's baseline: {holdout: share} "
        "or {file: path}; absent: no control set.",
    )

    @field_validator("run")
    @classmethod
    def _known_attacks(cls, value: list[Any]) -> list[Any]:
        for i, item in enumerate(value):
            if isinstance(item, dict):
                if len(item) != 1:
                    raise ValueError(
                        f"run[{i}]: one attack per entry, e.g. {{similarity: {{level: 1}}}}"
                    )
                name, params = next(iter(item.items()))
            else:
                name, params = item, {}
            if name not in ATTACK_PARAMETERS:
                close = difflib.get_close_matches(str(name), ATTACK_NAMES, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(
                    f"run[{i}]: unknown attack {name!r}; {hint}known: {', '.join(ATTACK_NAMES)}"
                )
            if not isinstance(params, dict):
                raise ValueError(f"run[{i}].{name}: parameters must be a mapping")
            for key, val in params.items():
                want = ATTACK_PARAMETERS[name].get(key)
                if want is None:
                    allowed = ", ".join(ATTACK_PARAMETERS[name]) or "none"
                    raise ValueError(
                        f"run[{i}].{name}.{key}: unknown parameter; allowed: {allowed}"
                    )
                ok = isinstance(val, want) and not isinstance(val, bool)
                if want is float:
                    ok = isinstance(val, int | float) and not isinstance(val, bool)
                if not ok:
                    what = {int: "an integer", float: "a number", str: "a string"}[want]
                    raise ValueError(f"run[{i}].{name}.{key}: must be {what}, got {val!r}")
            mode = params.get("mode")
            if mode is not None and mode not in ("worst", "random"):
                raise ValueError(f"run[{i}].{name}.mode: must be worst or random, got {mode!r}")
        return value

    def attacks(self) -> dict[str, dict[str, Any]]:
        """Attack name → its parameters, in the configured order."""
        out: dict[str, dict[str, Any]] = {}
        for item in self.run:
            name, params = next(iter(item.items())) if isinstance(item, dict) else (item, {})
            out[name] = dict(params)
        return out


# ----------------------------------------------------------------- report, sweeps


class CountQueryConfig(_Model):
    """A user count query added to the audit's workload: rows matching every condition."""

    name: str = Field(pattern=NAME_PATTERN)
    where: dict[str, str | list[str]] = Field(min_length=1)


class ReportConfig(_Model):
    """The comparative audit (audit.json, report.md, report.html)."""

    enabled: bool = True
    columns: list[str] | None = Field(
        default=None, description="Workload columns (default: QIs and the sensitive attribute)."
    )
    queries: list[CountQueryConfig] = Field(default_factory=list)
    marginals: list[list[str]] | None = Field(
        default=None,
        min_length=1,
        description="The workload the publication serves, as marginals (lists of columns): "
        "every cell of each is one count query. Default: every 1- and 2-way marginal of "
        "report.columns. Releases are compared, and one recommended, on this workload.",
    )
    max_advantage: float = Field(
        default=0.1,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="The recommendation's threshold: publish the most useful release on the "
        "Pareto front whose common attribute advantage over the prior (upper end of its 95% "
        "interval) stays at or under this; if none does, the front's least-leaking one.",
    )


class SweepConfig(BaseModel):
    """One release expanded into a grid of parameter values (one release per point)."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    release: str = Field(description="Name of the release to expand.")

    def grid(self) -> dict[str, list[Any]]:
        return dict(self.model_extra or {})


def expand_sweeps(data: Mapping[str, Any]) -> dict[str, Any]:
    """The raw config with each ``sweep`` entry's release replaced by its grid points.

    ``{release: k5, k: [2, 5, 10]}`` turns release ``k5`` into ``k5-k2``, ``k5-k5``,
    ``k5-k10`` (several parameters: their cartesian product). Each point is then validated
    like any release, so a bad value names its expanded release.
    """
    sweeps = data.get("sweep")
    releases = data.get("releases")
    if not isinstance(sweeps, list) or not isinstance(releases, list):
        return dict(data)
    out = list(releases)
    for i, sw in enumerate(sweeps):
        if not isinstance(sw, Mapping) or "release" not in sw:
            continue  # the model reports it
        grid = {k: v for k, v in sw.items() if k != "release"}
        bad = [k for k, v in grid.items() if not isinstance(v, list) or not v]
        if bad or not grid:
            raise ValueError(
                f"sweep[{i}]: give each swept parameter as a non-empty list, e.g. "
                "{release: k5, k: [2, 5, 10, 25]}"
            )
        pos = next(
            (
                j
                for j, r in enumerate(out)
                if isinstance(r, Mapping) and r.get("name") == sw["release"]
            ),
            None,
        )
        if pos is None:
            raise ValueError(f"sweep[{i}].release: no release named {sw['release']!r}")
        base = out[pos]
        points = []
        for combo in itertools.product(*grid.values()):
            point = dict(base)
            suffix = []
            for key, value in zip(grid, combo, strict=True):
                point[key] = value
                suffix.append(f"{key}{value}")
            point["name"] = f"{base['name']}-{'-'.join(suffix)}"
            points.append(point)
        out[pos : pos + 1] = points
    return {**data, "releases": out}


def sweep_groups(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Sweep name → the names of its expanded releases, in grid order (for the report)."""
    groups: dict[str, list[str]] = {}
    for sw in data.get("sweep") or []:
        if isinstance(sw, Mapping) and "release" in sw:
            grid = {k: v for k, v in sw.items() if k != "release"}
            names = [
                f"{sw['release']}-" + "-".join(f"{k}{v}" for k, v in zip(grid, combo, strict=True))
                for combo in itertools.product(*grid.values())
            ]
            groups[f"{sw['release']}: {', '.join(grid)}"] = names
    return groups


# -------------------------------------------------------------------------- budget


class BudgetConfig(_Model):
    """The dataset's lifetime privacy budget, kept in a ledger file."""

    ledger: str = Field(
        description="SQLite ledger file (or folder) relative to the config file's folder; "
        "created once with `privpipe budget init`, never by a run."
    )
    lifetime_epsilon: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Optional: the lifetime lives in the ledger; if given it must match.",
    )
    lifetime_delta: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="Optional: the lifetime lives in the ledger; if given it must match.",
    )
    key_file: str | None = Field(
        default=None,
        description="File holding the ledger's HMAC key (mode 0600 or stricter), relative "
        "to the config file's folder. Default: the key is in the environment (key_env).",
    )
    key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the ledger's HMAC key; default "
        "PRIVPIPE_LEDGER_KEY when key_file is not given.",
    )
    heads_file: str | None = Field(
        default=None,
        description="Where the ledger heads (rollback detection) are recorded, kept with the "
        "key, not beside the ledger. Default: <key_file>.heads, or with an environment key "
        "$XDG_STATE_HOME (~/.local/state)/privpipe/heads/<name>.json.",
    )
    audit_ledger: str | None = Field(
        default=None,
        description="A separate audit ledger charged for DP candidates (releases computed "
        "and compared but not published; same lifetime). Default: candidates are not "
        "charged, as they never leave the operator. Published releases always spend from "
        "the dataset's ledger.",
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> BudgetConfig:
        if self.key_file is not None and self.key_env is not None:
            raise ValueError("give key_file or key_env, not both (where the ledger key is)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "sweep_ledger" in data:
            raise ValueError(
                "budget.sweep_ledger was renamed budget.audit_ledger: it is charged for the "
                "DP candidates (releases not in publish:), and every published release, "
                "sweep points included, spends from budget.ledger; rename the key"
            )
        return data


# -------------------------------------------------------------------------- output


class OutputConfig(_Model):
    dir: str = Field(description="Output folder, relative to the config file's folder.")
    format: Literal["csv", "parquet"] = "csv"
    work_dir: str | None = Field(
        default=None,
        description="Where a run's private scratch folder (row-level files, mode 0700, "
        "deleted at the end) is created; must be visible to every Beam worker. Default: "
        "the system temp folder. Never inside output.dir's public/ or internal/.",
    )
    world_readable: bool = Field(
        default=False,
        description="public/ readable by every user of the machine (mode 0755); by default "
        "0750: the owner and group only, until the operator hands the publication out. "
        "internal/, the ledger and the scratch folder are never world-readable.",
    )


# -------------------------------------------------------------------------- config


class PrivpipeConfig(_Model):
    """A whole privpipe config file."""

    name: str = Field(pattern=NAME_PATTERN, description="Dataset name (ledger, manifest).")
    input: InputConfig
    schema_: SchemaConfig = Field(alias="schema")
    hierarchies: dict[str, HierarchyConfig] = Field(default_factory=dict)
    releases: list[Release] = Field(default_factory=list)
    attacks: AttacksConfig | None = None
    report: ReportConfig | None = None
    sweep: list[SweepConfig] = Field(
        default_factory=list, description="Releases expanded into grids of parameter values."
    )
    budget: BudgetConfig | None = None
    output: OutputConfig
    publish: list[str] | None = Field(
        default=None,
        description="Names of the releases to publish into public/; the others are "
        "candidates (computed, attacked, compared, kept under internal/candidates/). "
        "Default: the only release if there is one, else none (a comparison run).",
    )
    accept_linked_releases: bool = Field(
        default=False,
        description="Publish releases whose combination reveals more than each alone "
        "(e.g. a table that reproduces a DP histogram exactly); the report flags it.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=False)

    def published(self) -> list[str]:
        """The names published into public/ (``publish:``, or the only release)."""
        if self.publish is not None:
            return list(self.publish)
        return [self.releases[0].name] if len(self.releases) == 1 else []

    @model_validator(mode="before")
    @classmethod
    def _expand_sweeps(cls, data: Any) -> Any:
        return expand_sweeps(data) if isinstance(data, Mapping) else data

    @field_validator("attacks", mode="before")
    @classmethod
    def _attack_list(cls, value: Any) -> Any:
        """DESIGN.md's short form: a list of attacks with the default attacker."""
        return {"run": value} if isinstance(value, list) else value

    @field_validator("releases", mode="before")
    @classmethod
    def _known_kind(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, r in enumerate(value):
                if isinstance(r, Mapping) and r.get("kind") not in RELEASE_KINDS:
                    raise ValueError(
                        f"releases[{i}].kind: unknown release kind {r.get('kind')!r}; "
                        f"this version supports: {', '.join(RELEASE_KINDS)}"
                    )
        return value

    @model_validator(mode="after")
    def _check_semantics(self) -> PrivpipeConfig:
        problems = semantic_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def needs_hierarchy(self) -> set[str]:
        """Columns that a configured release generalises (so they need a hierarchy)."""
        needed: set[str] = set()
        for r in self.releases:
            if isinstance(r, _DPRelease):
                for q in r.query_list():
                    needed |= {c for c, level in q.levels.items() if level > 0}
            if r.kind in ANONYMITY_KINDS:
                needed |= set(self.schema_.quasi_identifiers)
            hierarchical = isinstance(r, TClosenessRelease) and r.distance == "hierarchical"
            if hierarchical and self.schema_.sensitive:
                needed.add(self.schema_.sensitive)
        return needed


def semantic_problems(cfg: PrivpipeConfig) -> list[str]:
    """Cross-section rules, each message starting with the key path it is about."""
    s = cfg.schema_
    out: list[str] = []
    qis = s.quasi_identifiers
    dupes = sorted({q for q in qis if qis.count(q) > 1})
    if dupes:
        out.append(f"schema.quasi_identifiers: {dupes[0]!r} is listed twice")
    if s.sensitive is not None and s.sensitive in qis:
        out.append(
            f"schema.sensitive: {s.sensitive!r} is also a quasi-identifier; a column is "
            "either a QI or the sensitive attribute — remove it from one of the lists"
        )
    if s.privacy_unit is not None and (s.privacy_unit in qis or s.privacy_unit == s.sensitive):
        out.append(
            f"schema.privacy_unit: {s.privacy_unit!r} is also a QI or the sensitive attribute; "
            "the person id is neither"
        )
    roles = set(qis) | ({s.sensitive} if s.sensitive else set())
    for r in cfg.releases:
        if isinstance(r, _DPRelease):
            roles |= set(r.key_columns()) | ({r.value} if isinstance(r, DPTopKRelease) else set())
        if isinstance(r, _PublicValuesRelease | ContinualCountRelease):
            roles |= set(r.key_columns())
    for col in cfg.hierarchies:
        if col not in roles:
            out.append(
                f"hierarchies.{col}: {col!r} is neither a quasi-identifier, the sensitive "
                "attribute nor a DP release's key column; add it to schema.quasi_identifiers "
                "or remove the hierarchy"
            )
    for col, h in cfg.hierarchies.items():
        typ = s.types.get(col, "string")
        if h.intervals is not None and typ == "string" and col in s.types:
            out.append(
                f"hierarchies.{col}.intervals: needs a numeric column but schema.types.{col} "
                "is string; set it to integer or float"
            )
        iv = h.intervals
        if iv is not None:
            w = iv.widths
            if any(b <= a for a, b in itertools.pairwise(w)):
                out.append(f"hierarchies.{col}.intervals.widths: must increase, got {w}")
            elif any(not _is_multiple(b, a) for a, b in itertools.pairwise(w)):
                out.append(
                    f"hierarchies.{col}.intervals.widths: each width must be a multiple of "
                    f"the previous one (so every level generalises the one below), got {w}"
                )
            if iv.lower is not None and iv.upper is not None and iv.lower >= iv.upper:
                out.append(f"hierarchies.{col}.intervals: lower must be < upper")
    names = [r.name for r in cfg.releases]
    for i, n in enumerate(names):
        if n in names[:i]:
            out.append(
                f"releases[{i}].name: {n!r} is used by an earlier release; names must be unique"
            )
    needed = cfg.needs_hierarchy()
    for i, r in enumerate(cfg.releases):
        if r.kind in ANONYMITY_KINDS and not qis:
            out.append(f"releases[{i}]: kind {r.kind} needs schema.quasi_identifiers")
        if isinstance(r, LDiversityRelease | TClosenessRelease) and not s.sensitive:
            out.append(f"releases[{i}]: kind {r.kind} needs schema.sensitive")
        if isinstance(r, _AnonymityRelease):
            if r.unit == "person" and not s.privacy_unit:
                out.append(
                    f"releases[{i}].unit: person needs schema.privacy_unit (the column of "
                    "the person id); set it, or use unit: rows"
                )
            for key in ("min_levels", "max_levels"):
                for col in getattr(r, key):
                    if col not in qis:
                        out.append(f"releases[{i}].{key}.{col}: {col!r} is not a quasi-identifier")
            for col, lo in r.min_levels.items():
                hi = r.max_levels.get(col)
                if hi is not None and lo > hi:
                    out.append(f"releases[{i}].min_levels.{col}: {lo} > max_levels.{col} {hi}")
    for i, r in enumerate(cfg.releases):
        if isinstance(r, _DPRelease):
            out += dp_problems(cfg, i, r)
        elif isinstance(r, _PublicValuesRelease):
            out += local_problems(cfg, i, r)
        elif isinstance(r, ContinualCountRelease):
            out += continual_problems(cfg, i, r)
    if cfg.report is not None and cfg.report.columns:
        for c in cfg.report.columns:
            if c not in roles:
                out.append(
                    f"report.columns: {c!r} is not a quasi-identifier or the sensitive attribute"
                )
    for j, marginal in enumerate((cfg.report.marginals or []) if cfg.report else []):
        if not marginal or len(set(marginal)) != len(marginal):
            out.append(f"report.marginals[{j}]: give one or more distinct columns")
        for c in marginal:
            if c not in roles:
                out.append(
                    f"report.marginals[{j}]: {c!r} is not a quasi-identifier or the sensitive "
                    "attribute"
                )
    if cfg.attacks is not None:
        if not qis or not s.sensitive:
            out.append(
                "attacks: the attacker links targets by their quasi-identifiers and guesses "
                "the sensitive attribute; set schema.quasi_identifiers and schema.sensitive"
            )
        if cfg.attacks.control is not None and (not qis or not s.sensitive):
            out.append(
                "attacks.control: the control records are attacked like the input's; set "
                "schema.quasi_identifiers and schema.sensitive (or remove attacks.control)"
            )
        for q in cfg.attacks.known or []:
            if q not in qis:
                out.append(f"attacks.known: {q!r} is not a quasi-identifier")
        wanted = cfg.attacks.attacks()
        if "similarity" in wanted and s.sensitive and s.sensitive not in cfg.hierarchies:
            out.append(
                f"attacks.run: similarity needs a hierarchy of {s.sensitive!r} (its categories); "
                f"add hierarchies.{s.sensitive} or drop similarity"
            )
    if cfg.budget is None and any(isinstance(r, BUDGETED) for r in cfg.releases):
        first = next(i for i, r in enumerate(cfg.releases) if isinstance(r, BUDGETED))
        out.append(
            f"budget: missing; releases[{first}] is differentially private and every DP "
            "release is charged to the dataset's ledger, e.g. "
            "budget: {ledger: ledger.sqlite} (created with `privpipe budget init`)"
        )
    for col in sorted(needed):
        if col not in cfg.hierarchies:
            which = next(
                (f"releases[{i}] ({r.kind})" for i, r in enumerate(cfg.releases)), "a release"
            )
            out.append(
                f"hierarchies.{col}: missing; {which} generalises {col!r} and needs its "
                f"hierarchy, e.g. hierarchies: {{{col}: {{file: hierarchies/{col}.csv}}}}"
            )
    names = [r.name for r in cfg.releases]
    for i, name in enumerate(cfg.publish or []):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(
                f"publish[{i}]: no release named {name!r}{hint}; publish lists names from "
                f"releases: {', '.join(names) or '(none)'}"
            )
        elif (cfg.publish or []).count(name) > 1:
            out.append(f"publish[{i}]: {name!r} is listed twice")
    return out


def domain_source(cfg: PrivpipeConfig, given: bool, col: str) -> str | None:
    """Where ``col``'s public domain comes from: the release's own list ('domain'), a file
    or groups hierarchy ('hierarchy'), or nowhere (None: a domain read from data is private)."""
    if given:
        return "domain"
    h = cfg.hierarchies.get(col)
    if h is not None and h.kind in STATIC_HIERARCHY_KINDS:
        return "hierarchy"
    return None


def public_domain_source(cfg: PrivpipeConfig, r: _DPRelease, col: str) -> str | None:
    """Where ``col``'s public domain comes from for release ``r`` (None: not public)."""
    return domain_source(cfg, col in r.domain, col)


def resolved_partitions(cfg: PrivpipeConfig, r: _DPRelease) -> str:
    """'public' or 'private': what ``partitions: auto`` means for this release."""
    if r.partitions != "auto":
        return r.partitions
    cols = r.key_columns()
    return "public" if all(public_domain_source(cfg, r, c) for c in cols) else "private"


def dp_problems(cfg: PrivpipeConfig, i: int, r: _DPRelease) -> list[str]:
    """Cross-key rules of one DP release."""
    key = f"releases[{i}]"
    out: list[str] = []
    s = cfg.schema_
    if r.queries is not None and (r.group_by or r.levels):
        out.append(f"{key}.queries: give group_by/levels inside each query, not beside queries")
    names = [q.name for q in r.query_list()]
    for j, n in enumerate(names):
        if n in names[:j]:
            out.append(f"{key}.queries[{j}].name: {n!r} is used twice; names must be unique")
    for j, q in enumerate(r.query_list()):
        where = f"{key}.queries[{j}]" if r.queries is not None else key
        dupes = sorted({c for c in q.group_by if q.group_by.count(c) > 1})
        if dupes:
            out.append(f"{where}.group_by: {dupes[0]!r} is listed twice")
        if r.kind == "dp_histogram" and not q.group_by:
            out.append(
                f"{where}.group_by: dp_histogram needs at least one column; "
                "for a single total use kind: dp_count"
            )
        for col in q.levels:
            if col not in q.group_by:
                out.append(f"{where}.levels.{col}: {col!r} is not in group_by")
        both = sorted(set(q.group_by) & set(r.partition_by))
        if both:
            out.append(
                f"{where}.group_by: {both[0]!r} is also in partition_by; partition_by columns "
                "are part of every cell already"
            )
        if s.privacy_unit in q.group_by:
            out.append(f"{where}.group_by: {s.privacy_unit!r} is the privacy unit")
    if s.privacy_unit is not None and s.privacy_unit in r.partition_by:
        out.append(f"{key}.partition_by: {s.privacy_unit!r} is the privacy unit")
    value = getattr(r, "value", None)
    if value is not None and value in r.key_columns():
        out.append(f"{key}.value: {value!r} is also a group_by/partition_by column")
    if value is not None and value == s.privacy_unit:
        out.append(f"{key}.value: {value!r} is the privacy unit")
    keys = r.key_columns() + ([value] if isinstance(r, DPTopKRelease) else [])
    for col in r.domain:
        if col not in keys:
            out.append(f"{key}.domain.{col}: {col!r} is not a key column of this release")
        elif not r.domain[col]:
            out.append(f"{key}.domain.{col}: the domain is empty")
    if r.mechanism == "discrete_gaussian" and r.delta == 0:
        out.append(
            f"{key}.delta: mechanism discrete_gaussian needs delta > 0 (e.g. delta: 1.0e-6), "
            "or use mechanism: discrete_laplace"
        )
    out += delta_problems(s, key, r.delta)
    if isinstance(r, DPTopKRelease):
        if public_domain_source(cfg, r, r.value) is None:
            out.append(
                f"{key}.domain.{r.value}: dp_top_k picks among public candidates; give "
                f"domain: {{{r.value}: [...]}} or a file/groups hierarchy for {r.value!r}"
            )
        if r.partitions == "private":
            out.append(f"{key}.partitions: dp_top_k releases public groups only")
        private = [c for c in r.key_columns() if public_domain_source(cfg, r, c) is None]
        if private:
            out.append(
                f"{key}.domain.{private[0]}: the groups of dp_top_k must be public; give "
                f"domain: {{{private[0]}: [...]}} or a file/groups hierarchy"
            )
        if r.kind == "dp_mode" and r.k != 1:
            out.append(f"{key}.k: dp_mode releases one value per group (k: 1); use dp_top_k")
        return out
    mode = resolved_partitions(cfg, r)
    if mode == "public":
        missing = [c for c in r.key_columns() if public_domain_source(cfg, r, c) is None]
        if missing:
            out.append(
                f"{key}.partitions: public needs a public domain for {missing[0]!r}: give "
                f"domain: {{{missing[0]}: [...]}} or a file/groups hierarchy (a domain read "
                "from the data is not public)"
            )
    elif r.delta == 0:
        private = [c for c in r.key_columns() if public_domain_source(cfg, r, c) is None]
        out.append(
            f"{key}.delta: the cells of {private[0] if private else 'this release'!r} are not "
            "public, so they are chosen by private partition selection, which needs delta > 0 "
            "(e.g. delta: 1.0e-6); or give a public domain (domain: or a file/groups hierarchy)"
        )
    return out


def delta_problems(s: SchemaConfig, key: str, delta: float) -> list[str]:
    """δ > 0 is judged against the public bound schema.max_units, never the data's size."""
    if delta <= 0:
        return []
    units = "persons" if s.privacy_unit else "rows"
    if s.max_units is None:
        return [
            f"{key}.delta: delta > 0 needs schema.max_units, a public upper bound on the "
            f"number of {units} (delta must be below 1/max_units); add e.g. "
            f"schema.max_units: 10000000 and a delta below 1e-7"
        ]
    if delta * s.max_units >= 1:
        return [
            f"{key}.delta: {delta:g} is not below 1/schema.max_units = {1 / s.max_units:.3g}; "
            f"choose a smaller delta, e.g. {10 ** math.floor(math.log10(0.1 / s.max_units)):g}"
        ]
    return []


def local_problems(cfg: PrivpipeConfig, i: int, r: _PublicValuesRelease) -> list[str]:
    """Cross-key rules of one local DP or party release (the domain size when known here)."""
    key = f"releases[{i}]"
    out: list[str] = []
    s = cfg.schema_
    if isinstance(r, PartyHistogramRelease):
        if r.party.index >= r.party.count:
            out.append(
                f"{key}.party.index: {r.party.index} is not below party.count "
                f"{r.party.count}; number the parties 0..{r.party.count - 1}"
            )
    elif isinstance(r, LocalDPRelease) and r.epsilon > MAX_LOCAL_EPSILON:
        out.append(
            f"{key}.epsilon: local DP epsilon must be <= {MAX_LOCAL_EPSILON:g} (beyond it the "
            f"randomiser is practically the identity), got {r.epsilon:g}"
        )
    if r.attribute == s.privacy_unit:
        out.append(f"{key}.attribute: {r.attribute!r} is the privacy unit")
    parties = r.parties if isinstance(r, LocalDPRelease) else None
    party = parties.column if parties is not None else None
    if party is not None and party == s.privacy_unit:
        out.append(
            f"{key}.parties.column: {party!r} is the privacy unit; a party holds many "
            "persons (use parties: {count: m} to split them evenly)"
        )
    if r.domain is not None:
        dupes = sorted({v for v in r.domain if r.domain.count(v) > 1})
        if dupes:
            out.append(f"{key}.domain: {dupes[0]!r} is listed twice")
    elif public_local_domain_source(cfg, r) is None:
        out.append(
            f"{key}.domain: the values of {r.attribute!r} must be public (local DP estimates "
            f"every value of the domain): give domain: [...] or a file/groups hierarchy for "
            f"{r.attribute!r} (a domain read from the data is not public)"
        )
    if r.other is not None and r.domain is not None and r.other in r.domain:
        out.append(f"{key}.other: {r.other!r} is already a value of the domain")
    if r.domain is not None:
        d = len(set(r.domain)) + (1 if r.other is not None else 0)
        if d < 2:
            out.append(f"{key}.domain: local DP needs at least 2 values, got {d}")
        elif isinstance(r, LocalDPRelease) and r.protocol == "rr" and d != 2:
            out.append(
                f"{key}.protocol: rr (randomised response) is for yes/no attributes with 2 "
                f"values, but the domain has {d}; use grr, oue, olh or auto"
            )
    return out


def public_local_domain_source(cfg: PrivpipeConfig, r: _PublicValuesRelease) -> str | None:
    """Where a local DP release's domain comes from: 'domain', 'hierarchy' or None."""
    return domain_source(cfg, r.domain is not None, r.attribute)


def continual_domain_source(cfg: PrivpipeConfig, r: ContinualCountRelease, col: str) -> str | None:
    """Where a continual count's group_by column gets its public domain."""
    return domain_source(cfg, col in r.domain, col)


def continual_problems(cfg: PrivpipeConfig, i: int, r: ContinualCountRelease) -> list[str]:
    """Cross-key rules of one continual count."""
    key = f"releases[{i}]"
    out: list[str] = []
    s = cfg.schema_
    if r.period is not None and r.period > r.horizon:
        out.append(
            f"{key}.period: {r.period} is beyond the horizon {r.horizon}; the stream's budget "
            "covers periods 1..horizon only"
        )
    m = r.max_periods_per_person
    if m is not None and r.unit != "person":
        out.append(
            f"{key}.max_periods_per_person: only for unit: person (an event-level stream "
            "protects one period of a person); remove it or set unit: person"
        )
    elif m is not None and m != r.horizon:
        out.append(
            f"{key}.max_periods_per_person: {m} < horizon {r.horizon} cannot be enforced: it "
            "would need remembering who appeared in earlier periods, which the pan-private "
            f"state must not; remove it (default: the horizon, {r.horizon})"
        )
    dupes = sorted({c for c in r.group_by if r.group_by.count(c) > 1})
    if dupes:
        out.append(f"{key}.group_by: {dupes[0]!r} is listed twice")
    if s.privacy_unit is not None and s.privacy_unit in r.group_by:
        out.append(f"{key}.group_by: {s.privacy_unit!r} is the privacy unit")
    for col in r.domain:
        if col not in r.group_by:
            out.append(f"{key}.domain.{col}: {col!r} is not in group_by")
        elif not r.domain[col]:
            out.append(f"{key}.domain.{col}: the domain is empty")
    for col in r.group_by:
        if continual_domain_source(cfg, r, col) is None:
            out.append(
                f"{key}.domain.{col}: a continual count publishes every cell of a public "
                f"domain; give domain: {{{col}: [...]}} or a file/groups hierarchy for {col!r}"
            )
    return out


def _is_multiple(b: float, a: float) -> bool:
    q = b / a
    return math.isclose(q, round(q), rel_tol=0, abs_tol=1e-9)


# ------------------------------------------------------------------ error messages


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in RELEASE_KINDS:  # discriminated-union tag inserted by pydantic
            continue
        else:
            path += ("." if path else "") + ("schema" if part == "schema_" else str(part))
    return path


_PREFIX = re.compile(r"^(Value error|Assertion failed), ")


def _describe(err: Mapping[str, Any]) -> str:
    typ = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    shown = _show(got)
    if typ == "missing":
        return "required key is missing"
    if typ in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[typ]
        bound = next(iter(ctx.values()))
        kind = "an integer" if isinstance(bound, int) else "a number"
        return f"must be {kind} {op} {bound}, got {shown}"
    if typ in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {shown}"
    if typ in ("float_type", "float_parsing"):
        return f"must be a number, got {shown}"
    if typ == "finite_number":
        return f"must be a finite number, got {shown}"
    if typ in ("string_type",):
        return f"must be a string, got {shown}"
    if typ == "bool_type":
        return f"must be true or false, got {shown}"
    if typ in ("list_type",):
        return f"must be a list, got {shown}"
    if typ in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping of keys to values, got {shown}"
    if typ == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {shown}"
    if typ == "string_pattern_mismatch":
        return (
            f"must start with a letter or digit and use only letters, digits, '.', '_', '-', "
            f"got {shown}"
        )
    if typ in ("string_too_short", "string_too_long") and ctx.get("max_length") == 1:
        return f"must be a single character, got {shown}"
    if typ == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s), got {shown}"
    if typ == "union_tag_invalid":
        return f"unknown kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    if typ == "union_tag_not_found":
        return "needs a 'kind' key"
    msg = _PREFIX.sub("", str(err["msg"]))
    return msg[0].lower() + msg[1:] if msg else typ


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 60


def _show(value: Any) -> str:
    """A short repr, bounded in time and size whatever the value (never the whole of a
    large or alias-expanded structure)."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: `demo.yaml: releases[2].k: must be an integer >= 2, got 1`."""
    lines = []
    for err in exc.errors(include_url=False):
        path = _loc_to_path(tuple(err["loc"]))
        for msg in _describe(err).split("\n"):
            if msg.startswith(_KEY_MARK):
                key, msg = msg[1:].split(_KEY_MARK, 1)
                path_here = f"{path}.{key}" if path else key
                lines.append(f"{source}: {path_here}: {msg}")
            # messages from our own validators may already start with their key path
            elif path and not msg.startswith(path.split("[")[0]):
                lines.append(f"{source}: {path}: {msg}")
            else:
                lines.append(f"{source}: {msg}")
    return "\n".join(dict.fromkeys(lines))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the config, generated from the models."""
    schema = PrivpipeConfig.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "privpipe config"
    return schema


# ----------------------------------------------------------------------- loading


MAX_YAML_NODES = 1_000_000  # after aliases are expanded; a real config has thousands


def _expanded_nodes(root: yaml.Node, where: str) -> int:
    """How many nodes the document has once every alias is expanded (each shared node
    counted once per reference, computed once per node): linear in the composed graph, so
    an alias bomb is measured without being expanded."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in size:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            open_.discard(key)
            size[key] = min(1 + sum(size[id(c)] for c in children), MAX_YAML_NODES + 1)
            continue
        if key in open_:
            raise ConfigError(
                f"{where}: line {node.start_mark.line + 1}: an alias refers to a node that "
                "contains it (a recursive anchor); a config cannot be infinite: remove it"
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


MAX_FLOW_DEPTH = 100  # nested [ ] / { }: PyYAML's scanner is quadratic in this depth
_QUOTED_OR_COMMENT = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"|(?:^|(?<=\s))#[^\n]*", re.M)


def _flow_depth(text: str) -> int:
    """The deepest nesting of flow collections (``[``/``{``) outside quotes and comments,
    found in one vectorised pass before PyYAML sees the text (it takes seconds at a depth
    of a thousand, minutes at ten thousand)."""
    import numpy as np

    bare = _QUOTED_OR_COMMENT.sub("", text).encode("utf-8", "replace")
    codes = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(codes, (0x5B, 0x7B)).astype(np.int32) - np.isin(codes, (0x5D, 0x7D))
    return int(np.cumsum(steps).max()) if steps.size else 0


def _load_bounded(text: str, where: str) -> Any:
    """``yaml.safe_load`` that refuses, before building anything, a document whose aliases
    expand to more than :data:`MAX_YAML_NODES` nodes (a "billion laughs" bomb would
    otherwise take gigabytes once validated) or that nests too deeply."""
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise ConfigError(
            f"{where}: the YAML nests [ ] or {{ }} more than {MAX_FLOW_DEPTH} levels deep, "
            "which no config needs; flatten it"
        )
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except RecursionError:
            raise ConfigError(
                f"{where}: the YAML nests too deeply to be a config; flatten it"
            ) from None
        if root is None:
            return None
        nodes = _expanded_nodes(root, where)
        if nodes > MAX_YAML_NODES:
            raise ConfigError(
                f"{where}: its aliases (*name) expand to more than {MAX_YAML_NODES:,} values "
                "(an alias bomb?); write the config without nested aliases"
            )
        return loader.construct_document(root)
    finally:
        loader.dispose()


def read_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """Parse the YAML file; returns the raw mapping and its sha256."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found; check the path") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config file: {e.strerror}") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        data = _load_bounded(text, p.name)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(
            f"{p.name}: YAML syntax error at {where}{e.problem or e.context}; "
            "fix the indentation or quoting there"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p.name}: YAML error: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p.name}: the config must be a mapping of keys (name, input, schema, ...), "
            f"got {type(data).__name__}"
        )
    return data, digest


def validate_config(data: dict[str, Any], source: str) -> PrivpipeConfig:
    """The raw mapping as a validated PrivpipeConfig, or a ConfigError listing every problem."""
    try:
        return PrivpipeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(source, e)) from None
