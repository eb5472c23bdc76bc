"""transforms.memory: glibc's heap is trimmed only once it holds enough free memory."""

from __future__ import annotations

import ctypes

import pytest

from privpipe.transforms import memory


class FakeLibc:
    """``malloc_trim`` counted; ``mallinfo2`` reports ``free`` bytes (absent if None)."""

    def __init__(self, free: int | None) -> None:
        self.trims = 0
        if free is not None:
            info = memory._MallInfo2(fordblks=free)
            self.mallinfo2 = lambda: info

    def malloc_trim(self, pad: int) -> int:
        self.trims += 1
        return 1


@pytest.mark.parametrize(
    ("free", "trims"),
    [
        (0, 0),
        (memory.TRIM_FROM_BYTES - 1, 0),
        (memory.TRIM_FROM_BYTES, 1),
        (8 * memory.TRIM_FROM_BYTES, 1),
        (None, 1),  # a glibc without mallinfo2: trimmed as before
    ],
)
def test_the_heap_is_trimmed_only_from_the_threshold(
    monkeypatch: pytest.MonkeyPatch, free: int | None, trims: int
) -> None:
    libc = FakeLibc(free)
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    memory.release_free_memory()
    assert libc.trims == trims


def test_free_heap_bytes_reads_this_processs_glibc() -> None:
    libc = memory._libc()
    if libc is None:
        pytest.skip("not glibc on Linux")
    free = memory.free_heap_bytes(libc)
    assert free is None or free >= 0
    assert isinstance(libc, ctypes.CDLL)
