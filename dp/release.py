"""A central-DP release from bounded per-cell aggregates: partitions, noise, check, document.

:func:`release_query` turns one query's merged :class:`~dp.cells.CellPartial` into the
published table — public partitions complete the domain (every cell released, empty ones
with noise too), private ones are selected with (ε, δ) on the distinct-person counts —
then adds integer noise from the :class:`~dp.noise.NoiseSampler` (one call per query),
post-processes (clamp at 0) and attaches a confidence interval to every cell.
:func:`verify_release` re-checks the guarantee on what will be published, by code separate
from the planning: the accountant recomputed from the recorded scales, the bounds recounted
on the kept rows, the published cells against the domain or the selected keys.

:func:`dp_release` is the whole release on a DataFrame, for notebooks; the Beam pipeline
runs the same steps (contributions per batch, bounding per shard of persons, merge), and a
test asserts both publish the same table.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from privpipe.dp import exact
from privpipe.dp.accounting import (
    Accountant,
    ApproxDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Parallel,
    Step,
)
from privpipe.dp.aggregate import NoiseSpec, clamp_nonnegative, make_consistent, release_cells
from privpipe.dp.bounding import RngLike
from privpipe.dp.cells import (
    CellPartial,
    Labeler,
    bound_and_aggregate,
    canonical_labels,
    concat,
    contributions,
    hash_keys,
    merge_dictionaries,
)
from privpipe.dp.exponential import exponential_mechanism, top_k
from privpipe.dp.noise import NoiseSampler, discrete_laplace_variance, honest_document
from privpipe.dp.partition_selection import select_partitions
from privpipe.dp.spec import (
    CENTRED_KINDS,
    COUNT_KINDS,
    DISTINCT_KINDS,
    MOMENT_KINDS,
    QUANTILE_KINDS,
    TOP_KINDS,
    DPReleaseSpec,
    QueryPlan,
    charge,
    guarantee,
    plan_queries,
)
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

MAX_PUBLIC_CELLS = 5_000_000


@dataclass(frozen=True)
class QueryRelease:
    """One query's published table and what the verifier needs to know about it."""

    name: str
    table: pd.DataFrame
    key_columns: tuple[str, ...]
    observed_cells: int
    selected_cells: int
    partial: CellPartial
    consistent_with: str | None = None  # the coarser query this one was adjusted to


# labels of a column at one level -> its labels at a coarser level
Coarsen = Callable[[str, int, int, np.ndarray], np.ndarray]


def _joined(frame: pd.DataFrame, cols: Sequence[str]) -> pd.Series:
    """One string key per row of several label columns (unit separator between labels)."""
    if not cols:
        return pd.Series("", index=frame.index)
    key = frame[cols[0]].astype(str)
    for c in cols[1:]:
        key = key + "\x1f" + frame[c].astype(str)
    return key


def post_process(
    spec: DPReleaseSpec,
    plans: Sequence[QueryPlan],
    releases: Sequence[QueryRelease],
    coarsen: Coarsen | None = None,
) -> list[QueryRelease]:
    """``consistent``: each count query with a coarser query over the same columns is made
    consistent with it (Hay et al. 2010, two levels): per coarse cell the total becomes the
    inverse-variance combination T of the coarse count and the sum of its fine cells, the
    fine cells move by the least-squares shift (:func:`dp.aggregate.make_consistent`,
    integers by largest remainder) and the coarse cell becomes their sum. Intervals of
    adjusted cells are dropped. Then counts are clamped at 0. Post-processing: free."""
    if not spec.consistent:
        return list(releases)
    current = {r.name: r for r in releases}
    plan_of = {p.query.name: p for p in plans}
    links: list[tuple[str, str, np.ndarray, pd.Series]] = []  # fine, coarse, parent keys
    for p in plans:
        coarse_q = spec.ancestor(p.query)
        if coarse_q is None:
            continue
        if coarsen is None:
            raise ConfigError(f"{spec.name}.consistent: needs the hierarchies of the columns")
        r, coarse = current[p.query.name], current[coarse_q.name]
        fine = r.table.copy()
        lifted = fine.copy()
        for col in p.query.group_by:
            lo, hi = p.query.level(col), coarse_q.level(col)
            if hi > lo:
                lifted[col] = coarsen(col, lo, hi, fine[col].to_numpy(dtype=object))
        keys = [*spec.partition_by, *p.query.group_by]
        coarse_keys = [*spec.partition_by, *coarse_q.group_by]
        fine["_fine"] = _joined(fine, keys)
        parent = _joined(lifted, keys)
        coarse_key = _joined(coarse.table, coarse_keys)
        totals = pd.Series(coarse.table["count"].to_numpy(), index=coarse_key.to_numpy())
        var_f, var_c = plan_of[p.query.name].count_noise, plan_of[coarse_q.name].count_noise
        assert var_f is not None and var_c is not None
        adjusted = make_consistent(
            fine, dict(zip(fine["_fine"], parent, strict=True)), totals, key="_fine",
            fine_variance=noise_variance(var_f), coarse_variance=noise_variance(var_c),
        ).drop(columns="_fine")  # fmt: skip
        new_totals = adjusted["count"].groupby(parent.to_numpy()).sum()
        coarse_table = coarse.table.drop(columns=["ci_low", "ci_high"], errors="ignore")
        hit = coarse_key.isin(new_totals.index).to_numpy()
        counts = coarse_table["count"].to_numpy().copy()
        counts[hit] = new_totals.reindex(coarse_key[hit].to_numpy()).to_numpy()
        coarse_table["count"] = counts
        current[p.query.name] = dataclasses.replace(
            r, table=adjusted, consistent_with=coarse_q.name
        )
        links.append((p.query.name, coarse_q.name, parent.to_numpy(), coarse_key))
        current[coarse_q.name] = dataclasses.replace(
            coarse, table=coarse_table, consistent_with=coarse.consistent_with or p.query.name
        )
    if spec.clamp:  # clamp the fine cells, then let each coarse cell be their sum again
        current = {
            n: dataclasses.replace(r, table=clamp_nonnegative(r.table)) for n, r in current.items()
        }
        for fine_name, coarse_name, parent, coarse_key in links:
            sums = current[fine_name].table["count"].groupby(parent).sum()
            table = current[coarse_name].table.copy()
            hit = coarse_key.isin(sums.index).to_numpy()
            counts = table["count"].to_numpy().copy()
            counts[hit] = sums.reindex(coarse_key[hit].to_numpy()).to_numpy()
            table["count"] = counts
            current[coarse_name] = dataclasses.replace(current[coarse_name], table=table)
    return [current[r.name] for r in releases]


def noise_variance(noise: NoiseSpec) -> float:
    """Variance of the noise added to each cell."""
    if noise.mechanism == "discrete_laplace":
        return discrete_laplace_variance(noise.scale)
    return float(noise.scale) ** 2  # the discrete Gaussian's variance is at most sigma^2


def public_domain(spec: DPReleaseSpec, plan: QueryPlan, columns: Sequence[str]) -> pd.DataFrame:
    """The cartesian product of the public domains of ``columns`` (object strings)."""
    domains = []
    for col in columns:
        labels = spec.domain(col, plan.query.level(col))
        if labels is None:
            raise ConfigError(
                f"{spec.name}: column {col!r} has no public domain at level "
                f"{plan.query.level(col)}; give one or use private partitions"
            )
        domains.append(list(dict.fromkeys(labels)))
    size = math.prod(len(d) for d in domains)
    if size > MAX_PUBLIC_CELLS:
        raise ConfigError(
            f"{spec.name}: the public domain of {', '.join(columns)} has {size:,} cells "
            f"(more than {MAX_PUBLIC_CELLS:,}); group at a coarser level or use private "
            "partitions"
        )
    rows = list(itertools.product(*domains)) if columns else [()]
    return pd.DataFrame(rows, columns=list(columns), dtype=object)


def _with_labels(
    partial: CellPartial, dictionary: pd.DataFrame, cols: Sequence[str]
) -> pd.DataFrame:
    """The partial's cells with their label columns (cells without a label are dropped)."""
    cells = partial.cells.rename_axis("_cell").reset_index()
    if not cols:
        return cells.assign(_cell=np.uint64(0))
    return cells.merge(dictionary, on="_cell", how="inner", validate="one_to_one")


def release_query(
    partial: CellPartial,
    dictionary: pd.DataFrame,
    spec: DPReleaseSpec,
    plan: QueryPlan,
    sampler: NoiseSampler,
) -> QueryRelease:
    """The published table of one query (cells sorted by their labels)."""
    cols = list(spec.key_columns(plan.query))
    observed = _with_labels(partial, dictionary, cols)
    if cols:  # a fixed order, so a seeded run draws the same noise for the same cell
        observed = observed.sort_values(cols, kind="stable", ignore_index=True)
    if spec.kind in TOP_KINDS:
        return _release_top(observed, spec, plan, sampler, partial)
    if spec.partitions == "public":
        domain = public_domain(spec, plan, cols)
        domain["_cell"] = hash_keys(domain[cols]) if cols else np.uint64(0)
        sum_cols = ["sum_units", *(["sumsq_units"] if "sumsq_units" in observed else [])]
        seen = observed[["_cell", "count", "units", *sum_cols]].astype(
            dict.fromkeys(sum_cols, object)
        )
        cells = domain.merge(seen, on="_cell", how="left")  # object: no float round trip
        for c in ("count", "units"):
            cells[c] = cells[c].fillna(0).astype(np.int64)
        for c in sum_cols:
            sums = cells[c].astype(object).where(cells[c].notna(), 0)
            cells[c] = exact.as_exact(sums.to_numpy())
        selected = len(cells)
    else:
        assert plan.selection_epsilon is not None and plan.selection_delta is not None
        keep = select_partitions(
            observed["units"].to_numpy(dtype=np.int64),
            float(plan.selection_epsilon),
            float(plan.selection_delta),
            spec.l0,
            spec.selection,  # type: ignore[arg-type]
            sampler,
        )
        cells = observed.loc[keep].reset_index(drop=True)
        selected = int(keep.sum())
    cells = cells.sort_values(cols, kind="stable").reset_index(drop=True) if cols else cells
    out = cells[cols].copy() if cols else pd.DataFrame(index=range(len(cells)))
    if spec.kind in COUNT_KINDS:
        assert plan.count_noise is not None
        noisy = release_cells(cells[["count"]], "count", plan.count_noise, sampler)
        out[["count", "ci_low", "ci_high"]] = noisy[["count", "ci_low", "ci_high"]].to_numpy()
        if spec.clamp and not spec.consistent:  # else clamped after the adjustment
            out = clamp_nonnegative(out)
    elif spec.kind in DISTINCT_KINDS:  # distinct persons: the noisy count of units
        assert plan.count_noise is not None
        noisy = release_cells(cells[["units"]], "units", plan.count_noise, sampler)
        out[["count", "ci_low", "ci_high"]] = noisy[["units", "ci_low", "ci_high"]].to_numpy()
        if spec.clamp:
            out = clamp_nonnegative(out)
    elif spec.kind in MOMENT_KINDS:
        out = _release_moments(cells, out, spec, plan, sampler)
    elif spec.kind in QUANTILE_KINDS:
        out = _release_quantiles(cells, out, partial, spec, plan, sampler)
    elif spec.kind == "dp_sum":
        assert plan.sum_noise is not None
        r = spec.resolution
        noisy = release_cells(
            cells[["sum_units"]], "sum_units", plan.sum_noise, sampler, unit=r, out_col="sum"
        )
        out[["sum", "ci_low", "ci_high"]] = noisy[["sum", "ci_low", "ci_high"]].to_numpy()
    else:  # dp_mean: centre + noisy centred sum / max(noisy count, 1), clipped to bounds
        assert plan.count_noise is not None and plan.sum_noise is not None
        assert spec.bounds is not None
        count = release_cells(cells[["count"]], "count", plan.count_noise, sampler)["count"]
        total = release_cells(
            cells[["sum_units"]], "sum_units", plan.sum_noise, sampler,
            unit=spec.resolution, out_col="sum",
        )["sum"].to_numpy()  # fmt: skip
        count_arr = count.to_numpy(dtype=np.int64)
        lo, hi = spec.bounds
        out["mean"] = np.clip(plan.centre + total / np.maximum(count_arr, 1), lo, hi)
        out["count"] = np.maximum(count_arr, 0) if spec.clamp else count_arr
    if spec.decimals is not None and spec.kind in ("dp_sum", "dp_mean", *MOMENT_KINDS):
        for c in ("sum", "mean", "variance", "stddev", "ci_low", "ci_high"):
            if c in out:
                out[c] = out[c].round(spec.decimals)
    return QueryRelease(plan.query.name, out, tuple(cols), len(observed), selected, partial)


def quantile_columns(spec: DPReleaseSpec) -> list[str]:
    """data.csv's columns of a quantile release: ``median``, or ``q<quantile>`` each."""
    if spec.kind == "dp_median":
        return ["median"]
    return [f"q{float(q):g}" for q in spec.quantiles]


def quantile_utilities(histogram: np.ndarray, quantile: Fraction) -> np.ndarray:
    """Integer utility of every grid candidate c for quantile α = a/d of the rows binned on
    the grid: u(c) = −|(d − a)·#{x < c} − a·#{x > c}|, 0 at an exact α-quantile. One row
    moves it by at most max(a, d − a): see :func:`quantile_sensitivity`."""
    h = np.asarray(histogram, dtype=np.int64)
    a, d = quantile.numerator, quantile.denominator
    below = np.cumsum(h) - h
    above = int(h.sum()) - below - h
    return -np.abs((d - a) * below - a * above)


def quantile_sensitivity(spec: DPReleaseSpec, quantile: Fraction) -> int:
    """Δu of :func:`quantile_utilities` for one person: Linf rows, each max(a, d − a)."""
    a, d = quantile.numerator, quantile.denominator
    return spec.linf * max(a, d - a)


HISTOGRAM_CHUNK = 1 << 24  # cells × candidates held at once while scoring quantiles


def histogram_chunks(
    partial: CellPartial, cells: pd.Series, size: int
) -> Iterator[tuple[int, np.ndarray]]:
    """The grid histograms of ``cells`` (in order; zeros where unseen), as (first row,
    dense block) with at most :data:`HISTOGRAM_CHUNK` entries per block."""
    step = max(1, HISTOGRAM_CHUNK // max(size, 1))
    rows = np.zeros(0, dtype=np.int64)
    bins = counts = rows
    if partial.bins is not None and len(partial.bins) and len(cells):
        row_of = pd.Series(np.arange(len(cells)), index=cells.to_numpy(dtype=np.uint64))
        frame = partial.bins.rename("n").reset_index()
        frame.columns = ["cell", "bin", "n"]
        found = row_of.reindex(frame["cell"].to_numpy(dtype=np.uint64)).to_numpy()
        hit = ~np.isnan(found)
        order = np.argsort(found[hit], kind="stable")
        rows = found[hit].astype(np.int64)[order]
        bins = frame["bin"].to_numpy(dtype=np.int64)[hit][order]
        counts = frame["n"].to_numpy(dtype=np.int64)[hit][order]
    for start in range(0, len(cells), step):
        stop = min(start + step, len(cells))
        a, b = np.searchsorted(rows, [start, stop])
        block = np.zeros((stop - start, size), dtype=np.int64)
        np.add.at(block, (rows[a:b] - start, bins[a:b]), counts[a:b])
        yield start, block


def cell_histograms(partial: CellPartial, cells: pd.Series, size: int) -> np.ndarray:
    """The grid histogram of each of ``cells`` (rows: cells in order; zeros if unseen)."""
    blocks = [b for _, b in histogram_chunks(partial, cells, size)]
    return np.concatenate(blocks) if blocks else np.zeros((0, size), dtype=np.int64)


def _release_quantiles(
    cells: pd.DataFrame,
    out: pd.DataFrame,
    partial: CellPartial,
    spec: DPReleaseSpec,
    plan: QueryPlan,
    sampler: NoiseSampler,
) -> pd.DataFrame:
    """Each quantile of each cell by the exponential mechanism over the public grid
    lower + i·resolution (ε/(k·L0) each, see dp.spec), then sorted per cell so the released
    quantiles are monotone in the quantile (post-processing)."""
    assert spec.bounds is not None and plan.quantile_epsilon is not None
    lo = float(spec.bounds[0])
    order = sorted(range(len(spec.quantiles)), key=lambda i: spec.quantiles[i])
    picks = np.zeros((len(cells), len(spec.quantiles)), dtype=np.int64)
    eps = float(plan.quantile_epsilon)
    for start, block in histogram_chunks(partial, cells["_cell"], plan.grid):
        for offset, hist in enumerate(block):
            for i, q in enumerate(spec.quantiles):
                u = quantile_utilities(hist, q)
                sens = float(quantile_sensitivity(spec, q))
                picks[start + offset, i] = exponential_mechanism(u, eps, sens, sampler)
    values = np.sort(picks, axis=1)  # monotone: the i-th smallest pick to the i-th quantile
    names = quantile_columns(spec)
    for rank, i in enumerate(order):
        out[names[i]] = lo + values[:, rank].astype(np.float64) * spec.resolution
    if spec.decimals is not None:
        out[names] = out[names].round(spec.decimals)
    return out


def moment_interval(
    count: np.ndarray,
    total: np.ndarray,
    squares: np.ndarray,
    halfwidths: tuple[int, int, int],
    top: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of Q/N − (S/N)² over the box N ± t_N (N ≥ 1), S ± t_S, Q ± t_Q, clipped to
    [0, top]: each noisy part lies within its half-width with probability ≥ 1 − β/3, so the
    true (bounded) variance lies inside with probability ≥ 1 − β (union bound)."""
    tn, ts, tq = (float(t) for t in halfwidths)
    n_lo, n_hi = np.maximum(count - tn, 1.0), np.maximum(count + tn, 1.0)
    s_lo, s_hi = total - ts, total + ts
    q_lo, q_hi = np.maximum(squares - tq, 0.0), squares + tq
    s2_max = np.maximum(s_lo**2, s_hi**2)
    s2_min = np.where((s_lo <= 0) & (s_hi >= 0), 0.0, np.minimum(s_lo**2, s_hi**2))

    def f(q: np.ndarray, s2: np.ndarray, n: np.ndarray) -> np.ndarray:
        return np.asarray(q / n - s2 / (n * n), dtype=np.float64)

    # f(N) = Q/N − S²/N² has one interior maximum, at N* = 2S²/Q: the minimum over an
    # interval of N is at an end, the maximum at an end or at N* when it lies inside
    low = np.minimum(f(q_lo, s2_max, n_lo), f(q_lo, s2_max, n_hi))
    star = np.where(q_hi > 0, 2.0 * s2_min / np.maximum(q_hi, 1e-300), n_lo)
    star = np.clip(star, n_lo, n_hi)
    high = np.maximum.reduce([f(q_hi, s2_min, n_lo), f(q_hi, s2_min, n_hi), f(q_hi, s2_min, star)])
    return np.clip(low, 0.0, top), np.clip(high, 0.0, top)


def moment_estimate(
    spec: DPReleaseSpec,
    plan: QueryPlan,
    count: np.ndarray,
    total: np.ndarray,
    squares: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Post-processing of the noisy N, S, Q (fixed-point units, floats): the variance
    (Q/N − (S/N)²)·resolution², N ≥ 1, clipped to [0, m²·resolution²] (m²: the largest
    squared centred value, the largest variance possible), and its interval; for
    ``dp_stddev`` the square roots of the three."""
    assert plan.count_noise and plan.sum_noise and plan.sumsq_noise
    n = np.maximum(count, 1.0)
    top = float(plan.sumsq_bound)
    unit2 = float(spec.resolution) ** 2
    var = np.clip(squares / n - (total / n) ** 2, 0.0, top) * unit2
    halfwidths = (
        plan.count_noise.halfwidth,
        plan.sum_noise.halfwidth,
        plan.sumsq_noise.halfwidth,
    )
    low, high = moment_interval(count, total, squares, halfwidths, top)
    low, high = low * unit2, high * unit2
    if spec.kind == "dp_stddev":
        return np.sqrt(var), np.sqrt(low), np.sqrt(high)
    return var, low, high


def _release_moments(
    cells: pd.DataFrame,
    out: pd.DataFrame,
    spec: DPReleaseSpec,
    plan: QueryPlan,
    sampler: NoiseSampler,
) -> pd.DataFrame:
    """Variance (or standard deviation) from a noisy count N, centred sum S and sum of
    squares Q in fixed point (three integer noises): (Q/N − (S/N)²)·resolution², N ≥ 1,
    clipped to [0, (half the bounds' width)²]; the interval covers the three noises."""
    assert plan.count_noise and plan.sum_noise and plan.sumsq_noise
    parts = []
    for col, noise in (
        ("count", plan.count_noise),
        ("sum_units", plan.sum_noise),
        ("sumsq_units", plan.sumsq_noise),
    ):
        values = cells[col] if col in cells else pd.Series(0, index=cells.index)
        noisy = noise.add_noise(values.to_numpy(), sampler)
        parts.append(exact.to_float(noisy))
    count, total, squares = parts
    var, low, high = moment_estimate(spec, plan, count, total, squares)
    stat = "variance" if spec.kind == "dp_variance" else "stddev"
    out[stat] = var
    out["ci_low"], out["ci_high"] = low, high
    counts = count.astype(np.int64)
    out["count"] = np.maximum(counts, 0) if spec.clamp else counts
    return out


def _release_top(
    observed: pd.DataFrame,
    spec: DPReleaseSpec,
    plan: QueryPlan,
    sampler: NoiseSampler,
    partial: CellPartial,
) -> QueryRelease:
    """Top-k values per public group by the exponential mechanism on bounded counts."""
    assert spec.value is not None and plan.top_epsilon is not None
    cols = list(spec.key_columns(plan.query))
    groups = cols[:-1]
    candidates = public_domain(spec, plan, [spec.value])[spec.value].tolist()
    if spec.top_k > len(candidates):
        raise ConfigError(
            f"{spec.name}.k: {spec.top_k} is more than the {len(candidates)} candidate values "
            f"of {spec.value!r}"
        )
    domain = public_domain(spec, plan, groups)
    scores = observed.set_index(cols)["count"] if cols else observed["count"]
    rows: list[dict[str, Any]] = []
    for g in domain.itertuples(index=False, name=None):  # one selection per public group
        index = [(*g, v) for v in candidates] if groups else candidates
        u = scores.reindex(index, fill_value=0).to_numpy(dtype=np.int64)
        picks = top_k(u, spec.top_k, float(plan.top_epsilon), float(spec.linf), sampler)
        for rank, i in enumerate(picks.tolist(), start=1):
            rows.append(
                {**dict(zip(groups, g, strict=True)), "rank": rank, spec.value: candidates[i]}
            )
    table = pd.DataFrame(rows, columns=[*groups, "rank", spec.value])
    return QueryRelease(plan.query.name, table, tuple(cols), len(observed), len(domain), partial)


# --------------------------------------------------------------------------- verification


def _suggest(rows: int) -> float:
    return float(10 ** math.floor(math.log10(1 / rows) - 1))


def check_delta(spec: DPReleaseSpec, rows: int, units: int | None = None) -> None:
    """δ must be below 1/(number of units), else one person could be exposed outright.

    With ``spec.max_units`` (the public bound, against which δ was checked when the spec
    was made) the data may hold at most that many ``units``; the refusal names no figure.
    Without it (a notebook on a DataFrame), δ is checked against the data's ``rows``."""
    if spec.max_units is not None:
        if units is not None and units > spec.max_units:
            raise InputDataError(
                f"{spec.name}: more {'persons' if spec.unit else 'rows'} than "
                "schema.max_units declares; raise schema.max_units"
            )
        return
    if spec.delta > 0 and rows > 0 and spec.delta * rows >= 1:
        raise ConfigError(
            f"{spec.name}.delta: {float(spec.delta):g} is not below 1/rows = {1 / rows:.3g} "
            f"({rows:,} rows); choose a smaller delta, e.g. {_suggest(rows):g}"
        )


def _row_bound(spec: DPReleaseSpec, centre: Fraction | None = None) -> Fraction:
    """One row's largest |fixed-point value| from the config alone (exact Fractions): the
    clamp bounds, centred for means (variances: on ``centre``, the grid point the plan
    used), in resolution steps, rounded inward."""
    assert spec.bounds is not None
    lo, hi = (Fraction(repr(float(b))) for b in spec.bounds)
    if centre is None:
        centre = (lo + hi) / 2 if spec.kind in CENTRED_KINDS else Fraction(0)
    steps = max(abs(lo - centre), abs(hi - centre)) / Fraction(repr(float(spec.resolution)))
    return Fraction(math.floor(steps + Fraction(1, 10**9)))


def independent_sensitivity(
    spec: DPReleaseSpec,
    mechanism: str,
    value: bool,
    power: int = 1,
    centre: Fraction | None = None,
) -> float:
    """The verifier's own sensitivity (not the planner's function): a person changes at most
    L0 cells by at most Linf rows each (one person once for distinct counts), and each row
    moves a count by 1, a sum by the row bound m, a sum of squares (``power`` 2) by m²;
    L1 = L0·Linf·m, L2 = √L0·Linf·m."""
    m = _row_bound(spec, centre) ** power if value else Fraction(1)
    per_cell = (1 if spec.kind in DISTINCT_KINDS else spec.linf) * m
    if mechanism == "discrete_laplace":
        return float(spec.l0 * per_cell)
    return math.sqrt(spec.l0) * float(per_cell)


def _moment_centre(spec: DPReleaseSpec, plan: QueryPlan, problems: list[str]) -> Fraction:
    """The centre a variance's plan used: a multiple of the resolution within the bounds."""
    assert spec.bounds is not None
    lo, hi = (Fraction(repr(float(b))) for b in spec.bounds)
    centre = Fraction(repr(float(plan.centre)))
    steps = centre / Fraction(repr(float(spec.resolution)))
    if not lo <= centre <= hi or abs(steps - round(steps)) > Fraction(1, 10**6):
        problems.append(f"{plan.query.name}: values centred on {float(centre)}, off the grid")
    return centre


def _recorded_steps(
    spec: DPReleaseSpec, plans: Sequence[QueryPlan]
) -> tuple[list[Step], list[str]]:
    """The accountant's steps rebuilt from the recorded noise scales, with sensitivities
    derived again from the config (:func:`independent_sensitivity`), and any mismatch."""
    steps: list[Step] = []
    problems: list[str] = []
    for p in plans:
        mine: list[Step] = []
        if p.selection_epsilon is not None:
            mine.append(ApproxDP.of(p.selection_epsilon, p.selection_delta or 0))
        dims = 1 if not spec.key_columns(p.query) else None
        centre = _moment_centre(spec, p, problems) if spec.kind in MOMENT_KINDS else None
        bound = _row_bound(spec, centre) if spec.bounds is not None else Fraction(0)
        if spec.kind in QUANTILE_KINDS:  # grid indices 0 .. (upper − lower)/resolution
            assert spec.bounds is not None
            lo, hi = (Fraction(repr(float(b))) for b in spec.bounds)
            width = (hi - lo) / Fraction(repr(float(spec.resolution)))
            if p.sum_units != (0, math.floor(width + Fraction(1, 10**9))):
                problems.append(f"{p.query.name}: the grid is not the bounds' at resolution")
        elif p.sum_units is not None and max(abs(u) for u in p.sum_units) > bound:
            problems.append(
                f"{p.query.name}: rows are clamped to {list(p.sum_units)} steps, beyond the "
                f"bounds' {bound}"
            )
        if p.sumsq_noise is not None and p.sumsq_bound > bound**2:
            problems.append(f"{p.query.name}: squares bounded by {p.sumsq_bound} steps")
        for noise, value, power in (
            (p.count_noise, False, 1),
            (p.sum_noise, True, 1),
            (p.sumsq_noise, True, 2),
        ):
            if noise is None:
                continue
            sens = independent_sensitivity(spec, noise.mechanism, value, power, centre)
            if not math.isclose(sens, noise.sensitivity, rel_tol=1e-12):
                problems.append(
                    f"{p.query.name}: noise calibrated to sensitivity {noise.sensitivity}, "
                    f"but the bounds give {sens}"
                )
            if noise.mechanism == "discrete_laplace":
                mine.append(DiscreteLaplace.of(repr(noise.scale), repr(sens)))
            else:
                mine.append(DiscreteGaussian.of(repr(noise.scale), repr(sens), dims))
        if p.top_epsilon is not None:
            groups_per_person = spec.l0 if p.query.group_by else 1
            mine.append(ApproxDP.of(p.top_epsilon * groups_per_person, 0))
        if p.quantile_epsilon is not None:  # k mechanisms in each of ≤ L0 cells of a person
            cells_per_person = spec.l0 if p.query.group_by else 1
            per_person = p.quantile_epsilon * cells_per_person * len(spec.quantiles)
            mine.append(ApproxDP.of(per_person, 0))
        if spec.partition_by:
            mine = [Parallel((m,)) for m in mine]  # type: ignore[arg-type]
        steps += mine
    return steps, problems


def _statistic_problems(spec: DPReleaseSpec, r: QueryRelease) -> list[str]:
    """Published quantiles on the public grid, within the bounds and monotone; a variance
    or standard deviation within [0, its largest value] and inside its interval."""
    assert spec.bounds is not None
    lo, hi = (float(b) for b in spec.bounds)
    out: list[str] = []
    if spec.kind in QUANTILE_KINDS:
        cols = [c for _, c in sorted(zip(spec.quantiles, quantile_columns(spec), strict=True))]
        values = r.table[cols].to_numpy(dtype=np.float64)
        steps = (values - lo) / spec.resolution
        on_grid = np.allclose(steps, np.rint(steps), atol=1e-6) or spec.decimals is not None
        if not on_grid or (values < lo - 1e-9).any() or (values > hi + 1e-9).any():
            out.append(f"{r.name}: a quantile is not a point of the public grid")
        if (np.diff(values, axis=1) < 0).any():
            out.append(f"{r.name}: quantiles are not monotone")
        return out
    col = "variance" if spec.kind == "dp_variance" else "stddev"
    stat, low, high = (r.table[c].to_numpy(dtype=np.float64) for c in (col, "ci_low", "ci_high"))
    half = (hi - lo) / 2
    top = half * half if col == "variance" else half
    slack = 1e-9 * max(top, 1.0) + (10.0**-spec.decimals if spec.decimals is not None else 0)
    if (stat < -slack).any() or (stat > top + slack).any():
        out.append(f"{r.name}: a {col} outside [0, {top:g}]")
    if (low > stat + slack).any() or (stat > high + slack).any():
        out.append(f"{r.name}: a {col} outside its interval")
    return out


def verify_release(
    spec: DPReleaseSpec,
    plans: Sequence[QueryPlan],
    releases: Sequence[QueryRelease],
    rows: int,
    charged: tuple[Fraction, Fraction] | None = None,
    privacy_units: int | None = None,
) -> dict[str, Any]:
    """Re-check the guarantee on the output; PrivacyRefusal (exit 4) on any failure.

    ``charged`` is what the ledger recorded: the recomputed bound must not exceed it.
    ``privacy_units``: the privacy units the data held; δ is meaningful only below 1/units, so more
    units than the declared ``max_units`` fail the check (no figure in the message)."""
    steps, problems = _recorded_steps(spec, plans)
    chosen = Accountant(steps, delta=spec.delta).chosen()
    tolerance = 1e-9 * float(spec.epsilon)
    if chosen.epsilon is None or chosen.epsilon > float(spec.epsilon) + tolerance:
        problems.append(
            f"the recorded noise gives epsilon {chosen.epsilon} > configured {float(spec.epsilon)}"
        )
    if charged is not None and chosen.epsilon is not None:
        paid_eps, paid_delta = float(charged[0]), float(charged[1])
        if chosen.epsilon > paid_eps * (1 + 1e-9) or (chosen.delta or 0.0) > paid_delta:
            problems.append(
                f"the recorded noise gives epsilon {chosen.epsilon}, more than the ledger "
                f"was charged ({paid_eps})"
            )
    if chosen.delta is not None and chosen.delta > float(spec.delta):
        problems.append(f"delta {chosen.delta} > configured {float(spec.delta)}")
    bound = spec.max_units if spec.max_units is not None else rows
    if spec.delta > 0 and bound > 0 and spec.delta * bound >= 1:
        problems.append(f"delta {float(spec.delta)} is not below 1/{bound}")
    if spec.max_units is not None and privacy_units is not None and privacy_units > spec.max_units:
        problems.append(
            f"the data holds more privacy units than max_units {spec.max_units} declares"
        )
    for p, r in zip(plans, releases, strict=True):
        part = r.partial
        if part.max_rows_per_cell > spec.linf:
            problems.append(
                f"{r.name}: a person keeps {part.max_rows_per_cell} rows in a cell "
                f"(bound {spec.linf})"
            )
        if part.max_cells_per_unit > spec.l0:
            problems.append(
                f"{r.name}: a person keeps {part.max_cells_per_unit} cells (bound {spec.l0})"
            )
        if spec.partition_by and part.max_groups_per_unit > 1:
            problems.append(f"{r.name}: a person is in {part.max_groups_per_unit} groups")
        if spec.kind in TOP_KINDS:
            groups = len(public_domain(spec, p, list(r.key_columns)[:-1]))
            if len(r.table) != groups * spec.top_k:
                problems.append(f"{r.name}: {len(r.table)} rows, expected {groups} x {spec.top_k}")
            continue
        keys = list(r.key_columns)
        published = hash_keys(r.table[keys].astype(object)) if keys else np.zeros(len(r.table))
        if spec.partitions == "public":
            domain = public_domain(spec, p, keys)
            expected = hash_keys(domain) if keys else np.zeros(1)
            if len(r.table) != len(domain) or not np.array_equal(
                np.sort(published), np.sort(expected)
            ):
                problems.append(
                    f"{r.name}: {len(r.table)} cells published, domain has {len(domain)} "
                    "(the published cells must be exactly the domain's)"
                )
        else:  # every published key was seen with at least one person, and only once
            units = r.partial.cells["units"]
            seen = units.index[units.to_numpy() > 0].to_numpy(dtype=np.uint64)
            if len(np.unique(published)) != len(published) or not np.isin(published, seen).all():
                problems.append(f"{r.name}: a published cell was not selected from the data")
        noise = p.count_noise if spec.kind in COUNT_KINDS + DISTINCT_KINDS else p.sum_noise
        if spec.kind in MOMENT_KINDS + QUANTILE_KINDS:
            noise = None  # intervals of variances are not a fixed width; quantiles have none
            problems += _statistic_problems(spec, r)
        if r.consistent_with is not None:  # adjusted cells: the intervals were dropped
            if r.table["count"].isna().any() or "ci_low" in r.table:
                problems.append(f"{r.name}: adjusted cells must be counts without intervals")
            continue
        if noise is not None and spec.kind != "dp_mean" and len(r.table):
            counts = spec.kind in COUNT_KINDS + DISTINCT_KINDS
            col = "count" if counts else "sum"
            scale = 1.0 if counts else spec.resolution
            width = (r.table["ci_high"] - r.table["ci_low"]).to_numpy(dtype=np.float64)
            unclamped = np.ones(len(r.table), dtype=bool)
            if counts and spec.clamp:
                unclamped = r.table["ci_low"].to_numpy(dtype=np.float64) > 0
            if (
                not np.allclose(width[unclamped], 2 * noise.halfwidth * scale)
                or r.table[col].isna().any()
            ):
                problems.append(f"{r.name}: confidence intervals do not match the noise scale")
    if problems:
        raise PrivacyRefusal(
            f"release {spec.name!r} failed verification: "
            + "; ".join(problems)
            + ". Nothing was published"
        )
    return {"epsilon": chosen.epsilon, "delta": chosen.delta, "method": chosen.method}


def release_document(
    spec: DPReleaseSpec,
    plans: Sequence[QueryPlan],
    releases: Sequence[QueryRelease],
    check: dict[str, Any],
    *,
    seconds: float,
    charged: tuple[Fraction, Fraction],
    insecure_seed: int | None = None,
) -> dict[str, Any]:
    """release.json: parameters, the guarantee with its accounting, per-query metrics;
    ``charged`` is what the ledger recorded for it."""
    eps, dlt = charged
    doc = {
        "name": spec.name,
        "kind": spec.kind,
        "parameters": {
            "epsilon": float(spec.epsilon),
            "delta": float(spec.delta),
            "mechanism": spec.mechanism,
            "privacy_unit": spec.unit,
            "max_partitions": spec.l0,
            "max_contributions_per_partition": spec.linf,
            "partition_by": list(spec.partition_by),
            "bound_to_one_group": spec.bound_to_one_group,
            "partitions": spec.partitions if spec.kind not in TOP_KINDS else "public",
            "quantiles": [float(q) for q in spec.quantiles] if spec.quantiles else None,
            "selection": spec.selection if spec.is_private_selection else None,
            "value": spec.value,
            "bounds": list(spec.bounds) if spec.bounds else None,
            "resolution": spec.resolution if spec.bounds else None,
            "k": spec.top_k if spec.kind in TOP_KINDS else None,
            "clamp": spec.clamp,
            "round": spec.decimals,
            "consistent": {r.name: r.consistent_with for r in releases if r.consistent_with}
            or None,
            "confidence": spec.confidence,
            "queries": {
                p.query.name: {
                    "group_by": list(p.query.group_by),
                    "levels": dict(p.query.levels),
                    "weight": float(p.query.weight),
                    **p.as_dict(),
                }
                for p in plans
            },
        },
        "guarantee": guarantee(spec, plans),
        "charged": {"epsilon": float(eps), "delta": float(dlt)},
        # only DP outputs here: exact data-dependent counts (rows, rows dropped by bounding)
        # would bypass the guarantee, so they go to the operator's manifest instead
        "metrics": {
            "seconds": round(seconds, 3),
            "cells_published": {r.name: len(r.table) for r in releases},
        },
        "verification": check,
        "insecure_seed": insecure_seed,
        "verified": True,
    }
    return honest_document(doc, insecure_seed)


def bounding_summary(releases: Sequence[QueryRelease]) -> dict[str, Any]:
    """Exact effect of contribution bounding per query: for the operator, never published."""
    return {
        r.name: {
            "rows": r.partial.rows_in,
            "rows_kept": r.partial.rows_kept,
            "persons_in_several_groups": r.partial.persons_in_several_groups,
        }
        for r in releases
    }


def published_table(spec: DPReleaseSpec, releases: Sequence[QueryRelease]) -> pd.DataFrame:
    """data.csv: the only query's table, or all queries in long form with a ``query`` column."""
    if len(releases) == 1:
        return releases[0].table
    frames = [r.table.assign(query=r.name) for r in releases]
    table = pd.concat(frames, ignore_index=True)
    return table[["query", *[c for c in table.columns if c != "query"]]]


# --------------------------------------------------------------------------- pure API


def dp_release(
    df: pd.DataFrame,
    spec: DPReleaseSpec,
    sampler: NoiseSampler,
    *,
    rng: RngLike = None,
    labeler: Labeler = canonical_labels,
    coarsen: Coarsen | None = None,
    insecure_seed: int | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The whole release on a DataFrame: (data.csv's table, release.json's document)."""
    t0 = time.perf_counter()
    plans = plan_queries(spec)
    units = int(df[spec.unit].nunique()) if spec.unit is not None else len(df)
    check_delta(spec, len(df), units)
    releases: list[QueryRelease] = []
    for contrib in contributions(df, spec, plans, labeler):
        partial = bound_and_aggregate(concat([contrib]), spec, rng)
        dictionary = merge_dictionaries([contrib.dictionary])
        releases.append(release_query(partial, dictionary, spec, plans[contrib.query], sampler))
    releases = post_process(spec, plans, releases, coarsen)
    charged = charge(spec, plans)
    check = verify_release(spec, plans, releases, len(df), charged)
    doc = release_document(
        spec, plans, releases, check, seconds=time.perf_counter() - t0, charged=charged,
        insecure_seed=insecure_seed,
    )  # fmt: skip
    return published_table(spec, releases), doc
