"""The lifetime privacy-budget ledger: one SQLite file per dataset, created on purpose.

Every release of a dataset spends from one lifetime (epsilon, delta) that lives in the
ledger, written once by `Ledger.create` (`privpipe budget init`); a run never creates a
ledger. `charge_many` records the spend inside a `BEGIN IMMEDIATE` transaction (SQLite's
write lock), so concurrent runs, even in different processes, can never together exceed
the person-level lifetime. Event-level entries (continual streams that protect one
period of a person) are outside it: a person present in k periods of such a stream loses
k times its epsilon, which no lifetime here bounds — `spent("event")` shows that spend
beside the lifetime, and a stream must be `unit: person` for the lifetime to cover it.
Amounts are stored as exact Fraction text ("3/10"), so sums are exact.

Authentication (issue 12): the meta (schema, dataset, lifetime) carries an HMAC-SHA256,
and every entry an HMAC chained from it, under a key held outside the file (dp/ledger_auth).
Edits, deletions, recomputed chains and lifetime changes fail on open (InputDataError,
exit 3). Each write records the new head (entry count, chain MAC) in the heads file beside
the key, inside the write transaction; a ledger behind that head (a restored copy), moved,
deleted or truncated is refused too. A failed run's status is authenticated per entry.

Caller's contract: charge BEFORE drawing any noise. A run that fails after charging
calls `mark_failed(run_id, reason)`: the spend stays, only the reason is recorded.
Event-level entries (``unit="event"``) are recorded and shown but not counted against the
person-level lifetime; `advance_stream` records the periods a continual stream published.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import quote

from privpipe.dp.budget import ApproxBudget, PureBudget, RhoBudget
from privpipe.dp.ledger_auth import HeadRecord, LedgerKey, init_command, load_key, safe_name
from privpipe.dp.sqlite_tx import immediate
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

SCHEMA_VERSION = "2"
LOCK_TIMEOUT_S = 10.0
UNITS = ("person", "event")

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('charge', 'stream')),
    release TEXT NOT NULL,
    unit TEXT NOT NULL CHECK (unit IN ('person', 'event')),
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    period INTEGER,
    created_at TEXT NOT NULL,
    mac TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('committed', 'failed')),
    reason TEXT,
    status_mac TEXT NOT NULL
);
"""
_ENTRY_COLUMNS = (
    "id",
    "run_id",
    "kind",
    "release",
    "unit",
    "epsilon",
    "delta",
    "period",
    "created_at",
    "mac",
    "status",
    "reason",
    "status_mac",
)
_META_SIGNED = (
    "schema_version",
    "dataset",
    "lifetime_epsilon",
    "lifetime_delta",
    "ledger_id",
    "created_at",
)
_NO_ROLLBACK = (
    "the spend it records can no longer be trusted: stop releasing from this dataset and "
    "investigate (an older copy of the ledger is a rollback and is refused too)"
)


@dataclass(frozen=True)
class LedgerEntry:
    """One entry: a charge (who spent what, when, whether the run committed or failed) or,
    with ``kind == "stream"``, the period a continual stream published."""

    id: int
    run_id: str
    release: str
    epsilon: Fraction
    delta: Fraction
    created_at: str
    status: str
    reason: str | None
    unit: str = "person"
    kind: str = "charge"
    period: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "kind": self.kind,
            "release": self.release,
            "unit": self.unit,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "period": self.period,
            "created_at": self.created_at,
            "status": self.status,
            "reason": self.reason,
        }


def ledger_path(directory: str | Path, dataset: str) -> Path:
    """The ledger file of `dataset` inside `directory` (one file per dataset)."""
    return Path(directory) / f"{safe_name(dataset)}.ledger.sqlite"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _resolve(path: str | Path, dataset: str) -> Path:
    p = Path(path).expanduser()
    return (ledger_path(p, dataset) if p.is_dir() else p).resolve()


class Ledger:
    """Lifetime budget of one dataset, persisted in SQLite. Use `Ledger.open`."""

    def __init__(self, conn: sqlite3.Connection, path: Path, dataset: str, key: LedgerKey):
        self._conn = conn
        self.path = path
        self.label = f"the ledger {path}"  # how messages name it (a throw-away one says so)
        self.dataset = dataset
        self.key = key
        self.lifetime = ApproxBudget(1, 0)  # read from the verified meta by _verify
        self._pending: HeadRecord | None = None  # a write's head until its COMMIT

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(
        cls,
        path: str | Path,
        dataset: str,
        lifetime: ApproxBudget,
        key: LedgerKey,
    ) -> Path:
        """Create the ledger of `dataset` with its lifetime (`privpipe budget init`).

        Refuses an existing file, and a dataset whose heads record says it already had a
        ledger (a lifetime cannot be restarted by deleting the file). Returns the path.
        """
        if not dataset:
            raise ConfigError("the ledger needs a non-empty dataset id (--dataset)")
        p = _resolve(path, dataset)
        if p.exists():
            raise ConfigError(f"{p} already exists; a ledger is never overwritten")
        rec = key.read_heads().get(dataset)
        if rec is not None:
            raise InputDataError(
                f"dataset {dataset!r} already has a ledger ({rec.path}, {rec.entries} "
                f"entries, per the heads file {key.heads}); its lifetime budget cannot be "
                "restarted. Publish a new dataset version under a new dataset id instead"
            )
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise ConfigError(f"cannot create the ledger {p}: {exc}") from exc
        try:
            conn = sqlite3.connect(p, isolation_level=None)
            try:
                with immediate(conn, f"the privacy ledger {p}"):
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    meta = {
                        "schema_version": SCHEMA_VERSION,
                        "dataset": dataset,
                        "lifetime_epsilon": str(lifetime.epsilon),
                        "lifetime_delta": str(lifetime.delta),
                        "ledger_id": os.urandom(16).hex(),
                        "created_at": _now(),
                    }
                    meta_mac = key.mac("meta", [meta[k] for k in _META_SIGNED])
                    meta |= {"meta_mac": meta_mac, "head": meta_mac, "entries": "0"}
                    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
                    key.record_head(dataset, HeadRecord(str(p), 0, meta_mac))
            finally:
                conn.close()
        except BaseException:
            p.unlink(missing_ok=True)
            raise
        return p

    @classmethod
    def open(
        cls,
        path: str | Path,
        dataset: str,
        key: LedgerKey,
        lifetime_epsilon: Fraction | None = None,
        lifetime_delta: Fraction | None = None,
        timeout: float = LOCK_TIMEOUT_S,
    ) -> Ledger:
        """Open and verify the existing ledger of `dataset`.

        A lifetime given (from the config) must equal the ledger's (ConfigError).
        Missing and never created: ConfigError with the `budget init` command. Missing,
        truncated, moved, rolled back, edited or under another key: InputDataError.
        """
        if not dataset:
            raise ConfigError("the ledger needs a non-empty dataset name")
        p = _resolve(path, dataset)
        rec = key.read_heads().get(dataset)
        if rec is not None and rec.path != str(p):
            raise InputDataError(
                f"the ledger of dataset {dataset!r} is {rec.path} (per the heads file "
                f"{key.heads}), not {p}: a ledger cannot be moved or replaced; point "
                "budget.ledger at the dataset's ledger"
            )
        size = p.stat().st_size if p.is_file() else None
        if rec is not None and not size:
            raise InputDataError(
                f"the ledger {p} of dataset {dataset!r} was deleted or truncated "
                f"({'missing' if size is None else '0 bytes'}; the heads file {key.heads} "
                f"records {rec.entries} entries); {_NO_ROLLBACK}"
            )
        if size is None:
            eps = None if lifetime_epsilon is None else str(lifetime_epsilon)
            dlt = None if lifetime_delta is None else str(lifetime_delta)
            raise ConfigError(
                f"no privacy ledger at {p}: a run never creates one. Create it once, on "
                f"purpose: {init_command(p, dataset, key, eps, dlt)}"
            )
        try:
            conn = sqlite3.connect(
                f"file:{quote(str(p))}?mode=rw", uri=True, timeout=timeout, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise InputDataError(f"cannot open the privacy ledger {p}: {exc}") from exc
        ledger = cls(conn, p, dataset, key)
        try:
            with ledger._write():
                ledger._verified_rows()
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise PrivacyRefusal(
                    f"the privacy ledger {p} stayed locked by another run for {timeout:g} s; "
                    "retry when it finishes"
                ) from exc
            raise InputDataError(
                f"{p} is not a privacy ledger ({exc}); point budget.ledger at the dataset's "
                "ledger file"
            ) from exc
        except BaseException:
            conn.close()
            raise
        life = ledger.lifetime
        if (lifetime_epsilon is not None and lifetime_epsilon != life.epsilon) or (
            lifetime_delta is not None and lifetime_delta != life.delta
        ):
            conn.close()
            raise ConfigError(
                f"the ledger {p} holds lifetime epsilon={life.epsilon}, delta={life.delta}, "
                f"but the config says epsilon={lifetime_epsilon}, delta={lifetime_delta}; a "
                "lifetime budget cannot change: fix budget.lifetime_epsilon/lifetime_delta "
                "(or remove them: the ledger holds the lifetime)"
            )
        return ledger

    @classmethod
    def inspect(
        cls,
        path: str | Path,
        key_file: str | Path | None = None,
        key_env: str | None = None,
        heads_file: str | Path | None = None,
    ) -> Ledger:
        """Open an existing ledger for `budget show/verify`: its dataset is read from it
        (then authenticated like any open)."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such ledger file; check the path (budget.ledger)")
        try:
            conn = sqlite3.connect(f"file:{quote(str(p.resolve()))}?mode=ro", uri=True)
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'dataset'").fetchone()
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise InputDataError(f"{p} is not a privacy ledger ({exc})") from exc
        if row is None:
            raise InputDataError(f"{p} is not a privacy ledger (no dataset in its meta)")
        dataset = str(row[0])
        return cls.open(p, dataset, load_key(dataset, key_file, key_env, heads_file))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> AbstractContextManager[None]:
        """An IMMEDIATE transaction: the write lock up front, so runs serialise."""
        return immediate(self._conn, f"the privacy ledger {self.path}")

    # ------------------------------------------------------------------ verification

    def _bad(self, what: str) -> InputDataError:
        return InputDataError(
            f"the privacy ledger {self.path} of dataset {self.dataset!r} {what}: it was "
            f"edited, or is not authenticated by the ledger key from {self.key.source}; "
            f"{_NO_ROLLBACK}"
        )

    def _meta(self) -> dict[str, str]:
        tables = {
            r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not {"meta", "entries"} <= tables:
            raise InputDataError(
                f"{self.path} is an SQLite file but not a privacy ledger (tables: "
                f"{sorted(tables)}); point budget.ledger at the dataset's ledger"
            )
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        cols = tuple(r[1] for r in self._conn.execute("PRAGMA table_info(entries)"))
        if meta.get("schema_version") != SCHEMA_VERSION or cols != _ENTRY_COLUMNS:
            raise InputDataError(
                f"the ledger {self.path} has schema version {meta.get('schema_version')!r}, "
                f"expected {SCHEMA_VERSION} (ledgers before issue 12 were unauthenticated: "
                "create a new one with `privpipe budget init` under a new dataset id)"
            )
        signed = [meta.get(k) for k in _META_SIGNED]
        if None in signed or not hmac.compare_digest(
            meta.get("meta_mac", ""), self.key.mac("meta", signed)
        ):
            raise self._bad("failed authentication of its meta (dataset, lifetime, schema)")
        return {k: str(v) for k, v in meta.items()}

    def _verified_rows(self) -> list[LedgerEntry]:
        """All entries, after checking meta, chain, stored head and the heads record.

        Call inside a transaction (the read is then consistent with the heads file).
        """
        meta = self._meta()
        if meta["dataset"] != self.dataset:
            raise InputDataError(
                f"the ledger {self.path} belongs to dataset {meta['dataset']!r}, not "
                f"{self.dataset!r} (the config's name): a renamed dataset does not start a "
                "new lifetime; use the dataset's own name and ledger"
            )
        self.lifetime = ApproxBudget(
            Fraction(meta["lifetime_epsilon"]), Fraction(meta["lifetime_delta"])
        )
        rows = self._conn.execute(
            f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries ORDER BY id"
        ).fetchall()
        macs = [meta["meta_mac"]]
        out: list[LedgerEntry] = []
        for n, row in enumerate(rows, start=1):
            ident, run_id, kind, release, unit, eps, dlt, period, created, mac = row[:10]
            status, reason, status_mac = row[10:]
            fields = [ident, run_id, kind, release, unit, eps, dlt, period, created]
            if ident != n or not hmac.compare_digest(
                str(mac), self.key.mac("entry", [macs[-1], *fields])
            ):
                raise self._bad(f"failed authentication at entry {n} (edited or deleted)")
            if not hmac.compare_digest(
                str(status_mac), self.key.mac("status", [mac, status, reason])
            ):
                raise self._bad(f"failed authentication of the status of entry {n}")
            macs.append(str(mac))
            out.append(
                LedgerEntry(
                    ident,
                    run_id,
                    release,
                    Fraction(eps),
                    Fraction(dlt),
                    created,
                    status,
                    reason,
                    unit,
                    kind,
                    period,
                )
            )
        if meta.get("head") != macs[-1] or meta.get("entries") != str(len(out)):
            raise self._bad("lost entries (its stored head does not match its entries)")
        rec = self.key.read_heads().get(self.dataset)
        if rec is None:
            raise InputDataError(
                f"the heads file {self.key.heads} has no record of the ledger {self.path} of "
                f"dataset {self.dataset!r}: every ledger created by `privpipe budget init` is "
                "recorded there; point budget.heads_file (or --heads) at the heads file it was "
                f"created with; {_NO_ROLLBACK}"
            )
        if rec.path != str(self.path):
            raise InputDataError(
                f"the ledger of dataset {self.dataset!r} is {rec.path} (per the heads file "
                f"{self.key.heads}), not {self.path}: a ledger cannot be moved or replaced"
            )
        interrupted = (
            rec.pending_entries is not None
            and len(out) == rec.pending_entries
            and macs[rec.pending_entries] == rec.pending_mac
        )
        if len(out) < rec.entries and not interrupted:
            raise InputDataError(
                f"the ledger {self.path} is an older copy: it has {len(out)} entries, but the "
                f"heads file {self.key.heads} records {rec.entries} (rolled back to a backup "
                f"or a snapshot?); {_NO_ROLLBACK}"
            )
        if not interrupted and macs[rec.entries] != rec.mac:
            raise InputDataError(
                f"the ledger {self.path} is another copy: its first {rec.entries} entries do "
                f"not match the head recorded in the heads file {self.key.heads} (replaced or "
                f"rewritten); {_NO_ROLLBACK}"
            )
        return out

    # ------------------------------------------------------------------ writes

    def _append(self, entries: list[LedgerEntry]) -> None:
        """Insert authenticated entries and advance the head, here and in the heads file.

        Call inside the write transaction, after `_verified_rows`.
        """
        head = self._conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0]
        count = int(
            self._conn.execute("SELECT value FROM meta WHERE key = 'entries'").fetchone()[0]
        )
        start = (count, str(head))  # the verified head this write starts from
        for e in entries:
            fields = [
                e.id,
                e.run_id,
                e.kind,
                e.release,
                e.unit,
                str(e.epsilon),
                str(e.delta),
                e.period,
                e.created_at,
            ]
            head = self.key.mac("entry", [head, *fields])
            status_mac = self.key.mac("status", [head, e.status, e.reason])
            self._conn.execute(
                f"INSERT INTO entries ({', '.join(_ENTRY_COLUMNS)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*fields, head, e.status, e.reason, status_mac),
            )
            count += 1
        self._conn.executemany(
            "UPDATE meta SET value = ? WHERE key = ?", [(head, "head"), (str(count), "entries")]
        )
        # still inside the write lock: no other run can write between this and COMMIT. The
        # record says where the write started until `_committed` clears it after COMMIT
        self.key.record_head(
            self.dataset, HeadRecord(str(self.path), count, head, start[0], start[1])
        )
        self._pending = HeadRecord(str(self.path), count, head)

    def _committed(self) -> None:
        """After COMMIT: the head is final (a shorter ledger from now on is a rollback)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.key.record_head(self.dataset, pending)

    @staticmethod
    def _sum(entries: list[LedgerEntry], unit: str = "person") -> ApproxBudget:
        mine = [e for e in entries if e.kind == "charge" and e.unit == unit]
        eps = sum((e.epsilon for e in mine), Fraction(0))
        dlt = sum((e.delta for e in mine), Fraction(0))
        return ApproxBudget(eps, dlt)

    def charge(
        self, run_id: str, release: str, budget: PureBudget | ApproxBudget | RhoBudget
    ) -> LedgerEntry:
        """Record the spend of `budget`, or refuse (PrivacyRefusal, exit 4) if it does not fit.

        Call this BEFORE any noise is drawn: once noise exists the budget is spent.
        """
        return self.charge_many(run_id, [(release, budget)])[0]

    def check_affordable(
        self, run_id: str, items: Sequence[tuple[str, PureBudget | ApproxBudget]]
    ) -> None:
        """Refuse (PrivacyRefusal) now if person-level `items` would not fit; records nothing."""
        with self._write():
            self._refuse_unless_fits(run_id, items, self._verified_rows())

    def charge_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, PureBudget | ApproxBudget | RhoBudget]],
        *,
        unit: str = "person",
    ) -> list[LedgerEntry]:
        """Record every release's spend in one transaction: all fit and are recorded, or none.

        ``unit="event"`` entries (event-level privacy) are recorded but not counted against
        the person-level lifetime.
        """
        if not run_id or not items or any(not name for name, _ in items):
            raise ConfigError("charge needs a non-empty run_id and release names")
        if unit not in UNITS:
            raise ConfigError(f"charge: unit must be one of {UNITS}, got {unit!r}")
        if any(isinstance(b, RhoBudget) for _, b in items):
            raise ConfigError("the ledger records (epsilon, delta): convert with .to_approx(delta)")
        costs = [(name, b.to_approx()) for name, b in items if not isinstance(b, RhoBudget)]
        with self._write():
            entries = self._verified_rows()
            if unit == "person":
                self._refuse_unless_fits(run_id, costs, entries)
            out = [
                LedgerEntry(
                    len(entries) + i,
                    run_id,
                    release,
                    cost.epsilon,
                    cost.delta,
                    _now(),
                    "committed",
                    None,
                    unit,
                )
                for i, (release, cost) in enumerate(costs, start=1)
            ]
            self._append(out)
        self._committed()
        return out

    def advance_stream(self, run_id: str, stream: str, period: int) -> LedgerEntry:
        """Record, in the authenticated chain, that continual stream `stream` published
        `period`; refuses (PrivacyRefusal) any period but the last + 1."""
        if not run_id or not stream:
            raise ConfigError("advance_stream needs a non-empty run_id and stream")
        with self._write():
            entries = self._verified_rows()
            last = _last_period(entries, stream)
            if period != last + 1:
                raise PrivacyRefusal(
                    f"continual stream {stream!r}: the ledger {self.path} records period "
                    f"{last} as its last; period {period} would "
                    f"{'repeat a published period' if period <= last else 'skip periods'}; "
                    f"the next period is {last + 1}"
                )
            entry = LedgerEntry(
                len(entries) + 1,
                run_id,
                stream,
                Fraction(0),
                Fraction(0),
                _now(),
                "committed",
                None,
                "person",
                "stream",
                period,
            )
            self._append([entry])
        self._committed()
        return entry

    def stream_period(self, stream: str) -> int:
        """The last period the ledger records for continual stream `stream` (0 if never)."""
        return _last_period(self.history(), stream)

    def derive_key(self, purpose: str) -> bytes:
        """A subkey of the ledger key for `purpose` (e.g. the MAC of a continual state)."""
        if not purpose:
            raise ConfigError("derive_key needs a non-empty purpose")
        return self.key.derive(f"external/{purpose}")

    def head(self) -> dict[str, Any]:
        """The verified head: dataset, entry count and chain MAC (for the run's manifest)."""
        with self._write():
            entries = self._verified_rows()
            mac = self._conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0]
        return {
            "dataset": self.dataset,
            "path": str(self.path),
            "entries": len(entries),
            "mac": mac,
        }

    def _refuse_unless_fits(
        self,
        run_id: str,
        items: Sequence[tuple[str, PureBudget | ApproxBudget]],
        entries: list[LedgerEntry],
    ) -> None:
        spent = self._sum(entries)
        left_eps = self.lifetime.epsilon - spent.epsilon
        left_dlt = self.lifetime.delta - spent.delta
        need_eps = sum((b.to_approx().epsilon for _, b in items), Fraction(0))
        need_dlt = sum((b.to_approx().delta for _, b in items), Fraction(0))
        if need_eps > left_eps or need_dlt > left_dlt:
            names = ", ".join(repr(n) for n, _ in items)
            raise PrivacyRefusal(
                f"privacy budget of dataset {self.dataset!r} exhausted: the ledger {self.path} "
                f"has epsilon {_fmt(left_eps)} of {_fmt(self.lifetime.epsilon)} left (delta "
                f"{_fmt(left_dlt)} of {_fmt(self.lifetime.delta)}); release(s) {names} of run "
                f"{run_id!r} need epsilon {_fmt(need_eps)}, delta {_fmt(need_dlt)}; nothing "
                "was charged. Lower the releases' budget or use a new dataset version"
            )

    def mark_failed(self, run_id: str, reason: str) -> int:
        """Mark the run's entries failed with `reason`; the spend stays. Returns rows marked."""
        with self._write():
            mine = [e for e in self._verified_rows() if e.run_id == run_id]
            for e in mine:
                mac = self._conn.execute("SELECT mac FROM entries WHERE id = ?", (e.id,))
                status_mac = self.key.mac("status", [mac.fetchone()[0], "failed", reason])
                self._conn.execute(
                    "UPDATE entries SET status = 'failed', reason = ?, status_mac = ? WHERE id = ?",
                    (reason, status_mac, e.id),
                )
        if not mine:
            raise ConfigError(f"the ledger has no entries for run {run_id!r}")
        return len(mine)

    def history(self) -> list[LedgerEntry]:
        """Every entry, oldest first (authenticated)."""
        with self._write():
            return self._verified_rows()

    def spent(self, unit: str = "person") -> ApproxBudget:
        """Total spend of `unit` charges: committed and failed alike (basic composition)."""
        if unit not in UNITS:
            raise ConfigError(f"spent: unit must be one of {UNITS}, got {unit!r}")
        return self._sum(self.history(), unit)

    def remaining(self) -> ApproxBudget:
        """Person-level lifetime minus person-level spend."""
        spent = self.spent()
        return ApproxBudget(
            max(self.lifetime.epsilon - spent.epsilon, Fraction(0)),
            max(self.lifetime.delta - spent.delta, Fraction(0)),
        )


def _last_period(entries: list[LedgerEntry], stream: str) -> int:
    return max(
        (e.period or 0 for e in entries if e.kind == "stream" and e.release == stream), default=0
    )


def _fmt(x: Fraction) -> str:
    """A short human form of an exact amount: '1.5', or '1/3 (~0.3333)'."""
    f = float(x)
    if Fraction(repr(f)) == x:
        return repr(f).removesuffix(".0") if f.is_integer() else repr(f)
    return f"{x} (~{f:.4g})"
