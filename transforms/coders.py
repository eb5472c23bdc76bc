"""The coder of privpipe's untyped PCollections: Beam's own, with a cheap size estimate;
and the hand-over of combiners' accumulators on a runner in this process.

Beam counts the bytes each step outputs by *sampling* elements and encoding them in full
(``opcounters``: the first ten of every output, then ever fewer). privpipe's elements are
batches (DataFrames of 64k rows), so every sample pickled a whole batch only to measure it:
about 2.4 s of the main process's CPU in the 1M-row demo (py-spy), none of which reached a
file. ``BatchCoder`` encodes exactly as Beam's default (``FastPrimitivesCoder``, pickling
what it does not know) but estimates a DataFrame's size from its buffers, never by
encoding it: the bytes of the column arrays it holds (``frame_bytes``, the sum of its
columns' ``nbytes``; ``memory_usage``, used before, builds a Series per call: the 1M
demo's 765 estimates took 0.61 s, now 0.26 s). What is encoded, and so what
any runner ships, is unchanged; only the figure in Beam's byte counters is an estimate,
as it always was.

``use_batch_coder`` makes it the fallback coder of Beam's registry: the coder of every
PCollection whose type has no coder registered (untyped, or a DataFrame), where Beam would
use ``FastPrimitivesCoder``; types with coders of their own keep them.

``HandOverCoder`` is the accumulator coder of the frequency tables built for a runner
that runs every stage in this process (``handing_over``, set by ``pipelines.run`` from
``pipelines.runner.plans_ahead``): a partial table goes from the bundle that made it to
the merge by reference instead of being pickled and copied through Beam's data plane.
Any other runner (its stages in other processes) gets Beam's coder, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from collections.abc import Iterator
from typing import Any

import pandas as pd
from apache_beam.coders import coder_impl, coders, typecoders


def frame_bytes(frame: pd.DataFrame) -> int:
    """The bytes of ``frame``'s column arrays (the sum of its columns' ``nbytes``): from
    the arrays its block manager holds (one 2-D array per block of columns of one dtype),
    or column by column where pandas keeps them otherwise. (``memory_usage(deep=False)``
    also counts the hash table of a categorical's categories once pandas has built one,
    which is not part of what is encoded.)"""
    arrays = getattr(getattr(frame, "_mgr", None), "arrays", None)
    if not isinstance(arrays, list):
        return sum(int(column.nbytes) for _, column in frame.items())
    return sum(int(array.nbytes) for array in arrays)


class _BatchCoderImpl(coder_impl.FastPrimitivesCoderImpl):  # type: ignore[misc]
    def get_estimated_size_and_observables(
        self, value: Any, nested: bool = False
    ) -> tuple[int, list[Any]]:
        if isinstance(value, pd.DataFrame):
            return frame_bytes(value), []
        return super().get_estimated_size_and_observables(value, nested)  # type: ignore[no-any-return]


class BatchCoder(coders.FastPrimitivesCoder):  # type: ignore[misc]
    """``FastPrimitivesCoder`` whose size estimate of a DataFrame does not encode it."""

    def _create_impl(self) -> _BatchCoderImpl:
        return _BatchCoderImpl(self._fallback_coder.get_impl())

    @classmethod
    def from_type_hint(cls, typehint: Any, registry: Any) -> BatchCoder:  # type: ignore[override]
        """Wherever the registry would fall back to ``FastPrimitivesCoder`` (a type without
        a coder of its own: untyped, or a DataFrame); protobuf messages keep theirs."""
        for special in (coders.ProtoCoder, coders.ProtoPlusCoder):
            try:
                special.from_type_hint(typehint, registry)
            except Exception:
                continue
            raise ValueError(f"{typehint} has a coder of its own ({special.__name__})")
        return cls()


_registered = False  # in this process's registry


def use_batch_coder() -> None:
    """Make ``BatchCoder`` the fallback of Beam's coder registry (once per process)."""
    global _registered
    if not _registered:
        typecoders.registry.register_fallback_coder(BatchCoder)
        _registered = True


# --------------------------------------------------------------------------- hand-over

_handed: dict[int, Any] = {}  # objects encoded and not yet decoded, by key
_keys = itertools.count(1)
_hand_over = False  # set while a graph for a runner in this process is built
_KEY_BYTES = 16  # a handed-over object's encoding: (process id, key)


class HandOverCoder(coders.Coder):  # type: ignore[misc]
    """Hands an object from one stage to the next of a runner that runs every stage in
    this process (``pipelines.runner.plans_ahead``) by reference: it encodes a key to the
    object, kept here until decoded once. Beam's in-process runner otherwise pickles an
    accumulator and copies its bytes through its data plane and grouping buffers: the
    frequency tables' partial accumulators were ~0.9 GB at 1M demo rows, multiple GB at 10M,
    copied several times while no search could start. Never for a runner whose stages run
    in other processes: a key means nothing there (decoding one raises)."""

    def encode(self, value: Any) -> bytes:
        key = next(_keys)
        _handed[key] = value
        return struct.pack("<qq", os.getpid(), key)

    def decode(self, encoded: bytes) -> Any:
        pid, key = struct.unpack("<qq", encoded)
        try:
            if pid != os.getpid():  # a forked process holds a copy of the keys: not them
                raise KeyError(key)
            return _handed.pop(key)
        except KeyError:
            raise RuntimeError(
                f"an object handed over in process {pid} was not found in process "
                f"{os.getpid()} (decoded twice, or by a runner in another process): "
                "HandOverCoder is only for runners that run every stage in this process"
            ) from None

    def estimate_size(self, value: Any) -> int:
        """The key's size, never by encoding (Beam samples outputs' sizes: an encoding
        only to measure would hand an object over that nobody takes)."""
        return _KEY_BYTES

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> Any:
        return Any

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


@contextlib.contextmanager
def handing_over(enabled: bool) -> Iterator[None]:
    """While a graph is built: whether its combiners hand their accumulators over by
    reference (``HandOverCoder``), i.e. whether its runner runs every stage here."""
    global _hand_over
    before, _hand_over = _hand_over, enabled
    try:
        yield
    finally:
        _hand_over = before


def hands_over() -> bool:
    """Whether the graph being built hands accumulators over (``handing_over``)."""
    return _hand_over


def drop_handed_over() -> int:
    """Forget the objects still handed over (a run that failed between two stages);
    how many there were."""
    n = len(_handed)
    _handed.clear()
    return n
