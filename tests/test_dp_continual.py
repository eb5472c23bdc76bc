"""dp.continual and dp.state_store: the tree mechanism's error matches theory, the stored
state refuses re-runs, skips, overruns, parameter changes and tampering, and the pan-private
state never holds raw counts."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from dp.continual import (
    TreeCounter,
    advance,
    node_scale,
    nodes_used,
    release_variance,
    round_horizon,
    start,
    tree_levels,
)
from dp.noise import SecureSampler, SeededTestSampler, discrete_laplace_variance
from dp.state_store import ContinualStore, state_path
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

Z = 5.0


def _dlap_moments(scale: float) -> tuple[float, float]:
    """E[X²], E[X⁴] of the discrete Laplace with ``scale`` (pmf summed numerically)."""
    k = np.arange(-math.ceil(200 * scale), math.ceil(200 * scale) + 1, dtype=np.float64)
    w = np.exp(-np.abs(k) / scale)
    w /= w.sum()
    return float((w * k**2).sum()), float((w * k**4).sum())


# ----------------------------------------------------------------------------- arithmetic


def test_tree_arithmetic() -> None:
    assert [round_horizon(t) for t in (1, 2, 3, 12, 16, 17)] == [1, 2, 4, 16, 16, 32]
    assert tree_levels(16) == 5 and tree_levels(12) == 5 and tree_levels(1) == 1
    assert node_scale(2**20, 2.0) == pytest.approx(21 / 2.0)
    assert node_scale(16, 1.0, sensitivity=3) == pytest.approx(15.0)
    assert nodes_used(13) == [0, 2, 3] and nodes_used(16) == [4]
    b = node_scale(16, 1.0)
    assert release_variance(7, 16, 1.0) == pytest.approx(3 * discrete_laplace_variance(b))
    assert release_variance(7, 16, 1.0, pan_private=True) == pytest.approx(
        6 * discrete_laplace_variance(b)
    )
    with pytest.raises(ConfigError):
        round_horizon(0)
    with pytest.raises(ConfigError):
        node_scale(16, 0.0)


@pytest.mark.parametrize("pan_private", [False, True])
def test_tree_error_variance_matches_theory_every_period(pan_private: bool) -> None:
    # `cells` independent counters at once: each cell is one seeded run of the mechanism.
    cells, horizon, eps = 4000, 12, 1.0  # T rounds up to 16
    rng = np.random.default_rng(5)
    counter = TreeCounter(horizon, eps, SeededTestSampler(31), cells=cells, pan_private=pan_private)
    assert counter.horizon == 16
    m2, m4 = _dlap_moments(node_scale(16, eps))
    truth = np.zeros(cells, dtype=np.int64)
    for t in range(1, 17):
        x = rng.integers(0, 50, cells)
        truth += x
        out = counter.release(t, x)
        err = (out.counts - truth).astype(np.float64)
        k = len(nodes_used(t)) * (2 if pan_private else 1)
        var = k * m2
        assert out.variance == pytest.approx(var, rel=1e-6)
        assert counter.variance(t) == out.variance
        # CLT on the squared error of a sum of k i.i.d. DLap: E[S⁴] = k m4 + 3k(k−1) m2².
        var_sq = k * m4 + 3 * k * (k - 1) * m2**2 - var**2
        assert abs((err**2).mean() - var) <= Z * math.sqrt(var_sq / cells), (t, err.var(), var)
        assert abs(err.mean()) <= Z * math.sqrt(var / cells)
        assert (np.abs(err) <= out.halfwidth).mean() >= 0.95  # union-bound CI: conservative


def test_tree_counter_in_memory_refusals() -> None:
    counter = TreeCounter(4, 1.0, SeededTestSampler(1))
    counter.update(3)
    with pytest.raises(PrivacyRefusal, match=r"period 1 .*already released"):
        counter.release(1, 3)
    with pytest.raises(PrivacyRefusal, match=r"period 3 .*before period 2"):
        counter.release(3, 3)
    for t in (2, 3, 4):
        counter.release(t, 1)
    with pytest.raises(PrivacyRefusal, match=r"period 5 .*exceeds its horizon T = 4"):
        counter.release(5, 0)
    with pytest.raises(InputDataError, match="1 cell"):
        TreeCounter(4, 1.0, SeededTestSampler(1)).update([1, 2])
    with pytest.raises(InputDataError, match="integers"):
        TreeCounter(4, 1.0, SeededTestSampler(1)).update(1.5)


def test_state_holds_only_needed_nodes_and_advance_is_pure() -> None:
    state = start(16, 1.0, SeededTestSampler(2), cells=2)
    assert sorted(state.open_nodes) == list(range(5)) and not state.released
    s = state
    for t in range(1, 17):
        before = {j: v.copy() for j, v in s.open_nodes.items()}
        new, _ = advance(s, t, [1, 2], SeededTestSampler(t))
        assert all(np.array_equal(s.open_nodes[j], before[j]) for j in before)  # unchanged
        assert sorted(new.released) == nodes_used(t)
        s = new
    assert s.finished and not s.open_nodes


# ----------------------------------------------------------------------------- the store


def _open(path: Path, **kw: object) -> ContinualStore:
    args: dict[str, object] = {
        "stream_id": "visits",
        "horizon": 8,
        "epsilon": 1.0,
        "sampler": SeededTestSampler(3),
    }
    args.update(kw)
    return ContinualStore.open(path, **args)  # type: ignore[arg-type]


def test_store_releases_in_order_and_persists(tmp_path: Path) -> None:
    path = state_path(tmp_path, "demo data")
    assert path.name == "demo_data.continual.sqlite"
    with _open(path) as store:
        first = [store.release(t, 10, SeededTestSampler(t)).counts[0] for t in (1, 2, 3)]
    with _open(path) as store:  # a later scheduled run continues the stream
        assert store.info().period == 3
        out = store.release(4, 10, SeededTestSampler(4))
        assert out.levels_used == (2,)
        history = store.history()
    assert [p for p, _ in history] == [1, 2, 3, 4]
    assert [int(c[0]) for _, c in history[:3]] == first
    with _open(path, stream_id="other", horizon=4) as other:  # several streams per file
        assert other.info().period == 0


def test_store_refuses_rerun_skip_overrun(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = _open(path, horizon=4)
    store.release(1, 5, SeededTestSampler(1))
    with pytest.raises(PrivacyRefusal, match="period 1 of stream 'visits' was already released"):
        store.release(1, 5, SeededTestSampler(1))
    with pytest.raises(PrivacyRefusal, match="period 3 of stream 'visits' cannot be released"):
        store.release(3, 5, SeededTestSampler(1))
    for t in (2, 3, 4):
        store.release(t, 5, SeededTestSampler(t))
    with pytest.raises(PrivacyRefusal, match="period 5 of stream 'visits' exceeds"):
        store.release(5, 5, SeededTestSampler(1))
    assert store.info().period == 4  # refusals changed nothing
    store.verify_history()
    store.close()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epsilon": 2.0}, "epsilon=1 \\(asked 2\\)"),
        ({"horizon": 16}, "T=8 \\(asked 16\\)"),
        ({"pan_private": True}, "pan_private"),
        ({"cells": 3}, "cells"),
    ],
)
def test_store_refuses_changed_parameters(
    tmp_path: Path, change: dict[str, object], match: str
) -> None:
    path = tmp_path / "s.sqlite"
    with _open(path) as store:
        store.release(1, 5, SeededTestSampler(1))
    with pytest.raises(PrivacyRefusal, match=match):
        _open(path, **change)
    with _open(path, horizon=7) as same:  # 7 rounds to the same T = 8
        assert same.info().horizon == 8


def _tamper(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, params)
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE nodes SET value = ? WHERE kind = 'open' AND level = 1",
        "UPDATE streams SET period = 2",  # roll back to re-run period 3
        "DELETE FROM releases WHERE period = 3",
        "UPDATE releases SET counts = ? WHERE period = 3",
        "DELETE FROM nodes WHERE kind = 'released'",
        "UPDATE streams SET epsilon = '2'",
    ],
)
def test_store_refuses_a_tampered_state(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "s.sqlite"
    with _open(path) as store:
        for t in (1, 2, 3):
            store.release(t, 5, SeededTestSampler(t))
    params = (np.array([123], dtype="<i8").tobytes(),) if "?" in sql else ()
    _tamper(path, sql, params)
    with pytest.raises(PrivacyRefusal, match=r"(checksum at period|started with)"):
        _open(path, epsilon=2.0 if "epsilon" in sql else 1.0)


def test_store_refuses_tampering_under_an_open_handle(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = _open(path)
    store.release(1, 5, SeededTestSampler(1))
    _tamper(
        path,
        "UPDATE nodes SET value = ? WHERE kind = 'open' AND level = 2",
        (np.array([9], dtype="<i8").tobytes(),),
    )
    with pytest.raises(PrivacyRefusal, match="checksum at period 1"):
        store.release(2, 5, SeededTestSampler(2))
    store.close()


def test_store_refuses_a_corrupt_or_foreign_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(PrivacyRefusal, match="unreadable"):
        _open(junk)
    foreign = tmp_path / "foreign.sqlite"
    _tamper(foreign, "CREATE TABLE t (x)")
    with pytest.raises(PrivacyRefusal, match="not a continual state"):
        _open(foreign)
    path = tmp_path / "s.sqlite"
    with _open(path) as store:
        store.release(1, 5, SeededTestSampler(1))
    data = bytearray(path.read_bytes())
    data[100:4000] = b"\xff" * 3900  # smash the first page
    path.write_bytes(bytes(data))
    with pytest.raises(PrivacyRefusal):
        _open(path)


# ----------------------------------------------------------------------------- pan-privacy


def _stored_values(path: Path) -> tuple[dict[int, int], dict[int, int]]:
    """Open the SQLite state as an intruder would: open and released node values by level."""
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT kind, level, value FROM nodes").fetchall()
    cols = [r[1] for r in conn.execute("PRAGMA table_info(nodes)")]
    conn.close()
    assert cols == ["stream_id", "kind", "level", "value"]  # nowhere to keep raw x or noise
    opened = {lvl: int(np.frombuffer(v, "<i8")[0]) for k, lvl, v in rows if k == "open"}
    released = {lvl: int(np.frombuffer(v, "<i8")[0]) for k, lvl, v in rows if k == "released"}
    return opened, released


def _raw_partial_sums(xs: list[int], t: int, levels: int) -> dict[int, int]:
    """The raw sum of the open level-j node after period t (periods since its start)."""
    return {j: sum(xs[(t // 2**j) * 2**j : t]) for j in range(levels)}


@pytest.mark.parametrize("pan_private", [True, False])
def test_pan_private_state_never_holds_raw_counts(tmp_path: Path, pan_private: bool) -> None:
    horizon, eps = 64, 0.5
    levels = tree_levels(horizon)
    b = node_scale(horizon, eps)
    p = math.exp(-1 / b)
    p_zero = (1 - p) / (1 + p)  # P[DLap = 0]: a noisy value can equal a raw one by chance
    rng = np.random.default_rng(8)
    xs = [int(v) for v in rng.integers(0, 1000, horizon)]
    path = tmp_path / "pan.sqlite"
    store = _open(
        path, horizon=horizon, epsilon=eps, pan_private=pan_private, sampler=SeededTestSampler(4)
    )
    equal_open = compared_open = equal_raw = compared_raw = 0
    nodes_seen: set[tuple[int, int]] = set()
    nodes_equal: set[tuple[int, int]] = set()
    for t in range(1, horizon + 1):
        store.release(t, xs[t - 1], SeededTestSampler(100 + t))
        opened, released = _stored_values(path)
        assert sorted(released) == nodes_used(t)  # closed nodes not needed are erased
        assert sorted(opened) == ([] if t == horizon else list(range(levels)))
        raw = _raw_partial_sums(xs, t, levels)
        for j, value in opened.items():
            node = (j, t // 2**j)  # a node keeps its creation noise N for its whole life
            nodes_seen.add(node)
            compared_open += 1
            equal_open += value == raw[j]
            if value == raw[j]:
                nodes_equal.add(node)
        raw_values = {sum(xs[:t]), xs[t - 1], *raw.values()}
        for value in [*opened.values(), *released.values()]:
            compared_raw += 1
            equal_raw += value in raw_values
    store.close()
    if pan_private:
        # Only chance coincidences: nodes whose creation noise is exactly 0 (P = p_zero each;
        # a zero-noise node matches at every period of its life, so count nodes, not reads).
        assert len(nodes_seen) > 100
        assert len(nodes_equal) <= 3 * p_zero * len(nodes_seen) + 3, (nodes_equal, p_zero)
        assert equal_open < 0.1 * compared_open, (equal_open, compared_open)
        assert equal_raw < 0.1 * compared_raw, (equal_raw, compared_raw)
    else:
        assert equal_open == compared_open  # the standard state holds raw partial sums


def test_pan_private_superseded_values_do_not_linger_in_the_file(tmp_path: Path) -> None:
    # 64 cells: node BLOBs span pages, where SQLite would otherwise leave deleted cells behind
    path = tmp_path / "pan.sqlite"
    store = _open(path, horizon=16, pan_private=True, cells=64)
    snapshots: list[bytes] = []
    for t in range(1, 9):
        store.release(t, np.full(64, 1_000_000_007 * t), SeededTestSampler(t))
        conn = sqlite3.connect(path)
        rows = conn.execute("SELECT value FROM nodes WHERE kind = 'open'").fetchall()
        conn.close()
        # values holding counts are distinctive 8-byte patterns (pure noise is not)
        snapshots += [r[0][:8] for r in rows if abs(int(np.frombuffer(r[0][:8], "<i8")[0])) > 1e6]
    store.close()
    conn = sqlite3.connect(path)
    current = {r[0][:8] for r in conn.execute("SELECT value FROM nodes")}
    for (blob,) in conn.execute("SELECT counts FROM releases"):
        current |= {blob[i : i + 8] for i in range(0, len(blob), 8)}
    conn.close()
    data = path.read_bytes()
    assert len(snapshots) > 20
    stale = [s for s in snapshots if s not in current and s in data]
    assert not stale  # secure_delete zeroed every superseded open-node value


def test_one_period_update_with_t_2_pow_20_is_fast(tmp_path: Path) -> None:
    path = tmp_path / "big.sqlite"
    sampler = SecureSampler()
    store = ContinualStore.open(path, "big", 2**20, 1.0, sampler, cells=16, pan_private=True)
    t0 = time.perf_counter()
    for t in (1, 2, 3, 4):
        store.release(t, np.arange(16), sampler)
    assert (time.perf_counter() - t0) / 4 < 1.0
    # worst case in memory: period T closes every one of the 21 levels
    state = start(2**20, 1.0, sampler, cells=16, pan_private=True)
    state.period = 2**20 - 1
    state.released = {j: np.zeros(16, dtype=np.int64) for j in range(20)}
    t0 = time.perf_counter()
    _, out = advance(state, 2**20, np.arange(16), sampler)
    assert time.perf_counter() - t0 < 1.0 and out.levels_used == (20,)
    store.close()
