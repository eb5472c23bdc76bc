"""Exact integer sums of fixed-point values: int64 when provably safe, Python ints otherwise.

A fixed-point sum (``dp_sum``, ``dp_mean``) adds integers of up to ``max(|lo|, |hi|)/resolution``
per row, so 10,000 rows at 1e15 already exceed int64 and numpy would wrap silently. The rule
here: sum in int64 only when ``rows × max |value|`` is proved below :data:`SAFE` (2^62, a
margin of 2 below the int64 limit); otherwise split every value into a high and a low part of
31 bits, sum both parts in int64 (each provably safe) and recombine them as Python ints. Sums
that do not fit int64 are held in object columns of Python ints; nothing ever wraps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

SAFE = 2**62  # |x| below this is an int64 with room to add one more such value
_LOW_BITS = 31
_LOW_MASK = (1 << _LOW_BITS) - 1
_MAX_SPLIT_ROWS = 2**29  # rows × 2^32 (the largest high part) stays below SAFE


def max_abs(values: npt.NDArray[np.generic]) -> int:
    """The largest |value| as a Python int (0 when empty); object arrays included."""
    if values.size == 0:
        return 0
    if values.dtype == object:
        return max(abs(int(v)) for v in values.tolist())
    return max(abs(int(values.max())), abs(int(values.min())))


def fits(bound: int) -> bool:
    """True if integers of absolute value ≤ ``bound`` are safe in int64 arithmetic."""
    return bound < SAFE


def as_exact(values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """int64 if every value is safe in int64, else an object array of Python ints."""
    arr = np.asarray(values)
    if arr.dtype != object and arr.dtype.kind in "iu" and fits(max_abs(arr)):
        return arr.astype(np.int64)
    out = np.empty(arr.size, dtype=object)
    out[:] = [int(v) for v in arr.reshape(-1).tolist()]
    return out if not fits(max_abs(out)) else out.astype(np.int64)


def group_sum(keys: npt.NDArray[np.generic], values: npt.NDArray[np.int64]) -> pd.Series:
    """Exact Σ values per key (index: the keys in first-seen order).

    int64 when ``len × max |v|`` < 2^62 (the proved bound); else two int64 sums of the high
    and low 31-bit parts, recombined as Python ints (object dtype only where needed).
    """
    n = int(values.size)
    if fits(n * max_abs(values)):
        return pd.Series(values, dtype=np.int64).groupby(keys, sort=False).sum()
    if n > _MAX_SPLIT_ROWS:  # split in halves: each half's parts stay provably safe
        half = n // 2
        parts = [group_sum(keys[:half], values[:half]), group_sum(keys[half:], values[half:])]
        return combine(parts)
    high = values >> _LOW_BITS  # arithmetic shift: value = high·2^31 + low, low in [0, 2^31)
    low = values & _LOW_MASK
    frame = pd.DataFrame({"h": high, "l": low})
    sums = frame.groupby(keys, sort=False).sum()
    total = sums["h"].astype(object) * (1 << _LOW_BITS) + sums["l"].astype(object)
    return pd.Series(as_exact(total.to_numpy()), index=sums.index)


def total(values: npt.NDArray[np.int64]) -> int:
    """Exact Σ values as a Python int."""
    if values.size == 0:
        return 0
    s = group_sum(np.zeros(values.size, dtype=np.int64), values)
    return int(s.iloc[0])


def combine(parts: Sequence[pd.Series]) -> pd.Series:
    """Exact per-key sum of several exact per-key sums (int64 when provably safe)."""
    frames = [p for p in parts if len(p)]
    if not frames:
        return parts[0] if parts else pd.Series(dtype=np.int64)
    bound = sum(max_abs(p.to_numpy()) for p in frames)
    joined = pd.concat(frames)
    if fits(bound):
        return joined.astype(np.int64).groupby(level=0, sort=False).sum()
    exact = joined.astype(object).map(int)
    summed = exact.groupby(level=0, sort=False).agg(lambda s: sum(s.tolist()))
    return pd.Series(as_exact(summed.to_numpy()), index=summed.index)


def to_float(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Exact integers (int64 or Python ints) as float64 for a released, rescaled value."""
    arr = np.asarray(values)
    if arr.dtype == object:
        return np.array([float(v) for v in arr.tolist()], dtype=np.float64)
    return arr.astype(np.float64)
