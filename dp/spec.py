"""What one central-DP release computes and what it spends: queries, bounds, noise, budget.

A :class:`DPReleaseSpec` is the pure core's view of one ``dp_*`` release of the config.
:func:`plan_queries` turns it into one :class:`QueryPlan` per query with every noise scale
fixed *before any data is read* (scales depend on the config only), so the run can charge
the ledger up front and the accountant can bound the release from the plan alone.

Budget split (all exact Fractions until a float scale is computed):

- queries share the release's ε by weight (sequential composition);
- with private partitions a query spends ``selection_share`` of its ε on selecting cells
  (with δ), the rest on noise; ``dp_mean`` splits the noise ε between count and sum;
  ``dp_variance``/``dp_stddev`` split it in three equal parts (count, sum, sum of squares);
  ``dp_quantile`` splits it evenly over its quantiles (each an exponential mechanism per
  cell, at ε/L0 per cell when group_by lets a person touch L0 cells);
- δ: half to partition selection and half to discrete-Gaussian noise when both exist;
  selection δ is split by weight, Gaussian δ evenly over the Gaussian steps (so basic
  composition reproduces the configured (ε, δ) exactly);
- ``partition_by`` groups hold disjoint persons: each group runs the queries with the full
  budget (parallel composition), so it costs the maximum, not the sum, over groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from privpipe.dp.accounting import (
    Accountant,
    ApproxDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Parallel,
    Step,
    group_privacy,
)
from privpipe.dp.aggregate import NoiseSpec, _fixed_point, noise_spec
from privpipe.dp.bounding import sensitivities
from privpipe.dp.budget import to_fraction
from privpipe.errors import ConfigError

COUNT_KINDS = ("dp_count", "dp_histogram")
DISTINCT_KINDS = ("dp_count_distinct",)  # distinct persons per cell: a noisy count of units
VALUE_KINDS = ("dp_sum", "dp_mean")
MOMENT_KINDS = ("dp_variance", "dp_stddev")  # noisy count, sum and sum of squares
QUANTILE_KINDS = ("dp_quantile", "dp_median")  # exponential mechanism over a public grid
BOUNDED_KINDS = VALUE_KINDS + MOMENT_KINDS + QUANTILE_KINDS  # a value clamped to bounds
TOP_KINDS = ("dp_top_k", "dp_mode")
KINDS = COUNT_KINDS + DISTINCT_KINDS + VALUE_KINDS + MOMENT_KINDS + QUANTILE_KINDS + TOP_KINDS
CENTRED_KINDS = ("dp_mean", *MOMENT_KINDS)  # values centred on the middle of the bounds
MAX_GRID = 1_000_000  # candidates of a quantile's grid: (upper − lower)/resolution + 1
MAX_QUANTILE_DENOMINATOR = 10_000  # quantiles are exact fractions a/d with d ≤ this
GROUP_SIZES = (2, 5, 10)  # group privacy reported for these group sizes
# noise beyond 2^62 would saturate the int64 sampler: b ≤ 2^56 makes it a e^-64 event
MAX_NOISE_SCALE = float(2**56)
MAX_FIXED_POINT = 2**53  # one row's fixed-point value: an exact float64 integer


@dataclass(frozen=True)
class Query:
    """One histogram of a release: its cells are partition_by + group_by (at levels)."""

    name: str
    group_by: tuple[str, ...] = ()
    levels: tuple[tuple[str, int], ...] = ()
    weight: Fraction = Fraction(1)

    def level(self, col: str) -> int:
        return dict(self.levels).get(col, 0)


def _level_sum(q: Query) -> int:
    return sum(dict(q.levels).values())


@dataclass(frozen=True)
class DPReleaseSpec:
    """One central-DP release; immutable and validated."""

    name: str
    kind: str
    epsilon: Fraction
    delta: Fraction = Fraction(0)
    mechanism: str = "discrete_laplace"
    unit: str | None = None
    queries: tuple[Query, ...] = ()
    partition_by: tuple[str, ...] = ()
    bound_to_one_group: bool = False
    max_partitions: int = 1
    max_contributions: int = 1
    partitions: str = "public"
    # public domain per key column and level: ((column, level), labels)
    domains: tuple[tuple[tuple[str, int], tuple[str, ...]], ...] = ()
    selection: str = "truncated_geometric"
    selection_share: Fraction = Fraction(1, 2)
    value: str | None = None
    bounds: tuple[float, float] | None = None
    resolution: float = 1.0
    count_share: Fraction = Fraction(1, 2)
    top_k: int = 1
    clamp: bool = True
    confidence: float = 0.95
    consistent: bool = False  # adjust finer queries to their coarser ancestors (counts)
    decimals: int | None = None  # round released sums/means (post-processing)
    max_units: int | None = None  # public bound on persons (rows without a unit): δ < 1/it
    quantiles: tuple[Fraction, ...] = ()  # dp_quantile: the quantiles, each in (0, 1)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if not self.epsilon > 0:
            raise ConfigError(f"{self.name}: epsilon must be > 0, got {self.epsilon}")
        if not 0 <= self.delta < 1:
            raise ConfigError(f"{self.name}: delta must be in [0, 1), got {self.delta}")
        if not self.queries:
            raise ConfigError(f"{self.name}: a DP release needs at least one query")
        if self.kind in BOUNDED_KINDS + TOP_KINDS and not self.value:
            raise ConfigError(f"{self.name}: {self.kind} needs a value column")
        if self.kind == "dp_median" and not self.quantiles:
            object.__setattr__(self, "quantiles", (Fraction(1, 2),))
        if self.kind == "dp_median" and self.quantiles != (Fraction(1, 2),):
            raise ConfigError(f"{self.name}.quantiles: dp_median is the quantile 0.5")
        if self.kind in QUANTILE_KINDS:
            if not self.quantiles:
                raise ConfigError(f"{self.name}.quantiles: give at least one, e.g. [0.5]")
            for q in self.quantiles:
                if not 0 < q < 1 or q.denominator > MAX_QUANTILE_DENOMINATOR:
                    raise ConfigError(
                        f"{self.name}.quantiles: {float(q):g} must lie strictly between 0 "
                        "and 1 with at most 4 decimals (e.g. 0.5, 0.9, 0.99)"
                    )
        if self.kind in BOUNDED_KINDS:
            if self.bounds is None:
                raise ConfigError(f"{self.name}: {self.kind} needs bounds [lower, upper]")
            lo, hi = self.bounds
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise ConfigError(f"{self.name}: bounds must be finite with lower <= upper")
        if self.max_units is not None and self.delta * self.max_units >= 1:
            raise ConfigError(
                f"{self.name}.delta: {float(self.delta):g} is not below 1/schema.max_units = "
                f"{1 / self.max_units:.3g}; choose a smaller delta"
            )
        if self.partitions not in ("public", "private"):
            raise ConfigError(f"{self.name}: partitions must be public or private")
        if self.partitions == "private" and self.delta == 0:
            raise ConfigError(f"{self.name}: private partition selection needs delta > 0")
        if self.mechanism == "discrete_gaussian" and self.delta == 0:
            raise ConfigError(f"{self.name}: the discrete Gaussian needs delta > 0")
        if self.consistent and (
            self.kind not in COUNT_KINDS or not any(self.ancestor(q) for q in self.queries)
        ):
            raise ConfigError(
                f"{self.name}.consistent: needs counts with a query that is a coarser version "
                "of another (same group_by, higher levels)"
            )

    @property
    def l0(self) -> int:
        """Cells per person after bounding (1 when each row is its own person)."""
        return self.max_partitions if self.unit is not None else 1

    @property
    def linf(self) -> int:
        """Rows per person and cell after bounding (1 when each row is its own person)."""
        return self.max_contributions if self.unit is not None else 1

    def key_columns(self, query: Query) -> tuple[str, ...]:
        """Cell columns of ``query``: partition_by, group_by, and the value for top-k."""
        cols = (*self.partition_by, *query.group_by)
        return (*cols, self.value) if self.kind in TOP_KINDS and self.value else cols

    def domain(self, col: str, level: int) -> tuple[str, ...] | None:
        """Public labels of ``col`` at ``level``, or None."""
        return dict(self.domains).get((col, level))

    def ancestor(self, query: Query) -> Query | None:
        """The nearest other query over the same columns at levels all >= (one >), or None."""
        best: Query | None = None
        for q in self.queries:
            if q is query or set(q.group_by) != set(query.group_by):
                continue
            up = [q.level(c) - query.level(c) for c in query.group_by]
            coarser = all(d >= 0 for d in up) and any(d > 0 for d in up)
            if coarser and (best is None or _level_sum(q) < _level_sum(best)):
                best = q
        return best

    @property
    def is_private_selection(self) -> bool:
        return self.kind not in TOP_KINDS and self.partitions == "private"


@dataclass(frozen=True)
class QueryPlan:
    """The fixed noise and selection parameters of one query (data-independent)."""

    query: Query
    epsilon: Fraction
    delta: Fraction
    count_noise: NoiseSpec | None = None
    sum_noise: NoiseSpec | None = None
    sum_units: tuple[int, int] | None = None  # fixed-point clamp bounds of one row
    centre: float = 0.0
    selection_epsilon: Fraction | None = None
    selection_delta: Fraction | None = None
    top_epsilon: Fraction | None = None  # per group, exponential mechanism
    sumsq_noise: NoiseSpec | None = None  # dp_variance/dp_stddev: the sum of squares
    sumsq_bound: int = 0  # the largest squared fixed-point value of one row
    quantile_epsilon: Fraction | None = None  # per cell and quantile, exponential mechanism
    steps: tuple[Step, ...] = field(default=())

    @property
    def grid(self) -> int:
        """Candidates of a quantile's grid (lower + i·resolution, i = 0..grid−1)."""
        return 0 if self.sum_units is None else self.sum_units[1] + 1

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": float(self.epsilon), "delta": float(self.delta)}
        for key, spec in (
            ("count_noise", self.count_noise),
            ("sum_noise", self.sum_noise),
            ("sum_of_squares_noise", self.sumsq_noise),
        ):
            if spec is not None:
                out[key] = {
                    "mechanism": spec.mechanism,
                    "scale": spec.scale,
                    "sensitivity": spec.sensitivity,
                    "ci_halfwidth": spec.halfwidth,
                    "confidence": 1 - spec.beta,
                }
        if self.selection_epsilon is not None:
            out["partition_selection"] = {
                "epsilon": float(self.selection_epsilon),
                "delta": float(self.selection_delta or 0),
            }
        if self.top_epsilon is not None:
            out["exponential_mechanism"] = {"epsilon_per_group": float(self.top_epsilon)}
        if self.quantile_epsilon is not None:
            out["exponential_mechanism"] = {
                "epsilon_per_cell_and_quantile": float(self.quantile_epsilon),
                "candidates": self.grid,
            }
        return out


def rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ whose zCDP→(ε, δ) conversion ρ + 2√(ρ ln(1/δ)) is at most ε."""
    log_term = math.log(1.0 / delta)
    # √(L+ε) − √L written without cancellation (tiny ε would give 0)
    root = epsilon / (math.sqrt(log_term) + math.sqrt(log_term + epsilon))
    rho = root * root
    while rho + 2.0 * math.sqrt(rho * log_term) > epsilon:  # float rounding: stay below ε
        rho = math.nextafter(rho, 0.0)
    return rho


def _noise(
    spec: DPReleaseSpec, eps: Fraction, delta: float | None, l1: float, l2: float
) -> NoiseSpec:
    """The noise of one step; a scale the sampler cannot serve exactly is a ConfigError
    (at validate, before any charge), never an overflow later."""
    beta = (1.0 - spec.confidence) / (3 if spec.kind in MOMENT_KINDS else 1)  # union bound
    try:
        if spec.mechanism == "discrete_laplace":
            out = noise_spec("discrete_laplace", epsilon=float(eps), l1=l1, beta=beta)
        else:
            assert delta is not None and delta > 0
            rho = rho_for(float(eps), delta)
            out = noise_spec("discrete_gaussian", rho=rho, l2=l2, beta=beta)
    except ConfigError:
        out = None
    if out is None or not out.scale <= MAX_NOISE_SCALE:
        raise ConfigError(
            f"{spec.name}.epsilon: {float(spec.epsilon):g} needs a noise scale above "
            f"{MAX_NOISE_SCALE:.3g} (2^56, the largest the integer sampler serves without "
            "saturating); raise epsilon"
            + (", or narrow bounds / coarsen resolution" if spec.kind in BOUNDED_KINDS else "")
        )
    return out


def _as_step(spec: NoiseSpec, dims: int | None, name: str) -> Step:
    mech = spec.accounting()
    if isinstance(mech, DiscreteGaussian):
        mech = DiscreteGaussian.of(mech.sigma, mech.sensitivity, dims, name)
    else:
        mech = DiscreteLaplace.of(mech.scale, mech.sensitivity, name)
    return mech


def plan_queries(spec: DPReleaseSpec) -> list[QueryPlan]:
    """One QueryPlan per query: the budget split and every noise scale (see module doc)."""
    total_w = sum((q.weight for q in spec.queries), Fraction(0))
    gauss_steps = 0
    if spec.mechanism == "discrete_gaussian" and spec.kind not in TOP_KINDS + QUANTILE_KINDS:
        gauss_steps = len(spec.queries) * NOISY_PARTS.get(spec.kind, 1)
    private = spec.is_private_selection
    sel_delta_total = spec.delta / 2 if (private and gauss_steps) else spec.delta
    gauss_delta_total = spec.delta - sel_delta_total if private else spec.delta
    gauss_delta = float(gauss_delta_total / gauss_steps) if gauss_steps else None
    l0, linf = spec.l0, spec.linf
    plans: list[QueryPlan] = []
    for q in spec.queries:
        share = q.weight / total_w
        eps_q, delta_q = spec.epsilon * share, spec.delta * share
        steps: list[Step] = []
        sel_eps = sel_delta = None
        noise_eps = eps_q
        if private:
            sel_eps = eps_q * spec.selection_share
            sel_delta = sel_delta_total * share
            noise_eps = eps_q - sel_eps
            steps.append(ApproxDP.of(sel_eps, sel_delta, f"{q.name}: partition selection"))
        dims = 1 if not spec.key_columns(q) else None
        count_noise = sum_noise = None
        sum_units: tuple[int, int] | None = None
        centre = 0.0
        top_eps = None
        sumsq_noise = None
        sumsq_bound = 0
        quantile_eps = None
        if spec.kind in COUNT_KINDS + DISTINCT_KINDS:
            # a person counts once per cell for dp_count_distinct: Linf is 1
            c1, c2 = sensitivities(l0, linf if spec.kind in COUNT_KINDS else 1)
            count_noise = _noise(spec, noise_eps, gauss_delta, c1, c2)
            steps.append(_as_step(count_noise, dims, f"{q.name}: count"))
        elif spec.kind in QUANTILE_KINDS:
            sum_units = (0, _grid_size(spec) - 1)  # grid indices: lower + i·resolution
            centre = float(spec.bounds[0]) if spec.bounds else 0.0
            per_group = l0 if q.group_by else 1
            quantile_eps = noise_eps / (per_group * len(spec.quantiles))
            steps.append(ApproxDP.of(noise_eps, 0, f"{q.name}: exponential mechanism"))
        elif spec.kind in MOMENT_KINDS:
            count_noise, sum_noise, sumsq_noise, sum_units, sumsq_bound, centre = _moments(
                spec, noise_eps, gauss_delta
            )
            for noise, part in ((count_noise, "count"), (sum_noise, "sum")):
                steps.append(_as_step(noise, dims, f"{q.name}: {part}"))
            steps.append(_as_step(sumsq_noise, dims, f"{q.name}: sum of squares"))
        elif spec.kind in VALUE_KINDS:
            assert spec.bounds is not None
            lo, hi = spec.bounds
            if spec.kind == "dp_mean":
                centre = (lo + hi) / 2.0
                lo, hi = lo - centre, hi - centre
            sum_units = _fixed_point(lo, hi, spec.resolution)
            if max(abs(sum_units[0]), abs(sum_units[1])) > MAX_FIXED_POINT:
                raise ConfigError(
                    f"{spec.name}.bounds: {list(spec.bounds)} at resolution {spec.resolution:g} "
                    f"is more than 2^53 steps per row, beyond exact float64 integers; raise "
                    f"{spec.name}.resolution (e.g. {_coarser(spec.bounds):g}) or narrow bounds"
                )
            s1, s2 = sensitivities(l0, linf, clamp=(float(sum_units[0]), float(sum_units[1])))
            sum_eps = noise_eps
            if spec.kind == "dp_mean":
                count_eps = noise_eps * spec.count_share
                sum_eps = noise_eps - count_eps
                c1, c2 = sensitivities(l0, linf)
                count_noise = _noise(spec, count_eps, gauss_delta, c1, c2)
                steps.append(_as_step(count_noise, dims, f"{q.name}: count"))
            if max(abs(sum_units[0]), abs(sum_units[1])) == 0:
                raise ConfigError(
                    f"{spec.name}: bounds {spec.bounds} round to 0 at resolution "
                    f"{spec.resolution}; use a finer resolution"
                )
            sum_noise = _noise(spec, sum_eps, gauss_delta, s1, s2)
            steps.append(_as_step(sum_noise, dims, f"{q.name}: sum"))
        else:  # top-k: a person touches at most L0 groups when group_by splits them
            top_eps = eps_q / (l0 if q.group_by else 1)
            steps.append(ApproxDP.of(eps_q, 0, f"{q.name}: exponential mechanism"))
        if sel_eps is not None and sel_delta is not None:
            _dry_run_selection(spec, sel_eps, sel_delta)
        if spec.partition_by:
            steps = [Parallel((s,), f"{q.name}: partition_by groups") for s in steps]  # type: ignore[arg-type]
        plans.append(
            QueryPlan(
                query=q,
                epsilon=eps_q,
                delta=delta_q,
                count_noise=count_noise,
                sum_noise=sum_noise,
                sum_units=sum_units,
                centre=centre,
                selection_epsilon=sel_eps,
                selection_delta=sel_delta,
                top_epsilon=top_eps,
                sumsq_noise=sumsq_noise,
                sumsq_bound=sumsq_bound,
                quantile_epsilon=quantile_eps,
                steps=tuple(steps),
            )
        )
    return plans


NOISY_PARTS = {"dp_mean": 2, "dp_variance": 3, "dp_stddev": 3}  # noise steps per query


def _grid_size(spec: DPReleaseSpec) -> int:
    """Candidates of the quantile grid lower + i·resolution within the bounds; ConfigError
    beyond :data:`MAX_GRID` (the mechanism scores every candidate of every cell)."""
    assert spec.bounds is not None
    lo, hi = spec.bounds
    size = math.floor((hi - lo) / spec.resolution + 1e-9) + 1
    if size > MAX_GRID:
        raise ConfigError(
            f"{spec.name}.resolution: bounds {list(spec.bounds)} at resolution "
            f"{spec.resolution:g} give {size:,} candidates (more than {MAX_GRID:,}); raise "
            f"resolution to at least {(hi - lo) / (MAX_GRID - 1):.3g}"
        )
    return size


def _moments(
    spec: DPReleaseSpec, eps: Fraction, gauss_delta: float | None
) -> tuple[NoiseSpec, NoiseSpec, NoiseSpec, tuple[int, int], int, float]:
    """The three noises of a variance (count, sum, sum of squares, ε/3 each) on values
    centred on the grid point nearest the middle of the bounds, in fixed point: one row
    moves the sum by at most m = max |centred value| and the sum of squares by at most m²
    (both per row; × L0·Linf)."""
    assert spec.bounds is not None
    lo, hi = spec.bounds
    # the middle snapped to the grid, so values on the grid stay on it once centred (a
    # centre half a step off would round every value by half a step, biasing the variance)
    centre = round((lo + hi) / 2.0 / spec.resolution) * spec.resolution
    if not lo <= centre <= hi:
        centre = lo
    units = _fixed_point(lo - centre, hi - centre, spec.resolution)
    m = max(abs(units[0]), abs(units[1]))
    if m == 0:
        raise ConfigError(
            f"{spec.name}: bounds {spec.bounds} round to 0 at resolution {spec.resolution}; "
            "use a finer resolution"
        )
    if m * m > MAX_FIXED_POINT:
        raise ConfigError(
            f"{spec.name}.resolution: a squared value of bounds {list(spec.bounds)} at "
            f"resolution {spec.resolution:g} is more than 2^53 steps; raise resolution to at "
            f"least {(hi - lo) / 2 / 2**26:.3g} or narrow bounds"
        )
    third = eps / 3
    l0, linf = spec.l0, spec.linf
    c1, c2 = sensitivities(l0, linf)
    s1, s2 = sensitivities(l0, linf, clamp=(float(-m), float(m)))
    q1, q2 = sensitivities(l0, linf, clamp=(0.0, float(m * m)))
    count = _noise(spec, third, gauss_delta, c1, c2)
    total = _noise(spec, third, gauss_delta, s1, s2)
    squares = _noise(spec, eps - 2 * third, gauss_delta, q1, q2)
    return count, total, squares, units, m * m, centre


def _coarser(bounds: tuple[float, float]) -> float:
    """A resolution that brings max(|lo|, |hi|) within 2^53 steps (a power of ten)."""
    top = max(abs(bounds[0]), abs(bounds[1]))
    return float(10 ** math.ceil(math.log10(top / MAX_FIXED_POINT)))


def _dry_run_selection(spec: DPReleaseSpec, eps: Fraction, delta: Fraction) -> None:
    """The partition-selection arithmetic once at plan time, so it cannot fail after the
    charge (its probabilities depend on the counts, its formulas only on ε, δ, L0)."""
    import numpy as np

    from privpipe.dp.partition_selection import keep_probability

    try:
        probs = keep_probability(
            np.array([0, 1, 2, 10, 10**6, 10**12], dtype=np.int64),
            float(eps), float(delta), spec.l0, spec.selection,  # type: ignore[arg-type]
        )  # fmt: skip
        ok = bool(np.all(np.isfinite(probs)))
    except (ArithmeticError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"{spec.name}.epsilon: partition selection has no usable threshold at epsilon "
            f"{float(eps):g} (delta {float(delta):g}); choose a moderate epsilon"
        )


def accountant(spec: DPReleaseSpec, plans: Sequence[QueryPlan]) -> Accountant:
    """The accountant over every step of every query, at the release's δ."""
    steps = [s for p in plans for s in p.steps]
    return Accountant(steps, delta=spec.delta)


def guarantee(spec: DPReleaseSpec, plans: Sequence[QueryPlan]) -> dict[str, Any]:
    """release.json's ``guarantee``: (ε, δ) as configured, how it composes, the accounting."""
    report = accountant(spec, plans).report()
    chosen = report["chosen"]
    # a group of g persons (e.g. a household) is protected at g·ε (Dwork & Roth, Thm 2.2)
    report["group_privacy"] = {
        str(g): dict(
            zip(
                ("epsilon", "delta"),
                group_privacy(chosen["epsilon"], chosen["delta"], g),
                strict=True,
            )
        )
        for g in GROUP_SIZES
    }
    return {
        "epsilon": float(spec.epsilon),
        "delta": float(spec.delta),
        "composition": "parallel" if spec.partition_by else "sequential",
        "unit": spec.unit or "row",
        "mechanism": spec.mechanism
        if spec.kind not in TOP_KINDS + QUANTILE_KINDS
        else "exponential",
        "max_partitions": spec.l0,
        "max_contributions_per_partition": spec.linf,
        "accounting": report,
    }


def charge(spec: DPReleaseSpec, plans: Sequence[QueryPlan]) -> tuple[Fraction, Fraction]:
    """What the ledger records: the configured (ε, δ), or the accountant's tighter bound.

    The accountant's float ε is rounded up to 1e-12 so the charge is never below it.
    """
    chosen = accountant(spec, plans).chosen()
    eps = spec.epsilon
    if chosen.epsilon is not None and chosen.epsilon < float(spec.epsilon) * (1 - 1e-9):
        eps = Fraction(math.ceil(chosen.epsilon * 10**12), 10**12)
    return eps, spec.delta


def from_config_values(
    *,
    name: str,
    kind: str,
    epsilon: float,
    delta: float,
    queries: Sequence[Query],
    domains: Mapping[tuple[str, int], Sequence[str]],
    **rest: Any,
) -> DPReleaseSpec:
    """A spec from plain config numbers (exact Fractions from their decimal text)."""
    return DPReleaseSpec(
        name=name,
        kind=kind,
        epsilon=to_fraction(epsilon, "epsilon"),
        delta=to_fraction(delta, "delta"),
        queries=tuple(queries),
        domains=tuple((k, tuple(v)) for k, v in sorted(domains.items())),
        **rest,
    )
