"""The persistent state of continual-observation streams: one SQLite file beside the ledger.

Each stream (id, T, ε, cells, sensitivity, mode) keeps the :class:`dp.continual.TreeState`
between scheduled runs: the last released period, the open nodes and the released nodes
still needed (int64 cells as little-endian BLOBs), never a raw period count. Every release
appends a row to ``releases`` whose SHA-256 chains over the previous row, the released
counts and a digest of the whole stream state after the period; the stream's ``head`` is
the last row's checksum. Opening or advancing a stream recomputes the digest and the last
link, so an edited, truncated or corrupted state is refused (PrivacyRefusal, exit 4) before
any noise is drawn. The checksums are keyless (like the ledger's): they catch corruption
and hand edits, not a forger who recomputes them; keep the file with the ledger's
permissions. ``verify_history`` walks the whole chain. ``PRAGMA secure_delete`` zeroes
deleted rows, so superseded node values do not linger in the file's free pages.

Each release runs in one ``BEGIN IMMEDIATE`` transaction (load, verify, check the period,
draw noise, write, commit), so concurrent runs serialise, a period is released at most
once, and the noisy result is returned only after it is durably recorded.

Refusals (PrivacyRefusal, naming the period): a period already released, a skipped period,
a period beyond T, a changed ε / T / cells / sensitivity / mode for an existing stream, a
checksum mismatch or an unreadable file.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dp.budget import to_fraction
from dp.continual import (
    ContinualRelease,
    TreeState,
    advance,
    round_horizon,
    start,
)
from dp.noise import NoiseSampler
from dp.sqlite_tx import immediate
from privpipe.errors import ConfigError, PrivacyRefusal

IntArray = npt.NDArray[np.int64]

SCHEMA_VERSION = "1"
LOCK_TIMEOUT_S = 10.0
_GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE streams (
    stream_id TEXT PRIMARY KEY,
    horizon INTEGER NOT NULL,
    epsilon TEXT NOT NULL,
    cells INTEGER NOT NULL,
    sensitivity INTEGER NOT NULL,
    pan_private INTEGER NOT NULL,
    period INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    head TEXT NOT NULL
);
CREATE TABLE nodes (
    stream_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('open', 'released')),
    level INTEGER NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (stream_id, kind, level)
);
CREATE TABLE releases (
    stream_id TEXT NOT NULL,
    period INTEGER NOT NULL,
    counts BLOB NOT NULL,
    state_digest TEXT NOT NULL,
    released_at TEXT NOT NULL,
    checksum TEXT NOT NULL,
    PRIMARY KEY (stream_id, period)
);
"""
_TABLES = {"meta", "streams", "nodes", "releases"}


def state_path(directory: str | Path, dataset: str) -> Path:
    """The continual-state file of ``dataset`` in ``directory`` (beside its ledger)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", dataset)
    return Path(directory) / f"{safe}.continual.sqlite"


def _blob(cells: IntArray) -> bytes:
    return np.ascontiguousarray(cells, dtype="<i8").tobytes()


def _unblob(blob: bytes) -> IntArray:
    return np.frombuffer(blob, dtype="<i8").astype(np.int64)


def state_digest(stream_id: str, epsilon: Fraction, state: TreeState) -> str:
    """SHA-256 of the stream's parameters, last period and every stored node (canonical)."""
    h = hashlib.sha256()
    head = [
        stream_id,
        str(state.horizon),
        str(epsilon),
        str(state.cells),
        str(state.sensitivity),
        str(int(state.pan_private)),
        str(state.period),
    ]
    h.update("\x1f".join(head).encode("utf-8"))
    for kind, nodes in (("open", state.open_nodes), ("released", state.released)):
        for level in sorted(nodes):
            h.update(f"\x1e{kind}\x1f{level}\x1f".encode())
            h.update(_blob(nodes[level]))
    return h.hexdigest()


def _link(prev: str, stream_id: str, period: int, counts: bytes, digest: str, at: str) -> str:
    text = "\x1f".join([prev, stream_id, str(period), counts.hex(), digest, at])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StreamInfo:
    """A stream's fixed parameters and progress."""

    stream_id: str
    horizon: int
    epsilon: Fraction
    cells: int
    sensitivity: int
    pan_private: bool
    period: int
    created_at: str


class ContinualStore:
    """One continual stream persisted in SQLite. Use :meth:`open`; then :meth:`release`."""

    def __init__(self, conn: sqlite3.Connection, path: Path, stream_id: str) -> None:
        self._conn = conn
        self.path = path
        self.stream_id = stream_id

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: str | Path,
        stream_id: str,
        horizon: int,
        epsilon: float | str | Fraction,
        sampler: NoiseSampler,
        cells: int = 1,
        sensitivity: int = 1,
        pan_private: bool = False,
        timeout: float = LOCK_TIMEOUT_S,
    ) -> ContinualStore:
        """Open (creating if absent) ``stream_id`` in the file at ``path``.

        A new stream is started with ``sampler`` (pan-private open nodes need noise at
        creation); an existing one must have the same T (rounded), ε, cells, sensitivity
        and mode, else PrivacyRefusal: its budget was fixed when it started.
        """
        if not stream_id:
            raise ConfigError("a continual stream needs a non-empty id")
        eps = to_fraction(epsilon, "epsilon")
        if eps <= 0:
            raise ConfigError(f"epsilon must be > 0, got {epsilon!r}")
        t = round_horizon(horizon)
        p = Path(path)
        try:
            conn = sqlite3.connect(p, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise PrivacyRefusal(f"cannot open the continual state {p}: {exc}") from exc
        store = cls(conn, p, stream_id)
        try:
            # Overwrite deleted rows with zeros: old node values must not linger in free pages.
            conn.execute("PRAGMA secure_delete = ON")
            with store._write():
                tables = {
                    r[0]
                    for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                }
                if not tables:
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                        (SCHEMA_VERSION,),
                    )
                elif not tables >= _TABLES:
                    raise PrivacyRefusal(
                        f"{p} is an SQLite file but not a continual state (tables: "
                        f"{sorted(tables)}); {store._fix()}"
                    )
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None or row[0] != SCHEMA_VERSION:
                    raise PrivacyRefusal(
                        f"the continual state {p} has an unknown schema version; {store._fix()}"
                    )
                info = store._info_or_none()
                if info is None:
                    state = start(t, float(eps), sampler, cells, sensitivity, pan_private)
                    store._create(state, eps)
                else:
                    store._check_same(info, t, eps, cells, sensitivity, pan_private)
                    store._load_verified(info)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise PrivacyRefusal(
                    f"the continual state {p} stayed locked by another run for {timeout:g} s; "
                    "retry when it finishes"
                ) from exc
            raise PrivacyRefusal(
                f"the continual state {p} is unreadable ({exc}); {store._fix()}"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return store

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ContinualStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fix(self) -> str:
        return (
            f"restore {self.path} from a backup; never edit it by hand (a new stream id "
            "starts over and needs its own budget)"
        )

    def _write(self) -> AbstractContextManager[None]:
        """An IMMEDIATE transaction: the write lock up front, so runs serialise."""
        return immediate(self._conn, f"the continual state {self.path}")

    # ------------------------------------------------------------------ reading

    def _info_or_none(self) -> StreamInfo | None:
        row = self._conn.execute(
            "SELECT stream_id, horizon, epsilon, cells, sensitivity, pan_private, period, "
            "created_at FROM streams WHERE stream_id = ?",
            (self.stream_id,),
        ).fetchone()
        if row is None:
            return None
        try:
            eps = Fraction(row[2])
        except (ValueError, ZeroDivisionError) as exc:
            raise PrivacyRefusal(
                f"the continual state of stream {self.stream_id!r} in {self.path} is corrupt "
                f"(epsilon {row[2]!r}); {self._fix()}"
            ) from exc
        return StreamInfo(row[0], row[1], eps, row[3], row[4], bool(row[5]), row[6], row[7])

    def _check_same(
        self, info: StreamInfo, t: int, eps: Fraction, cells: int, sens: int, pan: bool
    ) -> None:
        asked = (t, eps, cells, sens, pan)
        stored = (info.horizon, info.epsilon, info.cells, info.sensitivity, info.pan_private)
        if asked != stored:
            names = ("T", "epsilon", "cells", "sensitivity", "pan_private")
            diffs = ", ".join(
                f"{n}={s} (asked {a})"
                for n, s, a in zip(names, stored, asked, strict=True)
                if s != a
            )
            raise PrivacyRefusal(
                f"stream {self.stream_id!r} in {self.path} was started with {diffs}; a "
                f"stream's parameters cannot change after period {info.period} (its budget "
                "is fixed). Use the original parameters, or a new stream id with its own budget"
            )

    def _load_verified(self, info: StreamInfo) -> TreeState:
        """The stored state, after checking its digest and the last chain link."""
        sid = self.stream_id
        state = TreeState(
            info.horizon,
            float(info.epsilon),
            info.cells,
            info.sensitivity,
            info.pan_private,
            info.period,
        )
        for kind, level, blob in self._conn.execute(
            "SELECT kind, level, value FROM nodes WHERE stream_id = ?", (sid,)
        ):
            cells = _unblob(blob)
            if cells.size != info.cells:
                self._refuse_checksum(info.period)
            (state.open_nodes if kind == "open" else state.released)[int(level)] = cells
        rows = self._conn.execute(
            "SELECT period, counts, state_digest, released_at, checksum FROM releases "
            "WHERE stream_id = ? AND period IN (?, ?) ORDER BY period",
            (sid, info.period - 1, info.period),
        ).fetchall()
        if not rows or rows[-1][0] != info.period or (info.period > 0 and len(rows) != 2):
            self._refuse_checksum(info.period)
        prev = rows[0][4] if len(rows) == 2 else _GENESIS
        period, counts, digest, at, checksum = rows[-1]
        head = self._conn.execute(
            "SELECT head FROM streams WHERE stream_id = ?", (sid,)
        ).fetchone()[0]
        if (
            digest != state_digest(sid, info.epsilon, state)
            or checksum != _link(prev, sid, period, counts, digest, at)
            or head != checksum
        ):
            self._refuse_checksum(info.period)
        return state

    def _refuse_checksum(self, period: int) -> None:
        raise PrivacyRefusal(
            f"the continual state of stream {self.stream_id!r} in {self.path} failed its "
            f"checksum at period {period} (edited, truncated or corrupted); refusing to "
            f"release. {self._fix()}"
        )

    # ------------------------------------------------------------------ writing

    def _create(self, state: TreeState, eps: Fraction) -> None:
        at = _now()
        self._conn.execute(
            "INSERT INTO streams (stream_id, horizon, epsilon, cells, sensitivity, "
            "pan_private, period, created_at, head) VALUES (?, ?, ?, ?, ?, ?, 0, ?, '')",
            (
                self.stream_id,
                state.horizon,
                str(eps),
                state.cells,
                state.sensitivity,
                int(state.pan_private),
                at,
            ),
        )
        self._save(state, eps, _GENESIS, np.zeros(0, dtype=np.int64), at)

    def _save(self, state: TreeState, eps: Fraction, prev: str, counts: IntArray, at: str) -> None:
        sid = self.stream_id
        self._conn.execute("DELETE FROM nodes WHERE stream_id = ?", (sid,))
        self._conn.executemany(
            "INSERT INTO nodes (stream_id, kind, level, value) VALUES (?, ?, ?, ?)",
            [
                (sid, kind, level, _blob(v))
                for kind, nodes in (("open", state.open_nodes), ("released", state.released))
                for level, v in sorted(nodes.items())
            ],
        )
        digest = state_digest(sid, eps, state)
        blob = _blob(counts)
        checksum = _link(prev, sid, state.period, blob, digest, at)
        self._conn.execute(
            "INSERT INTO releases (stream_id, period, counts, state_digest, released_at, "
            "checksum) VALUES (?, ?, ?, ?, ?, ?)",
            (sid, state.period, blob, digest, at, checksum),
        )
        self._conn.execute(
            "UPDATE streams SET period = ?, head = ? WHERE stream_id = ?",
            (state.period, checksum, sid),
        )

    # ------------------------------------------------------------------ public

    def info(self) -> StreamInfo:
        """The stream's parameters and last released period."""
        info = self._info_or_none()
        if info is None:
            raise PrivacyRefusal(f"stream {self.stream_id!r} vanished from {self.path}")
        return info

    def state(self) -> TreeState:
        """The verified stored state (read-only use: tests, inspection)."""
        with self._write():
            return self._load_verified(self.info())

    def release(
        self,
        period: int,
        count: int | npt.ArrayLike,
        sampler: NoiseSampler,
        beta: float = 0.05,
    ) -> ContinualRelease:
        """Add ``period``'s count(s) and release the noisy cumulative count(s), durably.

        Refuses (PrivacyRefusal) a period already released, skipped, beyond T, or a state
        that fails its checksum. The result is returned only after the commit.
        """
        with self._write():
            info = self.info()
            state = self._load_verified(info)
            label = f"stream {self.stream_id!r}"
            new, out = advance(state, period, count, sampler, beta, stream=label)
            prev = self._conn.execute(
                "SELECT head FROM streams WHERE stream_id = ?", (self.stream_id,)
            ).fetchone()[0]
            self._save(new, info.epsilon, prev, out.counts, _now())
        return out

    def history(self) -> list[tuple[int, IntArray]]:
        """Every release (period, noisy counts), after verifying the whole checksum chain."""
        out: list[tuple[int, IntArray]] = []
        with self._write():
            info = self.info()
            self._load_verified(info)
            prev = _GENESIS
            rows = self._conn.execute(
                "SELECT period, counts, state_digest, released_at, checksum FROM releases "
                "WHERE stream_id = ? ORDER BY period",
                (self.stream_id,),
            ).fetchall()
            for expected, (period, counts, digest, at, checksum) in enumerate(rows):
                if period != expected or checksum != _link(
                    prev, self.stream_id, period, counts, digest, at
                ):
                    self._refuse_checksum(int(period))
                prev = checksum
                if period > 0:
                    out.append((int(period), _unblob(counts)))
            if len(rows) != info.period + 1:
                self._refuse_checksum(info.period)
        return out

    def verify_history(self) -> None:
        """Walk the whole chain (O(T)); PrivacyRefusal on any break."""
        self.history()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def describe(info: StreamInfo) -> dict[str, Any]:
    """A JSON-friendly summary of a stream (for manifests and reports)."""
    return {
        "stream_id": info.stream_id,
        "T": info.horizon,
        "epsilon": float(info.epsilon),
        "cells": info.cells,
        "sensitivity": info.sensitivity,
        "pan_private": info.pan_private,
        "last_period": info.period,
        "created_at": info.created_at,
    }
