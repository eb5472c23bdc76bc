"""A value remembered per DataFrame object, for the audit's tables.

The audit hands the same frame objects (a loaded release's table, the staged truth) to
many attacks; what is learnt about a frame once (its rows are distinct, its content
hash) is kept with the object instead of being computed at every use. The value is
forgotten with the frame, and not given back once the frame's columns or length changed;
values changed in place are not seen (the audit's frames are not changed in place).

Pure core: pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

import pandas as pd

T = TypeVar("T")

_Shape = tuple[tuple[str, ...], int]


def _shape(frame: pd.DataFrame) -> _Shape:
    return tuple(map(str, frame.columns)), len(frame)


class FrameMemo(Generic[T]):
    """One value per live frame object (by identity, not content)."""

    def __init__(self) -> None:
        self._frames: weakref.WeakValueDictionary[int, pd.DataFrame] = weakref.WeakValueDictionary()
        self._values: dict[int, tuple[_Shape, T]] = {}

    def get(self, frame: pd.DataFrame) -> T | None:
        """The value put for this very frame, None if none or its shape changed since."""
        if self._frames.get(id(frame)) is None:  # a live entry under its id is the frame
            return None
        kept = self._values.get(id(frame))
        return kept[1] if kept is not None and kept[0] == _shape(frame) else None

    def put(self, frame: pd.DataFrame, value: T) -> None:
        key = id(frame)
        if self._frames.get(key) is None:  # the value goes with the frame
            weakref.finalize(frame, self._values.pop, key, None)
        self._frames[key] = frame
        self._values[key] = (_shape(frame), value)
