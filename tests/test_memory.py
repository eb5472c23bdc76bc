"""transforms.memory: glibc's heap is trimmed only once it holds enough free memory, Arrow's
pool released only in a large process."""

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
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    memory.release_free_memory()
    assert libc.trims == trims


class FakePool:
    def __init__(self) -> None:
        self.releases = 0

    def release_unused(self) -> None:
        self.releases += 1


@pytest.mark.parametrize(
    ("resident", "releases"),
    [
        (0, 0),
        (memory.RELEASE_ARROW_FROM_BYTES - 1, 0),
        (memory.RELEASE_ARROW_FROM_BYTES, 1),
        (None, 1),  # unknown: released as before
    ],
)
def test_arrows_pool_is_released_only_in_a_large_process(
    monkeypatch: pytest.MonkeyPatch, resident: int | None, releases: int
) -> None:
    pool = FakePool()
    monkeypatch.setattr(memory.pa, "default_memory_pool", lambda: pool)
    monkeypatch.setattr(memory, "resident_bytes", lambda: resident)
    monkeypatch.setattr(memory, "_libc", lambda: None)
    memory.release_free_memory()
    assert pool.releases == releases


def test_resident_bytes_is_this_processs() -> None:
    resident = memory.resident_bytes()
    if resident is None:
        pytest.skip("psutil cannot read this process's memory here")
    big = b"x" * (64 << 20)  # every byte written: resident
    assert memory.resident_bytes() >= resident + (32 << 20)  # type: ignore[operator]
    del big


def test_free_heap_bytes_reads_this_processs_glibc() -> None:
    libc = memory._libc()
    if libc is None:
        pytest.skip("not glibc on Linux")
    free = memory.free_heap_bytes(libc)
    assert free is None or free >= 0
    assert isinstance(libc, ctypes.CDLL)
