"""dp.continual and dp.state_store: the tree mechanism's error matches theory; the stored
state refuses re-runs, skips, overruns, parameter changes, tampering and rollback; the
pan-private state holds X = N + Σx and open-node noise only, and an intruder holding it and
every release learns nothing beyond ε; person-level streams cost what they claim."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from privpipe.dp.continual import (
    TreeCounter,
    advance,
    node_scale,
    nodes_used,
    pan_private_shift,
    person_l1_bound,
    release_variance,
    round_horizon,
    start,
    stream_sensitivity,
    tree_levels,
)
from privpipe.dp.noise import SecureSampler, SeededTestSampler, discrete_laplace_variance
from privpipe.dp.state_store import ContinualStore, load, state_path
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
    for t in (1, 7, 16):  # pan-private: N plus one node per level (L + 1 = 6 terms)
        assert release_variance(t, 16, 1.0, pan_private=True) == pytest.approx(
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
        k = tree_levels(16) + 1 if pan_private else len(nodes_used(t))
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
    # pan-private: X = N + Σx and the noise of the open node of levels 1..L-1, nothing else
    s = start(16, 1.0, SeededTestSampler(2), cells=2, pan_private=True)
    assert s.running is not None and sorted(s.open_nodes) == [1, 2, 3, 4] and not s.released
    n0 = s.running.copy()
    for t in range(1, 17):
        new, _ = advance(s, t, [1, 2], SeededTestSampler(t))
        assert np.array_equal(new.running, n0 + t * np.array([1, 2]))  # type: ignore[arg-type]
        assert not new.released
        assert sorted(new.open_nodes) == ([] if t == 16 else [1, 2, 3, 4])
        for j in range(1, 5):  # a node's noise is kept while open, replaced when it closes
            if t < 16 and t % 2**j:
                assert np.array_equal(new.open_nodes[j], s.open_nodes[j])
        s = new


# ----------------------------------------------------------------------------- the store


class FakeLedger:
    """The three ledger calls the state uses (dp.state_store.StreamLedger), in memory."""

    def __init__(self, key: bytes = b"k" * 32) -> None:
        self.key = key
        self.periods: dict[str, int] = {}

    def derive_key(self, purpose: str) -> bytes:
        return self.key + purpose.encode()

    def stream_period(self, stream: str) -> int:
        return self.periods.get(stream, 0)

    def advance_stream(self, run_id: str, stream: str, period: int) -> None:
        if period != self.stream_period(stream) + 1:
            raise PrivacyRefusal(f"period {period} is not the next one")
        self.periods[stream] = period


def _open(path: Path, ledger: FakeLedger, **kw: object) -> ContinualStore:
    args: dict[str, object] = {
        "stream_id": "visits",
        "ledger": ledger,
        "horizon": 8,
        "epsilon": 1.0,
        "sampler": SeededTestSampler(3),
    }
    args.update(kw)
    return ContinualStore.open(path, **args)  # type: ignore[arg-type]


def _rel(store: ContinualStore, t: int, x: object) -> np.ndarray:
    return store.release(t, x, SeededTestSampler(t), "run").counts  # type: ignore[arg-type]


def test_store_releases_in_order_and_persists(tmp_path: Path) -> None:
    path = state_path(tmp_path, "demo data")
    assert path.name == "demo_data.continual.sqlite"
    ledger = FakeLedger()
    with _open(path, ledger) as store:
        for t in (1, 2, 3):
            _rel(store, t, 10)
    assert path.stat().st_mode & 0o777 == 0o600
    with _open(path, ledger) as store:  # a later scheduled run continues the stream
        assert store.info().period == 3 and store.info().unit == "event"
        out = store.release(4, 10, SeededTestSampler(4), "run")
        assert out.levels_used == (2,)
    assert ledger.periods == {"visits": 4}
    with pytest.raises(ConfigError, match="holds the state of stream 'visits'"):
        _open(path, ledger, stream_id="other")  # one stream per file


def test_store_refuses_rerun_skip_overrun(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = _open(path, FakeLedger(), horizon=4)
    _rel(store, 1, 5)
    with pytest.raises(PrivacyRefusal, match="period 1 of stream 'visits' was already released"):
        _rel(store, 1, 5)
    with pytest.raises(PrivacyRefusal, match="period 3 of stream 'visits' cannot be released"):
        _rel(store, 3, 5)
    for t in (2, 3, 4):
        _rel(store, t, 5)
    with pytest.raises(PrivacyRefusal, match="period 5 of stream 'visits' exceeds"):
        _rel(store, 5, 5)
    assert store.info().period == 4  # refusals changed nothing


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epsilon": 2.0}, "epsilon=1 \\(asked 2\\)"),
        ({"horizon": 16}, "T=8 \\(asked 16\\)"),
        ({"pan_private": True}, "pan_private"),
        ({"cells": 3}, "cells"),
        ({"unit": "person", "sensitivity": 8}, "unit=event \\(asked person\\)"),
    ],
)
def test_store_refuses_changed_parameters(
    tmp_path: Path, change: dict[str, object], match: str
) -> None:
    path = tmp_path / "s.sqlite"
    ledger = FakeLedger()
    with _open(path, ledger) as store:
        _rel(store, 1, 5)
    with pytest.raises(PrivacyRefusal, match=match):
        _open(path, ledger, **change)
    with _open(path, ledger, horizon=7) as same:  # 7 rounds to the same T = 8
        assert same.info().horizon == 8


def _tamper(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, params)
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE nodes SET value = ? WHERE kind = 'running'",
        "UPDATE nodes SET value = ? WHERE kind = 'open' AND level = 1",
        "DELETE FROM nodes WHERE kind = 'open' AND level = 2",
        "UPDATE meta SET value = '2' WHERE key = 'epsilon'",
        "UPDATE meta SET value = 'person' WHERE key = 'unit'",
    ],
)
def test_store_refuses_a_tampered_state(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "s.sqlite"
    ledger = FakeLedger()
    with _open(path, ledger, pan_private=True) as store:
        for t in (1, 2, 3):
            _rel(store, t, 5)
    params = (np.array([123], dtype="<i8").tobytes(),) if "?" in sql else ()
    _tamper(path, sql, params)
    with pytest.raises(InputDataError, match="failed its authentication"):
        _open(path, ledger, pan_private=True)
    with pytest.raises(InputDataError, match="failed its authentication"):
        load(path, "visits", ledger)


def test_store_made_under_another_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    ledger = FakeLedger()
    with _open(path, ledger) as store:
        _rel(store, 1, 5)
    other = FakeLedger(key=b"x" * 32)  # a forger without the key recomputes the MAC wrongly
    other.periods = dict(ledger.periods)
    with pytest.raises(InputDataError, match="failed its authentication"):
        _open(path, other)


def test_store_rollback_and_deletion_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    ledger = FakeLedger()
    store = _open(path, ledger, pan_private=True)
    _rel(store, 1, 5)
    old = path.read_bytes()  # an operator's (or intruder's) copy of the state at period 1
    _rel(store, 2, 7)
    path.write_bytes(old)  # copy back: the authentic state of period 1
    with pytest.raises(InputDataError, match=r"at period 1 but the ledger records period 2"):
        _rel(store, 2, 7)  # would re-release period 2 with fresh noise
    with pytest.raises(InputDataError, match="rollback"):
        _open(path, ledger, pan_private=True)
    path.unlink()
    with pytest.raises(InputDataError, match="missing, but the ledger records period 2"):
        _open(path, ledger, pan_private=True)


def test_store_refuses_a_corrupt_or_foreign_file(tmp_path: Path) -> None:
    ledger = FakeLedger()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    ledger.periods["visits"] = 1
    with pytest.raises(InputDataError, match="unreadable"):
        _open(junk, ledger)
    foreign = tmp_path / "foreign.sqlite"
    _tamper(foreign, "CREATE TABLE t (x)")
    with pytest.raises(InputDataError, match="not a continual state"):
        _open(foreign, ledger)
    path = tmp_path / "s.sqlite"
    ledger = FakeLedger()
    with _open(path, ledger) as store:
        _rel(store, 1, 5)
    data = bytearray(path.read_bytes())
    data[100:4000] = b"\xff" * 3900  # smash the first page
    path.write_bytes(bytes(data))
    with pytest.raises(InputDataError):
        _open(path, ledger)


# ----------------------------------------------------------------------------- pan-privacy


def _i8(v: int) -> bytes:
    return int(v).to_bytes(8, "little", signed=True)


def test_pan_private_state_file_holds_no_past_value(tmp_path: Path) -> None:
    """After each period the file (and any journal beside it) holds X_t and open-node noise
    only: no earlier running sum (exact or noisy), no period count, no digest."""
    path = tmp_path / "pan.sqlite"
    ledger = FakeLedger()
    store = _open(path, ledger, horizon=16, pan_private=True, cells=4)
    xs = [np.full(4, 1_000_003 * t + 17) for t in range(1, 13)]
    n0 = load(path, "visits", ledger)[1].running
    assert n0 is not None
    past: list[bytes] = []
    for t, x in enumerate(xs, start=1):
        _rel(store, t, x)
        exact = sum(xs[:t])
        state = load(path, "visits", ledger)[1]
        assert np.array_equal(state.running, n0 + exact)  # X_t = N + x_1 + ... + x_t
        files = sorted(f.name for f in tmp_path.iterdir())
        assert files == ["pan.sqlite", "pan.sqlite.lock"]  # no journal, WAL or temp copy
        data = path.read_bytes()
        for value in past:
            assert value not in data
        assert sum(_i8(v) in data for v in n0 + exact) == 4  # the current X_t is there
        past += [_i8(v) for v in np.concatenate([n0 + exact, exact, x])]
    assert len(past) == 12 * 12
    for table in ("releases", "streams"):
        with sqlite3.connect(path) as conn:
            assert (
                conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
                is None
            )


class ScriptedSampler:
    """Discrete Laplace noise taken in order from a script (exact-view tests only)."""

    def __init__(self, noise: list[int]) -> None:
        self.noise, self.used = list(noise), 0

    def discrete_laplace(self, values: np.ndarray, scale: float) -> np.ndarray:
        k = values.size
        out = values + np.array(self.noise[self.used : self.used + k], dtype=np.int64)
        self.used += k
        return out

    def discrete_gaussian(self, values: np.ndarray, sigma: float) -> np.ndarray:
        raise AssertionError("not used")


def _node_order(horizon: int) -> list[tuple[int, int]]:
    """The draw order of the pan-private counter: (level, last period) per draw; (-1, 0) = N."""
    levels = tree_levels(horizon)
    order = [(-1, 0), *[(j, 1 << j) for j in range(1, levels)]]
    for t in range(1, horizon + 1):
        order.append((0, t))
        if t < horizon:
            order += [(j, t + (1 << j)) for j in range(1, levels) if t % (1 << j) == 0]
    return order


def _pan_view(horizon: int, xs: list[int], noise: list[int], seen: int) -> tuple[object, ...]:
    """Every release and the state read after period ``seen`` (the intruder's whole view)."""
    state = start(horizon, 1.0, ScriptedSampler(noise), pan_private=True)
    releases, stolen = [], None
    sampler = ScriptedSampler(noise)
    sampler.used = tree_levels(horizon)
    for t, x in enumerate(xs, start=1):
        state, out = advance(state, t, x, sampler)  # type: ignore[arg-type]
        releases.append(int(out.counts[0]))
        if t == seen:
            assert state.running is not None
            stolen = (int(state.running[0]), {j: int(v[0]) for j, v in state.open_nodes.items()})
    return tuple(releases), stolen


def test_intruder_with_state_and_every_release_cannot_tell_neighbours() -> None:
    """For every period read by the intruder and every period changed by Δ, a noise shift of
    L1 ≤ L·Δ (dp.continual.pan_private_shift) gives the neighbour the IDENTICAL view, so the
    view is ε-DP with b = L·Δ/ε; nothing derived from past states breaks the tie."""
    horizon = 8
    levels = tree_levels(horizon)
    order = _node_order(horizon)
    rng = np.random.default_rng(12)
    noise = [int(v) for v in rng.integers(-6, 7, len(order))]
    xs = [4, 9, 6, 3, 0, 5, 8, 2]
    for seen in range(1, horizon + 1):
        view = _pan_view(horizon, xs, noise, seen)
        for event in range(1, horizon + 1):
            for delta in (1, -3):
                sign, nodes = pan_private_shift(horizon, event, seen)
                assert abs(sign) + len(nodes) <= levels  # privacy loss ≤ L·|Δ|/b = ε
                shifted = list(noise)
                shifted[order.index((-1, 0))] += sign * delta
                for node in nodes:
                    shifted[order.index(node)] += delta if sign else -delta
                ys = list(xs)
                ys[event - 1] += delta
                assert _pan_view(horizon, ys, shifted, seen) == view, (seen, event)
                assert _pan_view(horizon, ys, noise, seen) != view  # Δ is visible unshifted


def _dlap_pmf(k: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1 / scale)
    return (1 - q) / (1 + q) * np.exp(-np.abs(k) / scale)


def test_old_digest_attack_recovers_nothing(tmp_path: Path) -> None:
    """Issue 12's attack: single-cell stream, periods 4, 9, 6; the intruder steals the state
    file after period 3, holds every release and knows x_1, x_2. It brute-forces x_3 and the
    unknown noise terms. A digest of past states pinned x_3 = 6 (and N); now the file holds
    X_3 and open-node noise only, and the exact posterior over x_3 moves by at most e^ε
    per unit: nothing is recovered beyond what ε allows."""
    ledger = FakeLedger()
    path = tmp_path / "s.sqlite"
    eps, xs = 0.5, [4, 9, 6]
    store = _open(path, ledger, horizon=4, pan_private=True, epsilon=eps,
                  sampler=SecureSampler())  # fmt: skip
    released = [int(store.release(t, x, SecureSampler(), "r").counts[0]) for t, x in
                enumerate(xs, start=1)]  # fmt: skip
    with sqlite3.connect(path) as conn:
        stolen = {(k, j): int(np.frombuffer(v, "<i8")[0]) for k, j, v in conn.execute(
            "SELECT kind, level, value FROM nodes")}  # fmt: skip
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert set(stolen) == {("running", 0), ("open", 1), ("open", 2)}
    assert tables == {"meta", "nodes"} and set(meta) == {"schema_version", "mac", *META}
    b = node_scale(4, eps)
    big_x, root = stolen[("running", 0)], stolen[("open", 2)]  # X_3; η of [1,4] (open)
    h = np.arange(-400, 401)  # η of the closed node [1,2]: marginalised out
    like = []
    for x3 in range(0, 31):
        n = big_x - 13 - x3  # N is fixed by X_3 for each candidate
        # o_1 = N + x1 + η0(1) + η[1,2] + η[1,4];  o_2 = N + x1 + x2 + η0(2) + η[1,2] + η[1,4]
        # (o_3 = X_3 + η0(3) + η[3,4] + η[1,4] does not depend on x3 given X_3)
        e1 = released[0] - n - 4 - root - h
        e2 = released[1] - n - 13 - root - h
        terms = _dlap_pmf(np.array([n]), b) * _dlap_pmf(e1, b) * _dlap_pmf(e2, b)
        like.append(float((terms * _dlap_pmf(h, b)).sum()))
    post = np.array(like) / sum(like)
    ratios = post[1:] / post[:-1]
    tol = 1 + 1e-9
    assert np.all(ratios <= math.exp(eps) * tol) and np.all(ratios >= math.exp(-eps) / tol)
    assert post.max() < 0.5 and (post > 1e-3).sum() >= 10  # no candidate pinned


META = (
    "stream_id", "horizon", "epsilon", "cells", "sensitivity", "pan_private", "unit",
    "period", "created_at",
)  # fmt: skip


# ----------------------------------------------------------------------------- person unit


def test_person_unit_l1_bound_on_exact_node_values() -> None:
    """A person in m periods, c per period: ‖Δ node values‖_1 ≤ m·c·L, tight for m = T."""
    horizon, c = 16, 3
    levels = tree_levels(horizon)
    rng = np.random.default_rng(4)

    def nodes(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x.reshape(-1, 2**j).sum(axis=1) for j in range(levels)])

    base = rng.integers(0, 50, horizon)
    for m in (1, 2, 5, 16):
        worst = 0
        for _ in range(200):
            present = rng.choice(horizon, m, replace=False)
            with_person = base.copy()
            with_person[present] += rng.integers(1, c + 1, m)
            worst = max(worst, int(np.abs(nodes(with_person) - nodes(base)).sum()))
        assert worst <= person_l1_bound(horizon, m, c) == m * c * levels
    everywhere = base + c  # present in every period with c each
    assert int(np.abs(nodes(everywhere) - nodes(base)).sum()) == person_l1_bound(horizon, 16, c)
    # the tree calibrated for the person unit: b = m·c·L/ε; event level is m times smaller
    assert node_scale(horizon, 1.0, stream_sensitivity(c, "person", 16)) == pytest.approx(
        person_l1_bound(horizon, 16, c) / 1.0
    )
    assert node_scale(horizon, 1.0, stream_sensitivity(c, "event")) * 16 == pytest.approx(
        node_scale(horizon, 1.0, stream_sensitivity(c, "person", 16))
    )
    with pytest.raises(ConfigError, match="exceeds the horizon"):
        person_l1_bound(horizon, 17, c)


def _epsilon_lb(k1: int, k0: int, n: int, alpha: float) -> float:
    """REFERENCE.md audit: ε_LB = ln(p1_lo/p0_hi), Clopper–Pearson at level α."""
    p1_lo = float(beta_dist.ppf(alpha / 2, k1, n - k1 + 1)) if k1 > 0 else 0.0
    p0_hi = float(beta_dist.ppf(1 - alpha / 2, k0 + 1, n - k0)) if k0 < n else 1.0
    return math.log(p1_lo / p0_hi) if p1_lo > 0 else -math.inf


def _audit_person_stream(sensitivity: int, pan_private: bool, n: int, alpha: float) -> float:
    """Max ε_LB of a T=2 stream, D: a person in both periods (x = 1, 1) vs D': absent.

    n independent counters run at once as n cells; S = {o_1 ≥ 1 and o_2 ≥ 2}, both ways."""
    runs = {}
    for x in (0, 1):
        counter = TreeCounter(2, 1.0, SecureSampler(), cells=n, sensitivity=sensitivity,
                              pan_private=pan_private)  # fmt: skip
        o1 = counter.release(1, np.full(n, x)).counts
        o2 = counter.release(2, np.full(n, x)).counts
        runs[x] = int(((o1 >= 1) & (o2 >= 2)).sum())
    a = alpha / 2
    return max(_epsilon_lb(runs[1], runs[0], n, a), _epsilon_lb(runs[0], runs[1], n, a))


@pytest.mark.slow
def test_person_unit_empirical_epsilon_audit() -> None:
    """Calibrated to m·c (person unit) the stream passes ε = 1 for a person in every period;
    calibrated to c (event level) the same person costs more than ε and the audit says no."""
    n, alpha = 30_000, 1e-4
    assert _audit_person_stream(stream_sensitivity(1, "person", 2), False, n, alpha) <= 1.0
    assert _audit_person_stream(stream_sensitivity(1, "person", 2), True, n, alpha) <= 1.0
    assert _audit_person_stream(stream_sensitivity(1, "event"), False, n, alpha) > 1.0


# ----------------------------------------------------------------------------- ledger


def test_one_period_update_with_t_2_pow_20_is_fast(tmp_path: Path) -> None:
    path = tmp_path / "big.sqlite"
    sampler = SecureSampler()
    ledger = FakeLedger()
    store = ContinualStore.open(path, "big", ledger, 2**20, 1.0, sampler, cells=16,
                                pan_private=True)  # fmt: skip
    t0 = time.perf_counter()
    for t in (1, 2, 3, 4):
        store.release(t, np.arange(16), sampler, "r")
    assert (time.perf_counter() - t0) / 4 < 1.0
    # worst case in memory: period T closes every one of the 21 levels
    state = start(2**20, 1.0, sampler, cells=16, pan_private=True)
    state.period = 2**20 - 1
    t0 = time.perf_counter()
    _, out = advance(state, 2**20, np.arange(16), sampler)
    assert time.perf_counter() - t0 < 1.0 and out.levels_used == tuple(range(21))
