"""The lifetime ledger: charges, refusals, corruption, other datasets, concurrency."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.synchronize
import sqlite3
import time
from fractions import Fraction
from pathlib import Path

import pytest

from dp.budget import ApproxBudget, PureBudget, RhoBudget
from dp.ledger import Ledger, ledger_path
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal


def test_charge_spent_remaining_history(tmp_path: Path) -> None:
    with Ledger.open(tmp_path, "census", 1) as ledger:
        assert ledger.path == ledger_path(tmp_path, "census")
        ledger.charge("run1", "counts", PureBudget(0.1))
        ledger.charge("run1", "sums", PureBudget(0.2))
        assert ledger.spent() == ApproxBudget("0.3", 0)
        assert ledger.spent().epsilon == Fraction(3, 10)
        assert ledger.remaining() == ApproxBudget("0.7", 0)
        hist = ledger.history()
        assert [(e.run_id, e.release, e.status) for e in hist] == [
            ("run1", "counts", "committed"),
            ("run1", "sums", "committed"),
        ]
    # Persisted: a new process-level open sees the same spend.
    with Ledger.open(tmp_path, "census", 1) as again:
        assert again.spent().epsilon == Fraction(3, 10)


def test_refusal_message_and_exact_fill(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "l.sqlite", "d", 10)
    ledger.charge("r1", "a", PureBudget("8.5"))
    with pytest.raises(PrivacyRefusal, match=r"has epsilon 1\.5 of 10 left.*need epsilon 2") as e:
        ledger.charge("r2", "b", PureBudget(2))
    assert e.value.exit_code == 4
    assert len(ledger.history()) == 1  # the refused charge left no entry
    for _ in range(15):
        ledger.charge("r3", "c", PureBudget(0.1))
    assert ledger.remaining() == ApproxBudget(0, 0)
    with pytest.raises(PrivacyRefusal):
        ledger.charge("r4", "d", PureBudget("0.0001"))


def test_delta_is_budgeted(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "l.sqlite", "d", 10, "1e-6")
    with pytest.raises(PrivacyRefusal, match="delta"):
        Ledger.open(tmp_path / "p.sqlite", "p", 10).charge("r", "a", ApproxBudget(1, 1e-9))
    ledger.charge("r", "a", ApproxBudget(1, "6e-7"))
    with pytest.raises(PrivacyRefusal):
        ledger.charge("r", "b", ApproxBudget(1, "5e-7"))
    with pytest.raises(ConfigError, match="to_approx"):
        ledger.charge("r", "c", RhoBudget(0.1))


def test_mark_failed_keeps_spend(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "l.sqlite", "d", 1)
    ledger.charge("r1", "a", PureBudget(0.4))
    assert ledger.mark_failed("r1", "worker crashed") == 1
    entry = ledger.history()[0]
    assert (entry.status, entry.reason) == ("failed", "worker crashed")
    assert ledger.spent().epsilon == Fraction(2, 5)
    with pytest.raises(ConfigError, match="no entries"):
        ledger.mark_failed("nope", "x")


def test_other_dataset_and_changed_lifetime_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    Ledger.open(path, "census", 1).close()
    with pytest.raises(InputDataError, match="belongs to dataset 'census'"):
        Ledger.open(path, "hospital", 1)
    with pytest.raises(ConfigError, match="lifetime"):
        Ledger.open(path, "census", 2)


def test_not_sqlite_is_input_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    path.write_bytes(b"this is not a database, just some text " * 20)
    with pytest.raises(InputDataError, match="restore") as e:
        Ledger.open(path, "d", 1)
    assert e.value.exit_code == 3


def test_wrong_schema_is_input_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(InputDataError, match="not a privacy ledger"):
        Ledger.open(path, "d", 1)


def _tamper(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE entries SET epsilon = '1/100' WHERE id = 1",
        "DELETE FROM entries WHERE id = 1",
        "DELETE FROM entries WHERE id = 2",  # truncation: caught by the stored head
        "UPDATE entries SET epsilon = 'garbage' WHERE id = 2",
    ],
)
def test_tampering_detected(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "l.sqlite"
    ledger = Ledger.open(path, "d", 1)
    ledger.charge("r1", "a", PureBudget(0.3))
    ledger.charge("r2", "b", PureBudget(0.3))
    ledger.close()
    _tamper(path, sql)
    with pytest.raises(InputDataError, match="checksum"):
        Ledger.open(path, "d", 1)


def test_lock_timeout_is_refusal(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    ledger = Ledger.open(path, "d", 1, timeout=0.2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(PrivacyRefusal, match="locked"):
            ledger.charge("r", "a", PureBudget(0.1))
        with pytest.raises(PrivacyRefusal, match="locked"):
            Ledger.open(path, "d", 1, timeout=0.2)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    ledger.charge("r", "a", PureBudget(0.1))


def _worker(
    path: str,
    worker: int,
    attempts: int,
    start: mp.synchronize.Event,
    queue: mp.Queue,  # type: ignore[type-arg]
) -> None:
    ledger = Ledger.open(path, "shared", 1)
    start.wait(30)  # all workers charge at the same moment
    granted = 0
    for i in range(attempts):
        try:
            ledger.charge(f"w{worker}", f"release{i}", PureBudget(0.01))
            granted += 1
        except PrivacyRefusal:
            pass
        time.sleep(0.002)  # lets the other workers in between, so charges interleave
    ledger.close()
    queue.put(granted)


def test_concurrent_processes_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    Ledger.open(path, "shared", 1).close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(str(path), w, 40, start, queue)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    granted = sum(queue.get(timeout=5) for _ in procs)
    with Ledger.open(path, "shared", 1) as ledger:
        hist = ledger.history()
        assert len(hist) == granted == 100  # 1 / 0.01 exactly: no lost or extra entries
        assert ledger.spent().epsilon == 1
        assert len({e.id for e in hist}) == len(hist)
        assert len({e.run_id for e in hist}) >= 3  # 40 attempts each: 3+ workers got some
