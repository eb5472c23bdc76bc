"""The lifetime ledger: creation on purpose, charges, refusals, authentication (HMAC under
a key outside the file), rollback detection (heads file), event-level entries, stream
periods, file modes, concurrency."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import multiprocessing.synchronize
import os
import shutil
import sqlite3
import stat
import time
from fractions import Fraction
from pathlib import Path

import pytest

from privpipe.dp.budget import ApproxBudget, PureBudget, RhoBudget
from privpipe.dp.ledger import Ledger, ledger_path
from privpipe.dp.ledger_auth import HeadRecord, LedgerKey, load_key, new_key_file
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal


def key_of(tmp: Path, dataset: str = "d") -> LedgerKey:
    """The session's env key (tests/conftest.py) with a heads file in the tmp folder."""
    return load_key(dataset, heads_file=tmp / "keys" / "heads.json")


def make(
    tmp: Path,
    dataset: str = "d",
    eps: object = 1,
    delta: object = 0,
    name: str = "l.sqlite",
    timeout: float = 10.0,
) -> Ledger:
    """Create a ledger (as `budget init` does) and open it."""
    key = key_of(tmp, dataset)
    path = Ledger.create(tmp / name, dataset, ApproxBudget(eps, delta), key)  # type: ignore[arg-type]
    return Ledger.open(path, dataset, key, timeout=timeout)


def reopen(tmp: Path, dataset: str = "d", name: str = "l.sqlite", **kw: object) -> Ledger:
    return Ledger.open(tmp / name, dataset, key_of(tmp, dataset), **kw)  # type: ignore[arg-type]


def test_charge_spent_remaining_history(tmp_path: Path) -> None:
    key = key_of(tmp_path, "census")
    Ledger.create(tmp_path, "census", ApproxBudget(1, 0), key)  # a folder: one file per dataset
    with Ledger.open(tmp_path, "census", key) as ledger:
        assert ledger.path == ledger_path(tmp_path, "census").resolve()
        ledger.charge("run1", "counts", PureBudget(0.1))
        ledger.charge("run1", "sums", PureBudget(0.2))
        assert ledger.spent() == ApproxBudget("0.3", 0)
        assert ledger.spent().epsilon == Fraction(3, 10)
        assert ledger.remaining() == ApproxBudget("0.7", 0)
        hist = ledger.history()
        assert [(e.run_id, e.release, e.status, e.unit) for e in hist] == [
            ("run1", "counts", "committed", "person"),
            ("run1", "sums", "committed", "person"),
        ]
    with Ledger.open(tmp_path, "census", key) as again:  # persisted
        assert again.spent().epsilon == Fraction(3, 10)
        assert again.lifetime == ApproxBudget(1, 0)  # read from the ledger, not given


def test_refusal_message_and_exact_fill(tmp_path: Path) -> None:
    ledger = make(tmp_path, eps=10)
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
    ledger = make(tmp_path, eps=10, delta="1e-6")
    with pytest.raises(PrivacyRefusal, match="delta"):
        make(tmp_path, "p", 10, name="p.sqlite").charge("r", "a", ApproxBudget(1, 1e-9))
    ledger.charge("r", "a", ApproxBudget(1, "6e-7"))
    with pytest.raises(PrivacyRefusal):
        ledger.charge("r", "b", ApproxBudget(1, "5e-7"))
    with pytest.raises(ConfigError, match="to_approx"):
        ledger.charge("r", "c", RhoBudget(0.1))


def test_mark_failed_keeps_spend_and_its_status_is_authenticated(tmp_path: Path) -> None:
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.4))
    assert ledger.mark_failed("r1", "worker crashed") == 1
    entry = ledger.history()[0]
    assert (entry.status, entry.reason) == ("failed", "worker crashed")
    assert ledger.spent().epsilon == Fraction(2, 5)
    with pytest.raises(ConfigError, match="no entries"):
        ledger.mark_failed("nope", "x")
    ledger.close()
    reopen(tmp_path).close()
    _tamper(tmp_path / "l.sqlite", "UPDATE entries SET reason = 'all fine'")
    with pytest.raises(InputDataError, match="status of entry 1"):
        reopen(tmp_path)


def test_renamed_dataset_and_changed_lifetime_refused(tmp_path: Path) -> None:
    make(tmp_path, "census").close()
    path = tmp_path / "l.sqlite"
    with pytest.raises(InputDataError, match="belongs to dataset 'census'") as e:
        Ledger.open(path, "hospital", key_of(tmp_path, "hospital"))
    assert e.value.exit_code == 3
    with pytest.raises(ConfigError, match="lifetime budget cannot change"):
        Ledger.open(path, "census", key_of(tmp_path, "census"), Fraction(2))
    with pytest.raises(ConfigError, match="lifetime"):
        Ledger.open(path, "census", key_of(tmp_path, "census"), Fraction(1), Fraction(1, 10))
    Ledger.open(path, "census", key_of(tmp_path, "census"), Fraction(1), Fraction(0)).close()


def test_missing_ledger_is_exit_2_with_the_init_command_and_nothing_created(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sub" / "l.sqlite"
    with pytest.raises(ConfigError, match="privpipe budget init") as e:
        Ledger.open(path, "d", key_of(tmp_path), Fraction(5), Fraction(1, 10**6))
    assert e.value.exit_code == 2
    msg = str(e.value)
    assert f"init {path.resolve()} --dataset d --epsilon 5 --delta 1/1000000 --heads" in msg
    assert not path.exists() and not path.parent.exists()


def test_init_never_overwrites_nor_restarts_a_lifetime(tmp_path: Path) -> None:
    make(tmp_path).close()
    with pytest.raises(ConfigError, match="already exists"):
        Ledger.create(tmp_path / "l.sqlite", "d", ApproxBudget(100, 0), key_of(tmp_path))
    (tmp_path / "l.sqlite").unlink()
    with pytest.raises(InputDataError, match=r"cannot be\s+restarted"):
        Ledger.create(tmp_path / "l.sqlite", "d", ApproxBudget(100, 0), key_of(tmp_path))
    assert not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_deleted_or_truncated_ledger_is_exit_3(tmp_path: Path, how: str) -> None:
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.5))
    ledger.close()
    path = tmp_path / "l.sqlite"
    if how == "deleted":
        path.unlink()
    else:
        path.write_bytes(b"")
    with pytest.raises(InputDataError, match="deleted or truncated") as e:
        reopen(tmp_path)
    assert e.value.exit_code == 3
    assert (path.exists(), path.stat().st_size if path.exists() else 0) == (how != "deleted", 0)


def test_moved_ledger_is_refused(tmp_path: Path) -> None:
    make(tmp_path).close()
    (tmp_path / "moved").mkdir()
    shutil.copy(tmp_path / "l.sqlite", tmp_path / "moved" / "l.sqlite")
    with pytest.raises(InputDataError, match="cannot be moved") as e:
        Ledger.open(tmp_path / "moved" / "l.sqlite", "d", key_of(tmp_path))
    assert e.value.exit_code == 3


def test_rolled_back_copy_is_refused(tmp_path: Path) -> None:
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.25))
    path = tmp_path / "l.sqlite"
    shutil.copy(path, tmp_path / "backup.sqlite")
    ledger.charge("r2", "b", PureBudget(0.5))
    ledger.close()
    shutil.copy(tmp_path / "backup.sqlite", path)  # the operator "restores a backup"
    with pytest.raises(InputDataError, match="older copy") as e:
        reopen(tmp_path)
    assert e.value.exit_code == 3 and "restore" not in str(e.value)


def test_a_write_interrupted_before_its_commit_does_not_lock_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heads file is written inside the transaction, before COMMIT: a crash between
    the two leaves the heads file ahead of the ledger. That ledger must open again (the
    interrupted charge never reached its caller, so no noise was drawn for it), while a
    ledger restored to a committed earlier head is still a rollback."""
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.25))
    shutil.copy(tmp_path / "l.sqlite", tmp_path / "backup.sqlite")
    honest = Ledger._append

    def crash(self: Ledger, entries: list[object]) -> None:
        honest(self, entries)  # type: ignore[arg-type]
        raise KeyboardInterrupt  # the process dies before COMMIT

    monkeypatch.setattr(Ledger, "_append", crash)
    with pytest.raises(KeyboardInterrupt):
        ledger.charge("r2", "b", PureBudget(0.5))
    monkeypatch.undo()
    ledger.close()
    assert key_of(tmp_path).read_heads()["d"].entries == 2  # the heads file is ahead
    with reopen(tmp_path) as again:
        assert again.spent() == ApproxBudget("0.25", 0)  # the interrupted charge is not there
        again.charge("r3", "c", PureBudget(0.5))
        assert again.spent() == ApproxBudget("0.75", 0)
    shutil.copy(tmp_path / "backup.sqlite", tmp_path / "l.sqlite")  # a committed head later
    with pytest.raises(InputDataError, match="older copy"):
        reopen(tmp_path)


def test_another_ledger_of_the_same_dataset_and_key_is_refused(tmp_path: Path) -> None:
    """Same length, other chain: a ledger created elsewhere for the dataset swapped in."""
    make(tmp_path).close()
    other = tmp_path / "other"
    other.mkdir()
    make(other).close()  # its own heads file (under other/keys)
    shutil.copy(other / "l.sqlite", tmp_path / "l.sqlite")
    with pytest.raises(InputDataError, match="is another copy"):
        reopen(tmp_path)


def test_not_sqlite_is_input_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    path.write_bytes(b"this is not a database, just some text " * 20)
    with pytest.raises(InputDataError, match="not a privacy ledger") as e:
        Ledger.open(path, "d", key_of(tmp_path))
    assert e.value.exit_code == 3 and str(path) in str(e.value)


def test_wrong_schema_is_input_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(InputDataError, match="not a privacy ledger"):
        Ledger.open(path, "d", key_of(tmp_path))


def _tamper(path: Path, *sql: str) -> None:
    conn = sqlite3.connect(path)
    for s in sql:
        conn.execute(s)
    conn.commit()
    conn.close()


def _forge(path: Path, mac: object) -> None:
    """Rewrite every ε to 0 and recompute meta MAC, chain and statuses with ``mac``."""
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    signed = [
        meta[k]
        for k in (
            "schema_version",
            "dataset",
            "lifetime_epsilon",
            "lifetime_delta",
            "ledger_id",
            "created_at",
        )
    ]
    head = mac("meta", signed)  # type: ignore[operator]
    conn.execute("UPDATE meta SET value = ? WHERE key = 'meta_mac'", (head,))
    rows = conn.execute(
        "SELECT id, run_id, kind, release, unit, delta, period, created_at, status, reason "
        "FROM entries ORDER BY id"
    ).fetchall()
    for ident, run_id, kind, release, unit, dlt, period, created, status, reason in rows:
        head = mac("entry", [head, ident, run_id, kind, release, unit, "0", dlt, period, created])  # type: ignore[operator]
        conn.execute(
            "UPDATE entries SET epsilon = '0', mac = ?, status_mac = ? WHERE id = ?",
            (head, mac("status", [head, status, reason]), ident),  # type: ignore[operator]
        )
    conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (head,))
    conn.commit()
    conn.close()


def _unkeyed(purpose: str, fields: object) -> str:
    return hashlib.sha256(f"{purpose}{fields!r}".encode()).hexdigest()


@pytest.mark.parametrize(
    "attack",
    [
        "edit-epsilon",
        "delete-first",
        "delete-last-and-fix-head",
        "garbage-epsilon",
        "lifetime-in-meta",
        "dataset-in-meta",
        "recomputed-unkeyed",
        "recomputed-wrong-key",
    ],
)
def test_tampering_detected(tmp_path: Path, attack: str) -> None:
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.3))
    ledger.charge("r2", "b", PureBudget(0.3))
    ledger.close()
    path = tmp_path / "l.sqlite"
    conn = sqlite3.connect(path)
    mac1 = conn.execute("SELECT mac FROM entries WHERE id = 1").fetchone()[0]
    conn.close()
    wrong = LedgerKey(b"w" * 64, "x", tmp_path / "h")
    sql = {
        "edit-epsilon": ["UPDATE entries SET epsilon = '1/100' WHERE id = 1"],
        "delete-first": ["DELETE FROM entries WHERE id = 1"],
        # a forger without the key can still roll the in-file head back by one entry
        "delete-last-and-fix-head": [
            "DELETE FROM entries WHERE id = 2",
            f"UPDATE meta SET value = '{mac1}' WHERE key = 'head'",
            "UPDATE meta SET value = '1' WHERE key = 'entries'",
        ],
        "garbage-epsilon": ["UPDATE entries SET epsilon = 'garbage' WHERE id = 2"],
        "lifetime-in-meta": ["UPDATE meta SET value = '1000' WHERE key = 'lifetime_epsilon'"],
        "dataset-in-meta": ["UPDATE meta SET value = 'e' WHERE key = 'dataset'"],
    }
    if attack == "recomputed-unkeyed":
        _forge(path, _unkeyed)
    elif attack == "recomputed-wrong-key":
        _forge(path, wrong.mac)
    else:
        _tamper(path, *sql[attack])
    with pytest.raises(InputDataError) as e:
        reopen(tmp_path)
    assert e.value.exit_code == 3
    assert "restore" not in str(e.value) and str(path) in str(e.value)


def test_the_forgery_is_accepted_only_with_the_real_key(tmp_path: Path) -> None:
    """The recomputation above is a faithful forgery: with the key it verifies (so the
    refusals in test_tampering_detected come from the key, not from a broken forger)."""
    ledger = make(tmp_path)
    ledger.charge("r1", "a", PureBudget(0.3))
    ledger.close()
    path = tmp_path / "l.sqlite"
    key = key_of(tmp_path)
    _forge(path, key.mac)
    with pytest.raises(InputDataError, match="is another copy"):  # the heads record differs
        reopen(tmp_path)
    conn = sqlite3.connect(path)
    head = conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0]
    conn.close()
    key.record_head("d", HeadRecord(str(path.resolve()), 1, head))
    with reopen(tmp_path) as forged:
        assert forged.spent().epsilon == 0


def test_edited_heads_file_is_refused(tmp_path: Path) -> None:
    make(tmp_path).close()
    heads = tmp_path / "keys" / "heads.json"
    heads.write_text(heads.read_text().replace('"entries": 0', '"entries": 5'))
    with pytest.raises(InputDataError, match=r"heads file .* corrupt or was edited"):
        reopen(tmp_path)


def test_a_ledger_unknown_to_the_heads_file_is_refused(tmp_path: Path) -> None:
    make(tmp_path).close()
    with pytest.raises(InputDataError, match="no record of the ledger"):
        Ledger.open(tmp_path / "l.sqlite", "d", load_key("d", heads_file=tmp_path / "other.json"))


def test_event_level_entries_do_not_count_against_the_lifetime(tmp_path: Path) -> None:
    ledger = make(tmp_path, eps=1)
    events = ledger.charge_many(
        "r1", [("clicks", PureBudget(5)), ("views", PureBudget(2))], unit="event"
    )
    assert [e.unit for e in events] == ["event", "event"]
    assert ledger.spent() == ApproxBudget(0, 0) and ledger.remaining() == ApproxBudget(1, 0)
    assert ledger.spent(unit="event").epsilon == 7
    ledger.charge("r2", "persons", PureBudget(1))  # the whole person-level lifetime still fits
    with pytest.raises(PrivacyRefusal):
        ledger.charge("r3", "more", PureBudget("0.1"))
    with pytest.raises(ConfigError, match="unit"):
        ledger.charge_many("r4", [("x", PureBudget(1))], unit="household")
    ledger.close()
    with reopen(tmp_path) as again:
        assert [e.unit for e in again.history()] == ["event", "event", "person"]
    _tamper(tmp_path / "l.sqlite", "UPDATE entries SET unit = 'event' WHERE id = 3")
    with pytest.raises(InputDataError):  # relabelling a person charge as event is an edit
        reopen(tmp_path)


def test_advance_stream_refuses_skipped_and_repeated_periods(tmp_path: Path) -> None:
    ledger = make(tmp_path)
    assert ledger.stream_period("daily") == 0
    ledger.advance_stream("r1", "daily", 1)
    with pytest.raises(PrivacyRefusal, match="repeat a published period"):
        ledger.advance_stream("r2", "daily", 1)
    with pytest.raises(PrivacyRefusal, match="skip periods"):
        ledger.advance_stream("r2", "daily", 3)
    ledger.advance_stream("r2", "daily", 2)
    ledger.advance_stream("r2", "weekly", 1)
    assert (ledger.stream_period("daily"), ledger.stream_period("weekly")) == (2, 1)
    assert ledger.spent() == ApproxBudget(0, 0)
    ledger.close()
    with reopen(tmp_path) as again:
        assert again.stream_period("daily") == 2
    _tamper(tmp_path / "l.sqlite", "UPDATE entries SET period = 1 WHERE id = 2")
    with pytest.raises(InputDataError):
        reopen(tmp_path)


def test_derive_key_is_a_per_purpose_subkey(tmp_path: Path) -> None:
    ledger = make(tmp_path)
    a, b = ledger.derive_key("continual-state"), ledger.derive_key("other")
    assert len(a) == 32 and a != b and a == ledger.derive_key("continual-state")
    assert a not in (ledger.key.secret, ledger.key.derive("entry"), ledger.key.derive("heads"))
    other = LedgerKey(b"z" * 64, "x", tmp_path / "h")
    assert other.derive("external/continual-state") != a


def test_head_moves_with_every_charge(tmp_path: Path) -> None:
    ledger = make(tmp_path)
    h0 = ledger.head()
    ledger.charge("r1", "a", PureBudget(0.1))
    h1 = ledger.head()
    assert (h0["entries"], h1["entries"], h1["dataset"]) == (0, 1, "d")
    assert h0["mac"] != h1["mac"] and len(h1["mac"]) == 64


def test_files_are_created_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        key_file = tmp_path / "k" / "ledger.key"
        new_key_file(key_file)
        key = load_key("d", key_file)
        Ledger.create(tmp_path / "l.sqlite", "d", ApproxBudget(1, 0), key)
        with Ledger.open(tmp_path / "l.sqlite", "d", key) as ledger:
            ledger.charge("r", "a", PureBudget(0.1))
    finally:
        os.umask(old)
    for f in (tmp_path / "l.sqlite", key_file, key.heads):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert key.heads == (tmp_path / "k" / "ledger.key.heads").resolve()


def test_key_problems_are_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "ledger.key"
    new_key_file(key_file)
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as e:
        load_key("d", key_file)
    assert e.value.exit_code == 2
    with pytest.raises(ConfigError, match="does not exist"):
        load_key("d", tmp_path / "nope.key")
    monkeypatch.delenv("PRIVPIPE_LEDGER_KEY")
    with pytest.raises(ConfigError, match=r"PRIVPIPE_LEDGER_KEY is not set.*openssl rand"):
        load_key("d")
    monkeypatch.setenv("MY_KEY", "short")
    with pytest.raises(ConfigError, match="too short"):
        load_key("d", key_env="MY_KEY")


def test_lock_timeout_is_refusal(tmp_path: Path) -> None:
    ledger = make(tmp_path, timeout=0.2)
    path = tmp_path / "l.sqlite"
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(PrivacyRefusal, match="locked"):
            ledger.charge("r", "a", PureBudget(0.1))
        with pytest.raises(PrivacyRefusal, match="locked"):
            reopen(tmp_path, timeout=0.2)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    ledger.charge("r", "a", PureBudget(0.1))


def _worker(
    tmp: str,
    worker: int,
    attempts: int,
    start: mp.synchronize.Event,
    queue: mp.Queue,  # type: ignore[type-arg]
) -> None:
    ledger = reopen(Path(tmp), "shared")
    other = reopen(Path(tmp), "other", name="o.sqlite")  # shares the heads file
    start.wait(30)  # all workers charge at the same moment
    granted = 0
    for i in range(attempts):
        try:
            ledger.charge(f"w{worker}", f"release{i}", PureBudget(0.01))
            granted += 1
        except PrivacyRefusal:
            pass
        other.charge(f"w{worker}", f"r{i}", PureBudget(0.01))
        time.sleep(0.002)  # lets the other workers in between, so charges interleave
    ledger.close()
    other.close()
    queue.put(granted)


def test_concurrent_processes_never_overspend(tmp_path: Path) -> None:
    make(tmp_path, "shared").close()
    make(tmp_path, "other", 100, name="o.sqlite").close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(str(tmp_path), w, 40, start, queue)) for w in range(4)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    granted = sum(queue.get(timeout=5) for _ in procs)
    with reopen(tmp_path, "shared") as ledger:  # verifies against the heads file too
        hist = ledger.history()
        assert len(hist) == granted == 100  # 1 / 0.01 exactly: no lost or extra entries
        assert ledger.spent().epsilon == 1
        assert len({e.id for e in hist}) == len(hist)
        assert len({e.run_id for e in hist}) >= 3  # 40 attempts each: 3+ workers got some
        assert ledger.head()["entries"] == 100
    with reopen(tmp_path, "other", name="o.sqlite") as other:  # no lost heads update
        assert len(other.history()) == 160
