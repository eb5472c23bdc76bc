"""Give memory that was freed back to the operating system between heavy steps.

On the in-process DirectRunner every step runs in one process, one after the other. The
read of all batches frees millions of small and mid-sized buffers (parsed columns,
strings, partial tables), but glibc's allocator and Arrow's memory pool keep freed pages
for reuse instead of returning them, so the process stays hundreds of MB above what it
holds, and the next one-worker step (merging the summary, the search) peaks on top of
that. Measured at 3M rows before the search: 662 MB resident, 410 MB after releasing.

Harmless elsewhere: on other platforms or allocators it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from functools import cache

import pyarrow as pa


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        _ = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


TRIM_FROM_BYTES = 512 << 20
"""Free bytes glibc must hold before ``release_free_memory`` trims its heap. Trimming is
quick (4-14 ms), but every page it returns is faulted in again by the next step's
allocations: at 1M demo rows the single-release run held 122-324 MB free at its five
trims, and trimming them all cost 0.44 s of its ~6 s (sys 1.42 against 1.13 s, three ABBA
rounds) for 86 MB less peak; at 10M rows gigabytes are held and still returned."""


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): the heap's figures over every arena."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def free_heap_bytes(libc: ctypes.CDLL) -> int | None:
    """Bytes glibc holds free in its arenas (``mallinfo2().fordblks``); None if unknown."""
    try:
        info = libc.mallinfo2
    except AttributeError:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


RELEASE_ARROW_FROM_BYTES = 1 << 30
"""Resident bytes of the process from which ``release_free_memory`` also has Arrow's pool
return its unused memory (mimalloc returns it by itself after a short delay; forcing it
in a small run only makes the next read fault it in again: the 1M single-release run
0.15-0.52 s faster per ABBA round without, five rounds, resident +14 MB)."""


def resident_bytes() -> int | None:
    """This process's resident memory (psutil, imported on first use: ~25 ms that a run
    pays only when it releases memory); None where psutil cannot tell."""
    import psutil

    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return None


def release_free_memory() -> None:
    """Return freed but retained memory to the OS where the process is large enough for it
    to matter: Arrow's pool from ``RELEASE_ARROW_FROM_BYTES`` resident, glibc's heap once
    it holds ``TRIM_FROM_BYTES`` free (each, always when its figure is unknown)."""
    resident = resident_bytes()
    if resident is None or resident >= RELEASE_ARROW_FROM_BYTES:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        free = free_heap_bytes(libc)
        if free is None or free >= TRIM_FROM_BYTES:
            libc.malloc_trim(0)
