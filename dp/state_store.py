"""The persistent state of one continual-observation stream: a small SQLite file.

The file holds the current :class:`dp.continual.TreeState` and nothing else: the stream's
fixed parameters, the last released period and the current node values (int64 cells as
little-endian BLOBs). In pan-private mode that is exactly X_t = N + x_1 + … + x_t and the
noise of the nodes not yet closed (PPCum, see dp/continual.py). No past state is kept in
any form: no history of releases, no digest or checksum of earlier states (an unkeyed
digest of past states let an intruder brute-force x_t and the noise from it).

Authenticity: an HMAC-SHA256 over the current state only, under
``ledger.derive_key("continual-state")`` (a key the intruder of the state file does not
hold; even with the key, the MAC is a function of the current state alone and tells
nothing the state does not). A state failing its MAC is refused (InputDataError, exit 3).

Rollback: the ledger records the last period each stream published
(``ledger.advance_stream`` / ``ledger.stream_period``). A state whose period differs from
the ledger's — an older copy put back, a deleted state file — is refused (exit 3): replaying
an old state would re-release periods with fresh noise (averaging it away).

No copies on disk: every period writes a NEW file (created 0600, ``journal_mode = OFF``
— no rollback journal or WAL ever exists — and ``secure_delete = ON``), fsyncs it and
renames it over the old one, so the file never holds superseded values in free pages or a
journal. The write is atomic: a crash leaves the old state or the new one, never half.
Order of a release: load and verify → advance in memory → write the new file → record the
period in the ledger (atomic, refuses a period recorded already, so concurrent runs cannot
both publish it) → rename into place. A crash between the last two steps leaves the ledger
one period ahead: the stream is then refused (fail closed), never replayed. An advisory
lock (``<file>.lock``) serialises runs of one stream.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import re
import secrets
import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from privpipe.dp.budget import to_fraction
from privpipe.dp.continual import ContinualRelease, TreeState, advance, round_horizon, start
from privpipe.dp.noise import NoiseSampler
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

IntArray = npt.NDArray[np.int64]

SCHEMA_VERSION = "2"
MAC_PURPOSE = "continual-state"
UNITS = ("event", "person")

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE nodes (kind TEXT NOT NULL CHECK (kind IN ('open', 'released', 'running')), "
    "level INTEGER NOT NULL, value BLOB NOT NULL, PRIMARY KEY (kind, level))",
)
_META = (
    "stream_id",
    "horizon",
    "epsilon",
    "cells",
    "sensitivity",
    "pan_private",
    "unit",
    "period",
    "created_at",
)


class StreamLedger(Protocol):
    """What the state needs from the ledger (dp.ledger.Ledger provides it)."""

    def derive_key(self, purpose: str) -> bytes: ...

    def stream_period(self, stream: str) -> int: ...

    def advance_stream(self, run_id: str, stream: str, period: int) -> object: ...


def state_path(directory: str | Path, dataset: str) -> Path:
    """The continual-state file of ``dataset`` in ``directory`` (beside its ledger)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", dataset)
    return Path(directory) / f"{safe}.continual.sqlite"


def _blob(cells: IntArray) -> bytes:
    return np.ascontiguousarray(cells, dtype="<i8").tobytes()


def _unblob(blob: bytes) -> IntArray:
    return np.frombuffer(blob, dtype="<i8").astype(np.int64)


@dataclass(frozen=True)
class StreamInfo:
    """A stream's fixed parameters and progress."""

    stream_id: str
    horizon: int
    epsilon: Fraction
    cells: int
    sensitivity: int
    pan_private: bool
    unit: str
    period: int
    created_at: str

    def meta(self) -> dict[str, str]:
        return {
            "stream_id": self.stream_id,
            "horizon": str(self.horizon),
            "epsilon": str(self.epsilon),
            "cells": str(self.cells),
            "sensitivity": str(self.sensitivity),
            "pan_private": str(int(self.pan_private)),
            "unit": self.unit,
            "period": str(self.period),
            "created_at": self.created_at,
        }


def _nodes(state: TreeState) -> list[tuple[str, int, bytes]]:
    out = [(k, j, _blob(v)) for k, d in (("open", state.open_nodes), ("released", state.released))
           for j, v in sorted(d.items())]  # fmt: skip
    if state.running is not None:
        out.append(("running", 0, _blob(state.running)))
    return sorted(out)


def state_mac(key: bytes, meta: dict[str, str], nodes: list[tuple[str, int, bytes]]) -> str:
    """HMAC-SHA256 of the CURRENT state (parameters, period, node values), canonical."""
    h = hmac.new(key, b"privpipe continual state v" + SCHEMA_VERSION.encode(), "sha256")
    for name in _META:
        value = meta[name].encode("utf-8")
        h.update(b"\x1e" + name.encode() + b"\x1f" + len(value).to_bytes(8, "big") + value)
    for kind, level, blob in sorted(nodes):
        h.update(f"\x1d{kind}\x1f{level}\x1f{len(blob)}\x1f".encode() + blob)
    return h.hexdigest()


def _fix(path: Path) -> str:
    return (
        f"the stream in {path} cannot continue safely; never edit or copy the state back. "
        "Start a new stream (a new release name) with its own budget"
    )


def _read(path: Path, key: bytes) -> tuple[StreamInfo, TreeState]:
    """The state stored at ``path``, after checking its schema and MAC (no lock, read-only)."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not {"meta", "nodes"} <= tables:
                raise InputDataError(
                    f"{path} is not a continual state (tables: {sorted(tables)}); point the "
                    "release's state: at its own file"
                )
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            nodes = [
                (str(k), int(j), bytes(v))
                for k, j, v in conn.execute("SELECT kind, level, value FROM nodes")
            ]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputDataError(
            f"the continual state {path} is unreadable ({exc}); {_fix(path)}"
        ) from exc
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise InputDataError(
            f"the continual state {path} has schema version {meta.get('schema_version')!r}, "
            f"expected {SCHEMA_VERSION} (made by another privpipe version); {_fix(path)}"
        )
    try:
        expected = state_mac(key, meta, nodes)
    except KeyError as exc:
        raise InputDataError(f"the continual state {path} lacks {exc}; {_fix(path)}") from None
    if not hmac.compare_digest(expected, meta.get("mac", "")):
        raise InputDataError(
            f"the continual state {path} failed its authentication (edited, forged, corrupted "
            f"or made under another ledger's key); refusing to release. {_fix(path)}"
        )
    info = StreamInfo(
        meta["stream_id"],
        int(meta["horizon"]),
        Fraction(meta["epsilon"]),
        int(meta["cells"]),
        int(meta["sensitivity"]),
        meta["pan_private"] == "1",
        meta["unit"],
        int(meta["period"]),
        meta["created_at"],
    )
    state = TreeState(
        info.horizon,
        float(info.epsilon),
        info.cells,
        info.sensitivity,
        info.pan_private,
        info.period,
    )
    for kind, level, blob in nodes:
        cells = _unblob(blob)
        if kind == "running":
            state.running = cells
        else:
            (state.open_nodes if kind == "open" else state.released)[level] = cells
    return info, state


def _write_new(path: Path, info: StreamInfo, state: TreeState, key: bytes) -> Path:
    """The whole state in a NEW 0600 file beside ``path`` (no journal), fsynced; its path."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = OFF")  # no rollback journal, no WAL: no copies
            conn.execute("PRAGMA secure_delete = ON")  # freed pages are zeroed
            conn.execute("BEGIN")
            for stmt in _SCHEMA:
                conn.execute(stmt)
            meta = info.meta()
            nodes = _nodes(state)
            rows = [*meta.items(), ("schema_version", SCHEMA_VERSION)]
            rows.append(("mac", state_mac(key, meta, nodes)))
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows)
            conn.executemany("INSERT INTO nodes (kind, level, value) VALUES (?, ?, ?)", nodes)
            conn.execute("COMMIT")
        finally:
            conn.close()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _replace(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``<path>.lock`` (runs of one stream serialise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent / f"{path.name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load(path: str | Path, stream_id: str, ledger: StreamLedger) -> tuple[StreamInfo, TreeState]:
    """The verified state of ``stream_id``: its MAC checked and its period equal to the ledger's.

    A missing file for a stream the ledger says published something, another stream's file,
    a forged/edited file or a rolled-back copy are refused (InputDataError, exit 3).
    """
    p = Path(path)
    recorded = ledger.stream_period(stream_id)
    if not p.exists():
        raise InputDataError(
            f"the continual state {p} of stream {stream_id!r} is missing, but the ledger "
            f"records period {recorded} as published: the state was deleted or moved. "
            f"{_fix(p)}"
            if recorded
            else f"the continual state {p} of stream {stream_id!r} does not exist yet"
        )
    info, state = _read(p, ledger.derive_key(MAC_PURPOSE))
    if info.stream_id != stream_id:
        raise ConfigError(
            f"{p} holds the state of stream {info.stream_id!r}, not {stream_id!r}; give each "
            "continual release its own state: file"
        )
    if info.period != recorded:
        raise InputDataError(
            f"the continual state {p} of stream {stream_id!r} is at period {info.period} but "
            f"the ledger records period {recorded} as the last one published: "
            + (
                "an older copy of the state was put back (rollback) or a run failed between "
                "recording the period and saving the state"
                if info.period < recorded
                else "the state does not belong to this ledger or the ledger was rolled back"
            )
            + f"; refusing to release. {_fix(p)}"
        )
    return info, state


class ContinualStore:
    """One continual stream persisted in its own file. Use :meth:`open`; then :meth:`release`."""

    def __init__(self, path: Path, stream_id: str, ledger: StreamLedger) -> None:
        self.path = path
        self.stream_id = stream_id
        self._ledger = ledger
        self._key = ledger.derive_key(MAC_PURPOSE)

    @classmethod
    def open(
        cls,
        path: str | Path,
        stream_id: str,
        ledger: StreamLedger,
        horizon: int,
        epsilon: float | str | Fraction,
        sampler: NoiseSampler,
        cells: int = 1,
        sensitivity: int = 1,
        pan_private: bool = False,
        unit: str = "event",
    ) -> ContinualStore:
        """Open ``stream_id`` at ``path``, starting it (period 0) if the file does not exist.

        A new stream draws its starting noise with ``sampler``; an existing one must have the
        same T (rounded), ε, cells, sensitivity, mode and unit, else PrivacyRefusal (its
        budget was fixed when it started).
        """
        if not stream_id:
            raise ConfigError("a continual stream needs a non-empty id")
        if unit not in UNITS:
            raise ConfigError(f"unit must be 'event' or 'person', got {unit!r}")
        eps = to_fraction(epsilon, "epsilon")
        if eps <= 0:
            raise ConfigError(f"epsilon must be > 0, got {epsilon!r}")
        t = round_horizon(horizon)
        p = Path(path)
        store = cls(p, stream_id, ledger)
        with _locked(p):
            if not p.exists() and ledger.stream_period(stream_id) == 0:
                state = start(t, float(eps), sampler, cells, sensitivity, pan_private)
                info = StreamInfo(
                    stream_id, t, eps, cells, sensitivity, pan_private, unit, 0, _now()
                )
                _replace(_write_new(p, info, state, store._key), p)
            info, _ = load(p, stream_id, ledger)
            asked = (t, eps, cells, sensitivity, pan_private, unit)
            stored = (info.horizon, info.epsilon, info.cells, info.sensitivity,
                      info.pan_private, info.unit)  # fmt: skip
            if asked != stored:
                names = ("T", "epsilon", "cells", "sensitivity", "pan_private", "unit")
                diffs = ", ".join(
                    f"{n}={s} (asked {a})"
                    for n, s, a in zip(names, stored, asked, strict=True)
                    if s != a
                )
                raise PrivacyRefusal(
                    f"stream {stream_id!r} in {p} was started with {diffs}; a stream's "
                    f"parameters cannot change after period {info.period} (its budget is "
                    "fixed). Use the original parameters, or a new stream id with its own budget"
                )
        return store

    def close(self) -> None:
        """Nothing stays open between calls (kept for ``with``)."""

    def __enter__(self) -> ContinualStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> StreamInfo:
        """The stream's parameters and last released period (verified)."""
        return load(self.path, self.stream_id, self._ledger)[0]

    def state(self) -> TreeState:
        """The verified stored state (read-only use: tests, inspection)."""
        return load(self.path, self.stream_id, self._ledger)[1]

    def release(
        self,
        period: int,
        count: int | npt.ArrayLike,
        sampler: NoiseSampler,
        run_id: str,
        beta: float = 0.05,
    ) -> ContinualRelease:
        """Add ``period``'s count(s) and release the noisy cumulative count(s), durably.

        Refuses (PrivacyRefusal) a period already released, skipped or beyond T, and
        (InputDataError) a state failing its MAC or the ledger's period. The result is
        returned only after the ledger recorded the period and the new state replaced the old.
        """
        with _locked(self.path):
            info, state = load(self.path, self.stream_id, self._ledger)
            label = f"stream {self.stream_id!r}"
            new, out = advance(state, period, count, sampler, beta, stream=label)
            done = StreamInfo(**{**info.__dict__, "period": new.period})
            tmp = _write_new(self.path, done, new, self._key)
            try:
                self._ledger.advance_stream(run_id, self.stream_id, new.period)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _replace(tmp, self.path)
        return out


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def describe(info: StreamInfo) -> dict[str, Any]:
    """A JSON-friendly summary of a stream (declared parameters and progress only)."""
    return {
        "stream_id": info.stream_id,
        "T": info.horizon,
        "epsilon": float(info.epsilon),
        "cells": info.cells,
        "sensitivity": info.sensitivity,
        "pan_private": info.pan_private,
        "unit": info.unit,
        "last_period": info.period,
        "created_at": info.created_at,
    }
