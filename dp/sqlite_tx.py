"""One SQLite write transaction shape shared by the budget ledger and the continual state.

``BEGIN IMMEDIATE`` takes the write lock up front, so concurrent runs serialise instead of
racing between a read and a write; a lock held past the connection's timeout is a
privacy refusal (exit 4: retry later), never a half-applied change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from privpipe.errors import PrivacyRefusal


@contextmanager
def immediate(conn: sqlite3.Connection, what: str) -> Iterator[None]:
    """A write transaction on ``conn`` (autocommit mode); ``what`` names the file in errors."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise PrivacyRefusal(
                f"{what} stayed locked by another run; retry when it finishes"
            ) from exc
        raise
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
