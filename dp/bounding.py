"""Contribution bounding per privacy unit, and the sensitivities it buys.

A privacy unit (a person) may appear in many rows. Before any DP aggregate, each unit keeps
at most ``L0`` distinct partitions (chosen uniformly at random among its partitions) and at
most ``Linf`` rows per kept partition (uniformly at random). Then one unit changes a count
histogram by at most L1 = L0·Linf and L2 = √L0·Linf, and a sum of values clamped to
[lo, hi] by L0·Linf·max(|lo|, |hi|) (REFERENCE.md, "Central DP").

Vectorised (DESIGN.md "Batches, not rows"): random permutation keys plus a sort and a rank
within groups, no Python loop per unit. The choice for a unit depends only on that unit's
own rows, so the function is correct on any DataFrame that holds *all* rows of the units
it contains (the Beam layer calls it per batch after a shuffle keyed by unit).

Randomness: which rows a unit keeps is not released noise, so ``numpy.random`` is fine, but
it must not be predictable. ``rng=None`` draws a fresh 128-bit seed from :mod:`secrets`; an
int seed or a ``numpy.random.Generator`` may be injected for tests and reproducible runs.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.arrays import unique_first_inverse
from privpipe.errors import ConfigError, InputDataError

RngLike = np.random.Generator | int | None


def bounding_rng(rng: RngLike = None) -> np.random.Generator:
    """A Generator: the injected one, one seeded by an int, or one seeded from ``secrets``."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng(secrets.randbits(128))
    if isinstance(rng, bool) or not isinstance(rng, int | np.integer):
        raise ConfigError(f"rng must be a numpy Generator, an int seed or None, got {rng!r}")
    return np.random.default_rng(int(rng))


def _check_bound(name: str, value: int) -> int:
    """``value`` as an int ≥ 1, else ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _rank_within(
    groups: npt.NDArray[np.int64], keys: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """0-based rank of each element by ``keys`` inside its group (ranks aligned to input).

    ``groups`` and ``keys`` are ids in ``0..n-1`` (keys distinct: a permutation), so one
    int64 key ``group·n + key`` sorts as the pair does (lexsort of two keys was the slowest
    step of contribution bounding: about 3× one argsort)."""
    n = groups.size
    if n and (int(groups.min()) < 0 or int(groups.max()) >= n or int(keys.max()) >= n):
        order = np.lexsort((keys, groups))  # not ids below n: the general sort
    else:
        order = np.argsort(groups * np.int64(n) + keys)
    sorted_groups = groups[order]
    positions = np.arange(n, dtype=np.int64)
    is_start = np.ones(n, dtype=bool)
    is_start[1:] = sorted_groups[1:] != sorted_groups[:-1]
    group_start = np.maximum.accumulate(np.where(is_start, positions, 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = positions - group_start
    return ranks


def _partition_codes(frame: pd.DataFrame, partition_cols: list[str]) -> npt.NDArray[np.int64]:
    """Integer code per row for its partition key (missing values form their own key)."""
    if not partition_cols:
        return np.zeros(len(frame), dtype=np.int64)
    codes = frame.groupby(partition_cols, dropna=False, sort=False, observed=True).ngroup()
    arr: npt.NDArray[np.int64] = np.asarray(codes.to_numpy(dtype=np.int64), dtype=np.int64)
    return arr


def bound_contributions(
    frame: pd.DataFrame,
    unit: str | None,
    partition_cols: list[str],
    max_partitions: int,
    max_contributions_per_partition: int,
    rng: RngLike = None,
) -> pd.DataFrame:
    """Rows of ``frame`` kept so each unit has ≤ L0 partitions and ≤ Linf rows per partition.

    Partitions are chosen uniformly at random among the unit's distinct partition keys, then
    rows uniformly at random within each kept partition. ``unit=None`` means each row is its
    own unit (one row, one partition: nothing to drop). Kept rows keep their index and
    order. A missing unit id is refused (InputDataError): it cannot be attributed to anyone.
    """
    l0 = _check_bound("max_partitions", max_partitions)
    linf = _check_bound("max_contributions_per_partition", max_contributions_per_partition)
    missing = [
        c for c in [*([unit] if unit is not None else []), *partition_cols] if c not in frame
    ]
    if missing:
        raise InputDataError(f"contribution bounding: columns {missing} not in the data")
    if unit is None or len(frame) == 0:
        return frame.copy()
    units, _ = pd.factorize(frame[unit], use_na_sentinel=True)
    if (units < 0).any():
        raise InputDataError(
            f"column {unit!r} (privacy unit) has missing values; every row needs a unit id"
        )
    gen = bounding_rng(rng)
    keep = bound_units(
        units.astype(np.int64), _partition_codes(frame, partition_cols), l0, linf, gen
    )
    return frame.loc[keep].copy()


def dense_ids(values: npt.NDArray[np.generic]) -> tuple[npt.NDArray[np.int64], int]:
    """Ids ``0..n-1`` of the distinct ``values`` (any integers, e.g. 64-bit person
    hashes), in order of first appearance, and ``n``: the persons numbered once, for
    every step that needs them (grouping, bounding, recounting)."""
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int64, copy=False), len(uniques)


def bound_units(
    units: npt.NDArray[np.generic],
    partitions: npt.NDArray[np.generic],
    max_partitions: int,
    max_contributions_per_partition: int,
    rng: RngLike = None,
) -> npt.NDArray[np.bool_]:
    """Keep mask: each unit keeps ≤ L0 of its partitions and ≤ Linf rows in each, at random.

    ``units`` and ``partitions`` are any hashable integer ids per row (e.g. 64-bit hashes).
    """
    person, n_persons = dense_ids(units)
    return bound_ids(
        person, n_persons, partitions, max_partitions, max_contributions_per_partition, rng
    )


def bound_ids(
    person: npt.NDArray[np.int64],
    n_persons: int,
    partitions: npt.NDArray[np.generic],
    max_partitions: int,
    max_contributions_per_partition: int,
    rng: RngLike = None,
) -> npt.NDArray[np.bool_]:
    """``bound_units`` for units already numbered ``0..n_persons-1`` (``dense_ids``), so a
    caller that needs the persons' ids again numbers them once."""
    l0 = _check_bound("max_partitions", max_partitions)
    linf = _check_bound("max_contributions_per_partition", max_contributions_per_partition)
    if person.size == 0:
        return np.zeros(0, dtype=np.bool_)
    gen = bounding_rng(rng)
    part = pd.factorize(partitions)[0].astype(np.int64)
    n_parts = int(part.max()) + 1
    # One id per distinct (unit, partition) pair; pairs sorted by unit.
    uniq_pairs, _, pair_of_row = unique_first_inverse(person * n_parts + part)
    keep_pair = _keep_at_most(uniq_pairs // n_parts, n_persons, l0, gen)
    keep_row = _keep_at_most(pair_of_row, uniq_pairs.size, linf, gen)
    keep: npt.NDArray[np.bool_] = keep_pair[pair_of_row] & keep_row
    return keep


def _keep_at_most(
    groups: npt.NDArray[np.int64], n_groups: int, limit: int, gen: np.random.Generator
) -> npt.NDArray[np.bool_]:
    """Keep mask: ``limit`` members of each group (ids ``0..n_groups-1``) chosen uniformly
    at random, all members of a group that has no more; only the larger groups are ranked."""
    over = np.bincount(groups, minlength=n_groups) > limit
    keep = np.ones(groups.size, dtype=np.bool_)
    members = np.flatnonzero(over[groups])
    if members.size:
        dense = (np.cumsum(over) - 1)[groups[members]]  # the larger groups as 0..k-1
        ranks = _rank_within(dense, gen.permutation(members.size).astype(np.int64))
        keep[members] = ranks < limit
    return keep


def one_group_per_unit(
    units: npt.NDArray[np.generic], groups: npt.NDArray[np.generic], rng: RngLike = None
) -> npt.NDArray[np.bool_]:
    """Keep mask: the rows of one group per unit, the group chosen uniformly at random."""
    mask: npt.NDArray[np.bool_] = bound_units(units, groups, 1, max(1, units.size), rng)
    return mask


def sensitivities(
    l0: int, linf: int, clamp: tuple[float, float] | None = None
) -> tuple[float, float]:
    """(L1, L2) of a per-partition histogram after bounding.

    Counts: (L0·Linf, √L0·Linf). Sums of values clamped to ``clamp = (lo, hi)``: each term
    is multiplied by max(|lo|, |hi|), the most one row can move a cell.
    """
    l0 = _check_bound("l0", l0)
    linf = _check_bound("linf", linf)
    per_row = 1.0
    if clamp is not None:
        lo, hi = (float(x) for x in clamp)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise ConfigError(f"clamp must be finite with lo <= hi, got {clamp!r}")
        per_row = max(abs(lo), abs(hi))
        if per_row == 0.0:
            raise ConfigError("clamp [0, 0] makes every sum 0; choose bounds that are not both 0")
    return float(l0 * linf) * per_row, math.sqrt(l0) * linf * per_row
