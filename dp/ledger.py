"""The lifetime privacy-budget ledger: one SQLite file per dataset.

Every release of a dataset spends from one lifetime (epsilon, delta). `charge`
records the spend inside a `BEGIN IMMEDIATE` transaction (SQLite's write lock), so
concurrent runs, even in different processes, can never together exceed the
lifetime. Amounts are stored as exact Fraction text ("3/10"), so sums are exact.

Caller's contract: charge BEFORE drawing any noise. A run that fails after charging
calls `mark_failed(run_id, reason)`: the spend stays (noise may have been drawn and
seen), only the reason is recorded. Each row carries a SHA-256 chained over the
immutable fields, and the chain head is kept in `meta`, so edits, deletions and
truncation of entries are detected on open (InputDataError).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dp.budget import ApproxBudget, Number, PureBudget, RhoBudget
from dp.sqlite_tx import immediate
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

SCHEMA_VERSION = "1"
LOCK_TIMEOUT_S = 10.0
_GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    release TEXT NOT NULL,
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    created_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('committed', 'failed')),
    reason TEXT,
    checksum TEXT NOT NULL
);
"""
_ENTRY_COLUMNS = (
    "id",
    "run_id",
    "release",
    "epsilon",
    "delta",
    "created_at",
    "status",
    "reason",
    "checksum",
)


@dataclass(frozen=True)
class LedgerEntry:
    """One charge: who spent what, when, and whether the run committed or failed."""

    id: int
    run_id: str
    release: str
    epsilon: Fraction
    delta: Fraction
    created_at: str
    status: str
    reason: str | None
    unit: str = "person"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "release": self.release,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "created_at": self.created_at,
            "status": self.status,
            "reason": self.reason,
            "unit": self.unit,
        }


def ledger_path(directory: str | Path, dataset: str) -> Path:
    """The ledger file of `dataset` inside `directory` (one file per dataset)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", dataset)
    return Path(directory) / f"{safe}.ledger.sqlite"


def _checksum(prev: str, row: tuple[Any, ...]) -> str:
    ident, run_id, release, eps, delta, created = row
    text = "\x1f".join([prev, str(ident), run_id, release, eps, delta, created])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Ledger:
    """Lifetime budget of one dataset, persisted in SQLite. Use `Ledger.open`."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, dataset: str, lifetime: ApproxBudget
    ) -> None:
        self._conn = conn
        self.path = path
        self.dataset = dataset
        self.lifetime = lifetime

    @classmethod
    def open(
        cls,
        path: str | Path,
        dataset: str,
        lifetime_epsilon: Number,
        lifetime_delta: Number = 0,
        timeout: float = LOCK_TIMEOUT_S,
    ) -> Ledger:
        """Open (creating if absent) the ledger of `dataset`; `path` is a file or a directory."""
        if not dataset:
            raise ConfigError("the ledger needs a non-empty dataset name")
        lifetime = ApproxBudget(lifetime_epsilon, lifetime_delta)
        p = Path(path)
        if p.is_dir():
            p = ledger_path(p, dataset)
        fix = f"restore {p} from a backup, or point the ledger at a new file"
        try:
            conn = sqlite3.connect(p, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputDataError(f"cannot open the privacy ledger {p}: {exc}") from exc
        ledger = cls(conn, p, dataset, lifetime)
        try:
            with ledger._write():
                tables = {
                    r[0]
                    for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                }
                if not tables:
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("schema_version", SCHEMA_VERSION),
                            ("dataset", dataset),
                            ("lifetime_epsilon", str(lifetime.epsilon)),
                            ("lifetime_delta", str(lifetime.delta)),
                            ("head", _GENESIS),
                        ],
                    )
                else:
                    ledger._check_header(tables, fix)
                    ledger._verified_rows(fix)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise PrivacyRefusal(
                    f"the privacy ledger {p} stayed locked by another run for {timeout:g} s; "
                    "retry when it finishes"
                ) from exc
            raise InputDataError(
                f"the privacy ledger {p} is not a valid ledger ({exc}); {fix}"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> AbstractContextManager[None]:
        """An IMMEDIATE transaction: the write lock up front, so runs serialise."""
        return immediate(self._conn, f"the privacy ledger {self.path}")

    def _check_header(self, tables: set[str], fix: str) -> None:
        if not {"meta", "entries"} <= tables:
            raise InputDataError(
                f"{self.path} is an SQLite file but not a privacy ledger (tables: "
                f"{sorted(tables)}); {fix}"
            )
        cols = tuple(r[1] for r in self._conn.execute("PRAGMA table_info(entries)"))
        if cols != _ENTRY_COLUMNS:
            raise InputDataError(f"the ledger {self.path} has an unknown entries schema; {fix}")
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise InputDataError(
                f"the ledger {self.path} has schema version {meta.get('schema_version')!r}, "
                f"expected {SCHEMA_VERSION}; {fix}"
            )
        if meta.get("dataset") != self.dataset:
            raise InputDataError(
                f"the ledger {self.path} belongs to dataset {meta.get('dataset')!r}, not "
                f"{self.dataset!r}; use that dataset's own ledger file"
            )
        try:
            stored = ApproxBudget(meta["lifetime_epsilon"], meta["lifetime_delta"])
        except (KeyError, ConfigError) as exc:
            raise InputDataError(
                f"the ledger {self.path} has a corrupt lifetime ({exc}); {fix}"
            ) from exc
        if stored != self.lifetime:
            raise ConfigError(
                f"the ledger {self.path} was created with lifetime epsilon={stored.epsilon}, "
                f"delta={stored.delta}, but the config says epsilon={self.lifetime.epsilon}, "
                f"delta={self.lifetime.delta}; a lifetime budget cannot change: fix the config"
            )

    def _verified_rows(self, fix: str) -> list[LedgerEntry]:
        """All entries, after checking the checksum chain and its stored head."""
        rows = self._conn.execute(
            f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries ORDER BY id"
        ).fetchall()
        prev = _GENESIS
        out: list[LedgerEntry] = []
        for row in rows:
            expected = _checksum(prev, tuple(row[:6]))
            if row[8] != expected:
                raise InputDataError(
                    f"the ledger {self.path} failed its checksum at entry {row[0]} (edited by "
                    f"hand?); {fix}"
                )
            prev = expected
            try:
                eps, dlt = Fraction(row[3]), Fraction(row[4])
            except (ValueError, ZeroDivisionError) as exc:
                raise InputDataError(
                    f"the ledger {self.path} entry {row[0]} is corrupt; {fix}"
                ) from exc
            out.append(LedgerEntry(row[0], row[1], row[2], eps, dlt, row[5], row[6], row[7]))
        head = self._conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
        if head is None or head[0] != prev:
            raise InputDataError(
                f"the ledger {self.path} lost entries (checksum head mismatch); {fix}"
            )
        return out

    def _fix(self) -> str:
        return f"restore {self.path} from a backup, or point the ledger at a new file"

    @staticmethod
    def _sum(entries: list[LedgerEntry]) -> ApproxBudget:
        eps = sum((e.epsilon for e in entries), Fraction(0))
        dlt = sum((e.delta for e in entries), Fraction(0))
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
        """Refuse (PrivacyRefusal) now if `items` would not fit; records nothing."""
        with self._write():
            self._refuse_unless_fits(run_id, items, self._verified_rows(self._fix()))

    def charge_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, PureBudget | ApproxBudget | RhoBudget]],
        *,
        unit: str = "person",
    ) -> list[LedgerEntry]:
        """Record every release's spend in one transaction: all fit and are recorded, or none."""
        if unit != "person":
            return self._charge_events(run_id, items, unit)
        if not run_id or not items or any(not name for name, _ in items):
            raise ConfigError("charge needs a non-empty run_id and release names")
        if any(isinstance(b, RhoBudget) for _, b in items):
            raise ConfigError("the ledger records (epsilon, delta): convert with .to_approx(delta)")
        costs = [(name, b.to_approx()) for name, b in items if not isinstance(b, RhoBudget)]
        out: list[LedgerEntry] = []
        with self._write():
            self._refuse_unless_fits(run_id, costs, self._verified_rows(self._fix()))
            for release, cost in costs:
                created = datetime.now(UTC).isoformat(timespec="microseconds")
                cur = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'")
                seq = cur.fetchone()
                ident = (seq[0] if seq else 0) + 1
                fields = (ident, run_id, release, str(cost.epsilon), str(cost.delta), created)
                prev = self._conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0]
                checksum = _checksum(prev, fields)
                self._conn.execute(
                    "INSERT INTO entries (id, run_id, release, epsilon, delta, created_at, "
                    "status, reason, checksum) VALUES (?, ?, ?, ?, ?, ?, 'committed', NULL, ?)",
                    (*fields, checksum),
                )
                self._conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (checksum,))
                out.append(
                    LedgerEntry(
                        ident, run_id, release, cost.epsilon, cost.delta, created, "committed", None
                    )
                )
        return out

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

    @classmethod
    def inspect(cls, path: str | Path) -> Ledger:
        """Open an existing ledger as it is (dataset and lifetime read from it), to show it."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such ledger file; check the path (budget.ledger)")
        try:
            conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, isolation_level=None)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            conn.close()
            dataset = meta["dataset"]
            eps, dlt = meta["lifetime_epsilon"], meta["lifetime_delta"]
        except (sqlite3.Error, KeyError) as exc:
            raise InputDataError(f"{p} is not a privacy ledger ({exc})") from exc
        return cls.open(p, dataset, Fraction(eps), Fraction(dlt))

    def mark_failed(self, run_id: str, reason: str) -> int:
        """Mark the run's entries failed with `reason`; the spend stays. Returns rows marked."""
        with self._write():
            n = self._conn.execute(
                "UPDATE entries SET status = 'failed', reason = ? WHERE run_id = ?",
                (reason, run_id),
            ).rowcount
        if n == 0:
            raise ConfigError(f"the ledger has no entries for run {run_id!r}")
        return n

    def history(self) -> list[LedgerEntry]:
        """Every entry, oldest first (checksums verified); event-level entries last."""
        with self._write():
            return self._verified_rows(self._fix()) + self._event_rows()

    def spent(self, unit: str = "person") -> ApproxBudget:
        """Total spend of ``unit``: committed and failed entries alike (basic composition)."""
        return self._sum([e for e in self.history() if e.unit == unit])

    def remaining(self) -> ApproxBudget:
        """Person-level lifetime minus person-level spend."""
        spent = self.spent()
        return ApproxBudget(
            max(self.lifetime.epsilon - spent.epsilon, Fraction(0)),
            max(self.lifetime.delta - spent.delta, Fraction(0)),
        )

    # ------------------------------------------------------------------------------------
    # STOPGAP (branch `continual`): minimal event-level entries, stream periods and derived
    # keys, with the exact signatures the `ledger` branch implements properly (authenticated
    # in the chain, key held outside the file). At merge, the ledger branch's versions of
    # everything in this block WIN; delete this block. Until then: event entries and stream
    # periods live in their own tables (not in the checksum chain) and the key material is
    # PRIVPIPE_LEDGER_KEY if set, else a random secret kept in the ledger's meta.

    def _stopgap_tables(self) -> None:
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS event_entries (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "run_id TEXT NOT NULL, release TEXT NOT NULL, epsilon TEXT NOT NULL, "
            "delta TEXT NOT NULL, created_at TEXT NOT NULL)"
        )
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS stream_periods (stream TEXT PRIMARY KEY, "
            "period INTEGER NOT NULL, run_id TEXT NOT NULL, updated_at TEXT NOT NULL)"
        )

    def _event_rows(self) -> list[LedgerEntry]:
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master")}
        if "event_entries" not in tables:
            return []
        rows = self._conn.execute(
            "SELECT id, run_id, release, epsilon, delta, created_at FROM event_entries ORDER BY id"
        ).fetchall()
        return [
            LedgerEntry(i, r, n, Fraction(e), Fraction(d), c, "committed", None, "event")
            for i, r, n, e, d, c in rows
        ]

    def _charge_events(
        self, run_id: str, items: Sequence[tuple[str, PureBudget | ApproxBudget | RhoBudget]],
        unit: str,
    ) -> list[LedgerEntry]:  # fmt: skip
        """Event-level entries: recorded and shown, never counted against the lifetime."""
        if unit != "event":
            raise ConfigError(f"a ledger entry's unit is 'person' or 'event', got {unit!r}")
        if not run_id or not items or any(not name for name, _ in items):
            raise ConfigError("charge needs a non-empty run_id and release names")
        if any(isinstance(b, RhoBudget) for _, b in items):
            raise ConfigError("the ledger records (epsilon, delta): convert with .to_approx(delta)")
        costs = [(name, b.to_approx()) for name, b in items if not isinstance(b, RhoBudget)]
        out: list[LedgerEntry] = []
        with self._write():
            self._stopgap_tables()
            for name, cost in costs:
                created = datetime.now(UTC).isoformat(timespec="microseconds")
                cur = self._conn.execute(
                    "INSERT INTO event_entries (run_id, release, epsilon, delta, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, name, str(cost.epsilon), str(cost.delta), created),
                )
                ident = int(cur.lastrowid or 0)
                out.append(
                    LedgerEntry(
                        ident, run_id, name, cost.epsilon, cost.delta, created, "committed",
                        None, "event",
                    )
                )  # fmt: skip
        return out

    def derive_key(self, purpose: str) -> bytes:
        """A subkey for ``purpose`` (HMAC-SHA256 of the ledger key material)."""
        env = os.environ.get("PRIVPIPE_LEDGER_KEY")
        if env:
            material = env.encode("utf-8")
        else:
            with self._write():
                row = self._conn.execute(
                    "SELECT value FROM meta WHERE key = 'stopgap_key'"
                ).fetchone()
                if row is None:
                    row = (secrets.token_hex(32),)
                    self._conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('stopgap_key', ?)", row
                    )
            material = bytes.fromhex(row[0])
        return hmac.new(material, b"privpipe/" + purpose.encode("utf-8"), "sha256").digest()

    def stream_period(self, stream: str) -> int:
        """The last period the continual ``stream`` published (0 if never)."""
        with self._write():
            self._stopgap_tables()
            row = self._conn.execute(
                "SELECT period FROM stream_periods WHERE stream = ?", (stream,)
            ).fetchone()
        return int(row[0]) if row else 0

    def advance_stream(self, run_id: str, stream: str, period: int) -> None:
        """Record that ``stream`` published ``period``; refuse anything but last + 1."""
        with self._write():
            self._stopgap_tables()
            row = self._conn.execute(
                "SELECT period FROM stream_periods WHERE stream = ?", (stream,)
            ).fetchone()
            last = int(row[0]) if row else 0
            if period != last + 1:
                raise PrivacyRefusal(
                    f"the ledger {self.path} records period {last} as the last one stream "
                    f"{stream!r} published; period {period} is not the next one (refused)"
                )
            self._conn.execute(
                "INSERT INTO stream_periods (stream, period, run_id, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(stream) DO UPDATE SET period = excluded.period, "
                "run_id = excluded.run_id, updated_at = excluded.updated_at",
                (stream, period, run_id, datetime.now(UTC).isoformat(timespec="microseconds")),
            )

    # ------------------------------------------------------------------ end of STOPGAP


def _fmt(x: Fraction) -> str:
    """A short human form of an exact amount: '1.5', or '1/3 (~0.3333)'."""
    f = float(x)
    if Fraction(repr(f)) == x:
        return repr(f).removesuffix(".0") if f.is_integer() else repr(f)
    return f"{x} (~{f:.4g})"
