"""Per-cell aggregates of bounded rows, their noisy release, and post-processing.

Pipeline: :func:`dp.bounding.bound_contributions` → :func:`count_cells` / :func:`sum_cells`
→ (public partitions) :func:`complete_domain` → :func:`noisy_counts` / :func:`noisy_sums`
→ post-processing (:func:`clamp_nonnegative`, :func:`round_cells`, :func:`make_consistent`).

Noise is integer only (DESIGN.md "Secure by construction"): one call to a
:class:`dp.noise.NoiseSampler` per batch of cells. Sums are released in *fixed point*: each
value is clamped to [lo, hi] and rounded to an integer number of ``resolution`` steps, the
integer unit sums get integer noise, and only then are they multiplied by ``resolution``
(post-processing of an exact integer release, so no floating-point leak). Every released
cell carries a (1−β) interval [ci_low, ci_high] read off the noise distribution.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.dp import exact
from privpipe.dp.accounting import DiscreteGaussian, DiscreteLaplace
from privpipe.dp.bounding import sensitivities
from privpipe.dp.budget import to_fraction
from privpipe.dp.noise import (
    IntArray,
    NoiseSampler,
    gaussian_ci_halfwidth,
    gaussian_sigma_for_rho,
    laplace_ci_halfwidth,
    laplace_scale,
)
from privpipe.errors import ConfigError, InputDataError

MechanismName = Literal["discrete_laplace", "discrete_gaussian"]
MECHANISMS: tuple[str, ...] = ("discrete_laplace", "discrete_gaussian")
Exact = npt.NDArray[np.generic]  # int64, or object Python ints where int64 cannot hold them


# --------------------------------------------------------------------------- noise spec


@dataclass(frozen=True)
class NoiseSpec:
    """The noise for one query: mechanism, scale (b or σ, in integer query units), CI width.

    ``accounting()`` gives the :mod:`dp.accounting` mechanism with the exact scale used.
    """

    mechanism: MechanismName
    scale: float
    sensitivity: float
    halfwidth: int
    beta: float

    def accounting(self) -> DiscreteLaplace | DiscreteGaussian:
        """The mechanism to record in the accountant (scale as actually sampled)."""
        scale = Fraction(repr(self.scale))
        sens = Fraction(repr(self.sensitivity))
        if self.mechanism == "discrete_laplace":
            return DiscreteLaplace.of(scale, sens)
        return DiscreteGaussian.of(scale, sens)

    def add_noise(self, values: npt.NDArray[np.generic], sampler: NoiseSampler) -> Exact:
        """values + noise, one sampler call for the whole batch.

        int64 cells go to the sampler as they are. Exact cells beyond int64 (Python ints)
        are split as v = q·2^62 + r with r in [0, 2^62): the sampler noises r and q·2^62 is
        added back exactly, so the result is v + noise (the sampler's int64 saturation is
        reached only if the noise exceeds 2^62, impossible at the scales the planner allows).
        """
        cells = exact.as_exact(values)
        if cells.dtype != object:
            return self._sample(cells.astype(np.int64), sampler)
        ints = [int(v) for v in cells.tolist()]
        low = np.array([v % exact.SAFE for v in ints], dtype=np.int64)
        noisy_low = self._sample(low, sampler).tolist()
        out = np.empty(len(ints), dtype=object)
        out[:] = [v - r + int(n) for v, r, n in zip(ints, low.tolist(), noisy_low, strict=True)]
        return exact.as_exact(out)

    def _sample(self, cells: IntArray, sampler: NoiseSampler) -> IntArray:
        if self.mechanism == "discrete_laplace":
            return sampler.discrete_laplace(cells, self.scale)
        return sampler.discrete_gaussian(cells, self.scale)


def noise_spec(
    mechanism: str,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    l1: float | None = None,
    l2: float | None = None,
    beta: float = 0.05,
) -> NoiseSpec:
    """Scale and CI half-width: discrete Laplace b = L1/ε, or discrete Gaussian σ = L2/√(2ρ)."""
    if mechanism == "discrete_laplace":
        if epsilon is None or l1 is None:
            raise ConfigError("discrete_laplace needs epsilon and an L1 sensitivity")
        b = laplace_scale(l1, epsilon)
        return NoiseSpec("discrete_laplace", b, float(l1), laplace_ci_halfwidth(b, beta), beta)
    if mechanism == "discrete_gaussian":
        if rho is None or l2 is None:
            raise ConfigError("discrete_gaussian needs rho and an L2 sensitivity")
        s = gaussian_sigma_for_rho(l2, rho)
        return NoiseSpec("discrete_gaussian", s, float(l2), gaussian_ci_halfwidth(s, beta), beta)
    raise ConfigError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")


# --------------------------------------------------------------------------- true cells


def count_cells(rows: pd.DataFrame, partition_cols: Sequence[str]) -> pd.DataFrame:
    """Group columns + ``count`` (int64) of bounded rows; missing keys form their own cell."""
    cols = list(partition_cols)
    if not cols:
        return pd.DataFrame({"count": np.array([len(rows)], dtype=np.int64)})
    out = rows.groupby(cols, dropna=False, observed=True, sort=True).size()
    return out.rename("count").astype(np.int64).reset_index()


def _fixed_point(lo: float, hi: float, resolution: float) -> tuple[int, int]:
    """Clamp bounds in integer steps of ``resolution``: [⌈lo/r⌉, ⌊hi/r⌋], inside [lo, hi]."""
    r = float(resolution)
    if not math.isfinite(r) or r <= 0.0:
        raise ConfigError(f"resolution must be a finite number > 0, got {resolution!r}")
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ConfigError(f"clamp bounds must be finite with lo <= hi, got [{lo}, {hi}]")
    lo_u, hi_u = math.ceil(lo / r - 1e-9), math.floor(hi / r + 1e-9)
    if lo_u > hi_u:
        raise ConfigError(f"no multiple of resolution {r} lies in [{lo}, {hi}]")
    return lo_u, hi_u


def sum_cells(
    rows: pd.DataFrame,
    partition_cols: Sequence[str],
    value_col: str,
    lo: float,
    hi: float,
    resolution: float = 1.0,
    *,
    centre: float = 0.0,
) -> pd.DataFrame:
    """Group columns + ``sum_units``: Σ round(clamp(v − centre, lo, hi) / resolution), exact
    (int64 when it provably fits, else Python ints: :mod:`dp.exact`).

    Each row contributes an integer in [⌈lo/r⌉, ⌊hi/r⌋] steps, so max(|lo|, |hi|)/r bounds
    one row's effect. Missing or non-numeric values are refused (InputDataError).
    """
    lo_u, hi_u = _fixed_point(lo, hi, resolution)
    if value_col not in rows:
        raise InputDataError(f"sum: column {value_col!r} not in the data")
    values = pd.to_numeric(rows[value_col], errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise InputDataError(f"sum: column {value_col!r} has missing or non-numeric values")
    units = np.clip(np.rint((values - centre) / resolution), lo_u, hi_u).astype(np.int64)
    cols = list(partition_cols)
    if not cols:
        return pd.DataFrame({"sum_units": exact.as_exact([exact.total(units)])})
    codes = rows.groupby(cols, dropna=False, observed=True, sort=True).ngroup().to_numpy()
    sums = exact.group_sum(codes, units).sort_index()
    keys = rows[cols].groupby(codes, sort=True).first().loc[sums.index]
    out = keys.reset_index(drop=True)
    out["sum_units"] = exact.as_exact(sums.to_numpy())
    return out


def complete_domain(
    cells: pd.DataFrame, domain: pd.DataFrame, value_cols: Sequence[str] = ("count",)
) -> pd.DataFrame:
    """Cells over exactly the public ``domain``: absent keys get 0, keys outside are dropped.

    With public partitions every domain key is released (with noise) whether or not it
    occurs, and a key outside the domain is never released (that would reveal presence).
    """
    keys = list(domain.columns)
    missing = [c for c in [*keys, *value_cols] if c not in cells]
    if missing:
        raise ConfigError(f"complete_domain: cells lack columns {missing}")
    dom = domain.drop_duplicates(ignore_index=True)
    exact_cells = cells[[*keys, *value_cols]].astype(dict.fromkeys(value_cols, object))
    out = dom.merge(exact_cells, how="left", on=keys, validate="one_to_one")  # no float trip
    for col in value_cols:
        filled = out[col].astype(object).where(out[col].notna(), 0)
        out[col] = exact.as_exact(filled.to_numpy())
    return out


# --------------------------------------------------------------------------- releases


def _int_column(cells: pd.DataFrame, col: str) -> Exact:
    """The integer column ``col``, exact (int64, or Python ints beyond int64); refuses
    floats and missing values."""
    if col not in cells:
        raise ConfigError(f"cells lack the column {col!r}")
    series = cells[col]
    ints = pd.api.types.is_integer_dtype(series.dtype) or (
        series.dtype == object and all(isinstance(v, int | np.integer) for v in series.tolist())
    )
    if series.isna().any() or not ints or isinstance(series.dtype, pd.BooleanDtype):
        raise ConfigError(f"column {col!r} must hold integers without missing values")
    return exact.as_exact(series.to_numpy())


def _shifted(values: Exact, by: int) -> Exact:
    """values + by, exactly (int64 when it provably fits, else Python ints)."""
    if values.dtype != object and exact.fits(exact.max_abs(values) + abs(by)):
        shifted: Exact = values.astype(np.int64) + np.int64(by)
        return shifted
    out = np.empty(values.size, dtype=object)
    out[:] = [int(v) + by for v in values.tolist()]
    return exact.as_exact(out)


def release_cells(
    cells: pd.DataFrame,
    col: str,
    spec: NoiseSpec,
    sampler: NoiseSampler,
    *,
    unit: float | None = None,
    out_col: str | None = None,
) -> pd.DataFrame:
    """``cells`` with the integer ``col`` noised by ``spec`` (one sampler call) and its
    (1−β) interval ``ci_low``/``ci_high``. With ``unit`` (fixed point), ``col`` keeps the
    noisy integer units and ``out_col`` = units × ``unit`` is the released value."""
    noisy = spec.add_noise(_int_column(cells, col), sampler)
    out = cells.copy()
    out[col] = noisy
    scale = 1.0 if unit is None else float(unit)
    if out_col is not None:
        out[out_col] = exact.to_float(noisy) * scale
    hw = int(spec.halfwidth)
    low, high = _shifted(noisy, -hw), _shifted(noisy, hw)
    if unit is None and low.dtype != object and high.dtype != object:
        out["ci_low"], out["ci_high"] = low, high
    else:  # a rescaled value, or an integer interval beyond int64: floats
        out["ci_low"] = exact.to_float(low) * scale
        out["ci_high"] = exact.to_float(high) * scale
    return out


def noisy_counts(
    cells: pd.DataFrame,
    mechanism: str,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    l1: float | None = None,
    l2: float | None = None,
    sampler: NoiseSampler,
    beta: float = 0.05,
    count_col: str = "count",
) -> pd.DataFrame:
    """``cells`` with ``count`` replaced by its noisy value and a (1−β) ``ci_low``/``ci_high``.

    Discrete Laplace (ε, L1) or discrete Gaussian (ρ, L2); one sampler call for all cells.
    """
    spec = noise_spec(mechanism, epsilon=epsilon, rho=rho, l1=l1, l2=l2, beta=beta)
    return release_cells(cells, count_col, spec, sampler)


def noisy_sums(
    cells: pd.DataFrame,
    mechanism: str,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    l1: float | None = None,
    l2: float | None = None,
    resolution: float = 1.0,
    sampler: NoiseSampler,
    beta: float = 0.05,
) -> pd.DataFrame:
    """Noisy fixed-point sums from :func:`sum_cells` output.

    ``l1``/``l2`` are in value units (from ``sensitivities(l0, linf, clamp=(lo, hi))``); the
    noise is added to the integer ``sum_units`` with scale computed on L/resolution. Adds
    ``sum`` = noisy units × resolution and its ``ci_low``/``ci_high`` (same units).
    """
    r = float(resolution)
    if not math.isfinite(r) or r <= 0.0:
        raise ConfigError(f"resolution must be a finite number > 0, got {resolution!r}")
    spec = noise_spec(
        mechanism,
        epsilon=epsilon,
        rho=rho,
        l1=None if l1 is None else l1 / r,
        l2=None if l2 is None else l2 / r,
        beta=beta,
    )
    return release_cells(cells, "sum_units", spec, sampler, unit=r, out_col="sum")


def noisy_means(
    rows: pd.DataFrame,
    partition_cols: Sequence[str],
    value_col: str,
    lo: float,
    hi: float,
    *,
    l0: int,
    linf: int,
    mechanism: str,
    epsilon: float | None = None,
    rho: float | None = None,
    sampler: NoiseSampler,
    resolution: float = 1.0,
    count_share: float = 0.5,
    domain: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Noisy mean per cell = centre + noisy centred sum / max(noisy count, 1), in [lo, hi].

    Budget split (sequential composition on the same units): the count gets
    ``count_share``·ε (or ·ρ), the sum the rest. Values are centred on (lo+hi)/2 so the sum's
    per-row bound is (hi−lo)/2 rather than max(|lo|, |hi|). Returns group columns, ``mean``
    (float), noisy ``count`` and noisy ``sum_units`` (centred); the mean is post-processing.
    With public ``domain`` every domain key is released. Rows must already be bounded.
    """
    if not 0.0 < count_share < 1.0:
        raise ConfigError(f"count_share must lie strictly between 0 and 1, got {count_share!r}")
    mid = (float(lo) + float(hi)) / 2.0
    half = (float(hi) - float(lo)) / 2.0
    cols = list(partition_cols)
    counts = count_cells(rows, cols)
    sums = sum_cells(rows, cols, value_col, -half, half, resolution, centre=mid)
    if domain is not None:
        counts = complete_domain(counts, domain, ("count",))
        sums = complete_domain(sums, domain, ("sum_units",))
    elif cols:
        sums = counts[cols].merge(sums, on=cols, how="left", validate="one_to_one")
    share = Fraction(repr(float(count_share)))
    eps_c = eps_s = rho_c = rho_s = None
    if epsilon is not None:
        e = to_fraction(epsilon, "epsilon")
        eps_c, eps_s = float(e * share), float(e * (1 - share))
    if rho is not None:
        p = to_fraction(rho, "rho")
        rho_c, rho_s = float(p * share), float(p * (1 - share))
    c1, c2 = sensitivities(l0, linf)
    s1, s2 = sensitivities(l0, linf, clamp=(-half, half)) if half > 0 else (c1, c2)
    nc = noisy_counts(counts, mechanism, epsilon=eps_c, rho=rho_c, l1=c1, l2=c2, sampler=sampler)
    ns = noisy_sums(
        sums, mechanism, epsilon=eps_s, rho=rho_s, l1=s1, l2=s2, resolution=resolution,
        sampler=sampler,
    )  # fmt: skip
    count = nc["count"].to_numpy(dtype=np.int64)
    total = ns["sum"].to_numpy(dtype=np.float64)
    mean = np.clip(mid + total / np.maximum(count, 1), lo, hi)
    out = nc[cols].copy() if cols else pd.DataFrame(index=range(1))
    out["mean"] = mean
    out["count"] = count
    out["sum_units"] = exact.as_exact(ns["sum_units"].to_numpy())
    return out


# --------------------------------------------------------------------------- post-processing


def clamp_nonnegative(
    frame: pd.DataFrame, cols: Sequence[str] = ("count", "ci_low", "ci_high")
) -> pd.DataFrame:
    """Negative values in ``cols`` (those present) set to 0: counts cannot be negative.

    Post-processing, so free; the interval [max(lo, 0), max(hi, 0)] still covers a true
    non-negative count whenever the original did.
    """
    out = frame.copy()
    for col in cols:
        if col in out:
            out[col] = out[col].clip(lower=0)
    return out


def round_cells(frame: pd.DataFrame, cols: Sequence[str], decimals: int = 0) -> pd.DataFrame:
    """Float columns in ``cols`` rounded to ``decimals`` (to int64 at 0); ints untouched."""
    out = frame.copy()
    for col in cols:
        if pd.api.types.is_float_dtype(out[col].dtype):
            rounded = out[col].round(decimals)
            out[col] = rounded.astype(np.int64) if decimals == 0 else rounded
    return out


def make_consistent(
    fine: pd.DataFrame,
    coarse_map: Mapping[Hashable, Hashable] | pd.Series,
    coarse: pd.Series,
    *,
    key: str,
    value_col: str = "count",
    fine_variance: float = 1.0,
    coarse_variance: float | None = None,
    integer: bool = True,
) -> pd.DataFrame:
    """Fine cells adjusted so each coarse group sums to a consistent total (least squares).

    ``coarse_map`` maps the fine ``key`` to its coarse key; ``coarse`` holds the released
    coarse totals indexed by coarse key. The target total T of a group of n fine cells with
    sum S and coarse value C is C if ``coarse_variance`` is None (coarse taken as exact),
    else the inverse-variance combination (S/(n·vf) + C/vc) / (1/(n·vf) + 1/vc) (Hay et al.
    2010, two levels). The least-squares fine values are x_i + (T − S)/n. With ``integer``
    they are rounded by largest remainder so the group sums equal round(T) exactly. A fine
    cell whose coarse key has no coarse total is left as is. ``ci_low``/``ci_high`` are
    dropped: they describe the unadjusted values. Post-processing only (no budget).
    """
    if key not in fine or value_col not in fine:
        raise ConfigError(f"make_consistent: fine cells need columns {key!r} and {value_col!r}")
    group = fine[key].map(coarse_map)
    x = fine[value_col].to_numpy(dtype=np.float64)
    g = pd.Series(x, index=fine.index).groupby(group, dropna=True)
    s = group.map(g.sum()).to_numpy(dtype=np.float64)
    n = group.map(g.size()).to_numpy(dtype=np.float64)
    c = group.map(coarse).to_numpy(dtype=np.float64)
    has = np.isfinite(c) & np.isfinite(s)
    if coarse_variance is None:
        target = c
    else:
        w_f = 1.0 / (n * float(fine_variance))
        w_c = 1.0 / float(coarse_variance)
        target = (s * w_f + c * w_c) / (w_f + w_c)
    adjusted = np.where(has, x + (target - s) / np.where(has, n, 1.0), x)
    out = fine.drop(columns=[c_ for c_ in ("ci_low", "ci_high") if c_ in fine])
    if not integer:
        out[value_col] = adjusted
        return out
    floor = np.floor(adjusted)
    frac = adjusted - floor
    grp_codes = pd.factorize(group.where(has), use_na_sentinel=True)[0]
    frame = pd.DataFrame({"g": grp_codes, "frac": frac, "floor": floor, "t": np.rint(target)})
    inside = frame["g"] >= 0
    short = frame["t"] - frame.groupby("g")["floor"].transform("sum")  # units left to hand out
    rank = frame.groupby("g")["frac"].rank(method="first", ascending=False) - 1
    extra = np.where(inside & (rank < short), 1.0, 0.0)
    result = np.where(inside, floor + extra, np.rint(adjusted))
    out[value_col] = result.astype(np.int64)
    return out
