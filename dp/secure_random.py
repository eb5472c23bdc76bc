"""Vectorised random bits for local DP: a CSPRNG source for releases, a seeded one for tests.

In local DP every person's randomisation is released noise, so it must be unpredictable:
:class:`SecureRandom` draws bytes in bulk from the OS CSPRNG (``os.urandom``, i.e.
``getrandom``) and converts them with numpy. :class:`SeededRandom` (numpy Generator) is for
tests and reproducible insecure runs only, reachable from a pipeline solely through
:func:`random_source_for` with ``allow_insecure=True`` (the same seam as
:func:`dp.noise.sampler_for`).

Both sources share the conversions, so the tested code paths are the production ones:

- ``bernoulli(p, n)``: True iff a uniform 64-bit word U < τ with
  τ = max(0, ⌊p·2^64⌋ − 2^13). The 2^-64 grid and the 2^-51 margin mean
  P[True] ∈ [p − 2^-50, p]: never above the exact p even after the float error of
  computing p (≤ a few ulps, < 2^-51 for p ≤ 1). Callers therefore sample, as True, the
  event whose probability must not be exceeded (e.g. "answer truthfully"), which keeps the
  privacy loss at or below the claimed ε. U is compared lazily: its top byte first, and the
  remaining 56 bits only on a tie (probability 1/256), which draws ≈ 1.03 bytes per trial
  with exactly the distribution of the full 64-bit comparison.
- ``integers(high, n)``: uniform on [0, high) by rejection (no modulo bias).
- ``bits(n)``: fair coins; ``words(n)``: uniform uint64 (e.g. per-person hash keys).
- ``permutation(n)``: a uniformly random order of ``0..n-1`` (published tables are shuffled
  with it): the argsort of n uniform 64-bit keys, redrawn until the keys are distinct, so
  every order is exactly equally likely (ties are redrawn, never broken by position).
"""

from __future__ import annotations

import math
import os
from typing import Protocol

import numpy as np
import numpy.typing as npt

from privpipe.dp.noise import INSECURE_SEED_MESSAGE
from privpipe.errors import ConfigError

BoolArray = npt.NDArray[np.bool_]
UInt8Array = npt.NDArray[np.uint8]
UInt64Array = npt.NDArray[np.uint64]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_TWO64 = 1 << 64
_MARGIN = 1 << 13  # 2^-51 in units of 2^-64: covers float error in computing p
_LOW56 = (1 << 56) - 1


class RandomSource(Protocol):
    """Vectorised randomness for per-person randomisers; one call per batch."""

    def bytes_array(self, n: int) -> UInt8Array:
        """n uniform bytes."""
        ...

    def words(self, n: int) -> UInt64Array:
        """n uniform 64-bit words."""
        ...

    def bits(self, n: int) -> BoolArray:
        """n fair coins."""
        ...

    def bernoulli(self, p: float | FloatArray, n: int) -> BoolArray:
        """n independent Bernoulli(p) (p scalar or length n), P[True] ∈ [p − 2^-50, p]."""
        ...

    def integers(self, high: int, n: int) -> IntArray:
        """n independent uniform integers on [0, high), unbiased (rejection)."""
        ...

    def permutation(self, n: int) -> IntArray:
        """A uniformly random permutation of 0..n-1."""
        ...


def bernoulli_threshold(p: float) -> int:
    """τ with P[U64 < τ] = τ/2^64 ∈ [p − 2^-50, p]: the conservative 64-bit grid point."""
    x = float(p)
    if not 0.0 <= x <= 1.0 or math.isnan(x):
        raise ConfigError(f"a Bernoulli probability must lie in [0, 1], got {p!r}")
    return max(0, min(_TWO64, math.floor(x * float(_TWO64))) - _MARGIN)


class _ByteSource:
    """Conversions shared by both sources, from a uniform byte generator ``_raw``."""

    def _raw(self, n: int) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def bytes_array(self, n: int) -> UInt8Array:
        n = _count(n)
        return np.frombuffer(self._raw(n), dtype=np.uint8).copy()

    def words(self, n: int) -> UInt64Array:
        n = _count(n)
        return np.frombuffer(self._raw(8 * n), dtype="<u8").astype(np.uint64)

    def _words32(self, n: int) -> npt.NDArray[np.uint32]:
        return np.frombuffer(self._raw(4 * n), dtype="<u4").astype(np.uint32)

    def bits(self, n: int) -> BoolArray:
        n = _count(n)
        packed = self.bytes_array((n + 7) // 8)
        return np.unpackbits(packed, count=n).astype(np.bool_)

    def bernoulli(self, p: float | FloatArray, n: int) -> BoolArray:
        n = _count(n)
        if np.ndim(p) == 0:
            tau = bernoulli_threshold(float(p))
            if tau >= _TWO64:  # unreachable with the margin; kept for clarity
                return np.ones(n, dtype=np.bool_)
            hi: np.uint8 | UInt8Array = np.uint8(tau >> 56)
            lo: np.uint64 | UInt64Array = np.uint64(tau & _LOW56)
        else:
            parr = np.asarray(p, dtype=np.float64)
            if parr.shape != (n,):
                raise ValueError(f"p must be a scalar or have shape ({n},), got {parr.shape}")
            if np.any(~((parr >= 0.0) & (parr <= 1.0))):
                raise ConfigError("Bernoulli probabilities must lie in [0, 1]")
            # p·2^64 is exact in float64; values ≥ 2^64 only when p = 1, then clipped.
            scaled = np.floor(parr * float(_TWO64))
            tau_arr = np.where(
                scaled >= float(_TWO64), np.uint64(_TWO64 - 1), scaled.astype(np.uint64)
            )
            tau_arr = np.where(
                tau_arr >= np.uint64(_MARGIN), tau_arr - np.uint64(_MARGIN), np.uint64(0)
            )
            hi = (tau_arr >> np.uint64(56)).astype(np.uint8)
            lo = tau_arr & np.uint64(_LOW56)
        top = self.bytes_array(n)
        out = top < hi
        tie = np.flatnonzero(top == hi)
        if tie.size:
            rest = self.words(tie.size) >> np.uint64(8)  # the low 56 bits of U
            lo_tie = lo if np.ndim(lo) == 0 else np.asarray(lo)[tie]
            out[tie] = rest < lo_tie
        return out

    def integers(self, high: int, n: int) -> IntArray:
        n = _count(n)
        if isinstance(high, bool) or not isinstance(high, int | np.integer) or high < 1:
            raise ConfigError(f"integers needs an integer high >= 1, got {high!r}")
        high = int(high)
        if high > 1 << 62:
            raise ConfigError(f"integers supports high <= 2^62, got {high}")
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        wide = high > 1 << 32
        span = _TWO64 if wide else 1 << 32
        limit = span - span % high  # accept w < limit: each residue equally often
        while todo.size:
            if wide:
                w = self.words(todo.size)
                ok = w < np.uint64(limit) if limit < _TWO64 else np.ones(w.size, np.bool_)
                out[todo[ok]] = (w[ok] % np.uint64(high)).astype(np.int64)
            else:
                w32 = self._words32(todo.size).astype(np.uint64)
                ok = w32 < np.uint64(limit)
                out[todo[ok]] = (w32[ok] % np.uint64(high)).astype(np.int64)
            todo = todo[~ok]
        return out

    def permutation(self, n: int) -> IntArray:
        n = _count(n)
        while True:
            keys = self.words(n)
            # distinct keys have one sorted order, so any sort gives it: the unstable
            # one, ~5x faster on 64-bit keys than numpy's stable (timsort) one
            order = np.argsort(keys)
            ranked = keys[order]
            # distinct keys: every order equally likely; a tie (p < n^2/2^65) is redrawn
            if not bool(np.any(ranked[1:] == ranked[:-1])):
                return order.astype(np.int64)


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"a draw count must be an integer >= 0, got {n!r}")
    return int(n)


class SecureRandom(_ByteSource):
    """The production source: bytes from the OS CSPRNG (``os.urandom``), drawn in bulk.

    Holds no state, so it pickles to Beam workers.
    """

    _CHUNK = 1 << 24  # bytes per os.urandom call (bounded temporary memory)

    def _raw(self, n: int) -> bytes:
        if n <= self._CHUNK:
            return os.urandom(n)
        return b"".join(os.urandom(min(self._CHUNK, n - i)) for i in range(0, n, self._CHUNK))

    def __repr__(self) -> str:
        return "SecureRandom()"


class SeededRandom(_ByteSource):
    """Reproducible source on a seeded numpy Generator. NOT for release: tests only."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def _raw(self, n: int) -> bytes:
        return self._rng.bytes(n)

    def __repr__(self) -> str:
        return f"SeededRandom(seed={self.seed!r})"


def random_source_for(seed: int | None, allow_insecure: bool) -> RandomSource:
    """The one seam choosing the per-person randomness: the OS CSPRNG unless a seed is accepted.

    ``seed=None`` gives :class:`SecureRandom`. A seed gives :class:`SeededRandom`, only with
    ``allow_insecure=True`` (the CLI's ``--insecure-seed``); otherwise ConfigError.
    """
    if seed is None:
        return SecureRandom()
    if not allow_insecure:
        raise ConfigError(INSECURE_SEED_MESSAGE)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    return SeededRandom(int(seed))
