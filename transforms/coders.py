"""The coder of privpipe's untyped PCollections: Beam's own, with a cheap size estimate.

Beam counts the bytes each step outputs by *sampling* elements and encoding them in full
(``opcounters``: the first ten of every output, then ever fewer). privpipe's elements are
batches (DataFrames of 64k rows), so every sample pickled a whole batch only to measure it:
about 2.4 s of the main process's CPU in the 1M-row demo (py-spy), none of which reached a
file. ``BatchCoder`` encodes exactly as Beam's default (``FastPrimitivesCoder``, pickling
what it does not know) but estimates a DataFrame's size from its buffers
(``memory_usage``), never by encoding it. What is encoded, and so what any runner ships,
is unchanged; only the figure in Beam's byte counters is an estimate, as it always was.

``use_batch_coder`` makes it the fallback coder of Beam's registry: the coder of every
PCollection whose type has no coder registered (untyped, or a DataFrame), where Beam would
use ``FastPrimitivesCoder``; types with coders of their own keep them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from apache_beam.coders import coder_impl, coders, typecoders


class _BatchCoderImpl(coder_impl.FastPrimitivesCoderImpl):  # type: ignore[misc]
    def get_estimated_size_and_observables(
        self, value: Any, nested: bool = False
    ) -> tuple[int, list[Any]]:
        if isinstance(value, pd.DataFrame):
            return int(value.memory_usage(index=False, deep=False).sum()), []
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
