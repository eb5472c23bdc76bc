"""What a ledger is checked against, kept OUTSIDE the ledger file: its key and its heads.

A forger who can write the ledger file can recompute an unkeyed checksum chain, and an
operator who restores an older copy rolls the spend back. So (issue 12):

- every ledger entry and the ledger's meta carry an HMAC-SHA256 under a key held outside
  the file: a key file (mode 0600 or stricter) or an environment variable;
- the ledger's head (entry count and chain MAC) is recorded, after every write, in a heads
  file kept where the key is (beside a key file, or a path of its own for an env key). A
  ledger behind its recorded head, missing, truncated, or at another path is refused.

The heads file is JSON, authenticated with a subkey of the same key, written atomically
(temporary file + rename) under an exclusive lock, so datasets sharing one heads file
update it safely from concurrent runs.
"""

from __future__ import annotations

import fcntl
import functools
import hmac
import json
import os
import re
import secrets
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privpipe.errors import ConfigError, InputDataError

DEFAULT_KEY_ENV = "PRIVPIPE_LEDGER_KEY"
MIN_KEY_CHARS = 32
HEADS_FORMAT = "privpipe-ledger-heads/1"
_PROVISION = (
    "generate one with `openssl rand -hex 32` and give it to the job only: a key file "
    "owned by the job user with mode 0600 (budget.key_file), or an environment variable "
    "(budget.key_env, default PRIVPIPE_LEDGER_KEY) from a systemd EnvironmentFile or a "
    "secrets manager (see README, 'Privacy budget ledger')"
)


def safe_name(dataset: str) -> str:
    """A file-name-safe form of a dataset id."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", dataset)


def default_heads_file(dataset: str) -> Path:
    """Where an env-keyed dataset's heads live by default: the job user's state folder,
    not beside the ledger (a rollback would copy both)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "privpipe" / "heads" / f"{safe_name(dataset)}.json"


@dataclass(frozen=True)
class HeadRecord:
    """The last head a run wrote for one dataset: where its ledger is, how long, its MAC.

    ``pending_entries``/``pending_mac``: while a write is in flight (recorded before the
    ledger's COMMIT, cleared right after it), the head it started from. A ledger found at
    exactly that head was interrupted before its write committed (the caller never got
    the charge back, so no noise was drawn for it); any other shorter ledger is a rollback.
    """

    path: str
    entries: int
    mac: str
    pending_entries: int | None = None
    pending_mac: str | None = None


@dataclass(frozen=True)
class LedgerKey:
    """The ledger's secret, where it came from, and the heads file that goes with it."""

    secret: bytes = field(repr=False)
    source: str
    heads: Path
    cli: tuple[str, ...] = ()  # how `budget init/verify` names this key (for hints)

    def derive(self, purpose: str) -> bytes:
        """An HMAC-derived subkey: one per purpose, none equal to the key itself."""
        return _derive(self.secret, purpose)

    def mac(self, purpose: str, fields: Any) -> str:
        """HMAC-SHA256 (hex) of ``fields`` in canonical JSON under the ``purpose`` subkey."""
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hmac.digest(_derive(self.secret, purpose), text.encode(), "sha256").hex()

    # ------------------------------------------------------------------ heads file

    def read_heads(self) -> dict[str, HeadRecord]:
        """The heads file's records by dataset id ({} if there is no heads file yet)."""
        try:
            text = self.heads.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"cannot read the ledger heads file {self.heads}: {exc}") from exc
        bad = (
            f"the ledger heads file {self.heads} is corrupt or was edited (it must be "
            f"authenticated by the ledger key from {self.source}); investigate before any "
            "further release"
        )
        try:
            doc = json.loads(text)
            heads = doc["heads"]
            ok = doc.get("format") == HEADS_FORMAT and hmac.compare_digest(
                str(doc["mac"]), self.mac("heads", heads)
            )
            records = {
                k: HeadRecord(
                    str(v["path"]),
                    int(v["entries"]),
                    str(v["mac"]),
                    None if v.get("pending_entries") is None else int(v["pending_entries"]),
                    None if v.get("pending_mac") is None else str(v["pending_mac"]),
                )
                for k, v in heads.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputDataError(bad) from exc
        if not ok:
            raise InputDataError(bad)
        return records

    def record_head(self, dataset: str, head: HeadRecord) -> None:
        """Set ``dataset``'s head in the heads file: locked, authenticated, atomic rename."""
        with self._heads_lock():
            records = self.read_heads()
            records[dataset] = head
            heads = {k: vars(v) for k, v in sorted(records.items())}
            doc = {"format": HEADS_FORMAT, "heads": heads, "mac": self.mac("heads", heads)}
            tmp = self.heads.with_name(f".{self.heads.name}.{secrets.token_hex(6)}.tmp")
            try:
                write_private(tmp, (json.dumps(doc, indent=1) + "\n").encode())
                os.replace(tmp, self.heads)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise ConfigError(
                    f"cannot write the ledger heads file {self.heads}: {exc}; nothing was "
                    "charged (fix budget.heads_file or the folder's permissions)"
                ) from exc

    @contextmanager
    def _heads_lock(self) -> Iterator[None]:
        try:
            self.heads.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(
                self.heads.with_name(self.heads.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot create the ledger heads file {self.heads}: {exc}; set "
                "budget.heads_file (or --heads) to a folder the job user can write"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


@functools.lru_cache(maxsize=64)
def _derive(secret: bytes, purpose: str) -> bytes:
    return hmac.digest(secret, f"privpipe-ledger/{purpose}".encode(), "sha256")


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` (which must not exist) with mode 0600 and write ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def new_key_file(path: Path) -> None:
    """Write a fresh random key (64 hex characters) to a new 0600 file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, (secrets.token_hex(32) + "\n").encode())


def load_key(
    dataset: str,
    key_file: str | Path | None = None,
    key_env: str | None = None,
    heads_file: str | Path | None = None,
) -> LedgerKey:
    """The ledger key of ``dataset`` from a key file or an environment variable (default
    PRIVPIPE_LEDGER_KEY), with its heads file; ConfigError (exit 2) says how to provision."""
    if key_file is not None and key_env is not None:
        raise ConfigError("budget: give key_file or key_env, not both")
    heads = Path(heads_file).expanduser() if heads_file is not None else None
    extra = ("--heads", str(heads)) if heads is not None else ()
    if key_file is not None:
        kf = Path(key_file).expanduser()
        try:
            st = kf.stat()
            raw = kf.read_bytes()
        except FileNotFoundError:
            raise ConfigError(
                f"the ledger key file {kf} does not exist; `privpipe budget init ... "
                f"--key-file {shlex.quote(str(kf))}` creates it with a new ledger, or {_PROVISION}"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read the ledger key file {kf}: {exc}") from exc
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the ledger key file {kf} has mode {st.st_mode & 0o777:04o}: group or others "
                f"can read it; run `chmod 600 {shlex.quote(str(kf))}` (owned by the job user)"
            )
        secret, source = raw.strip(), f"key file {kf}"
        heads = heads or kf.with_name(kf.name + ".heads")
        cli = ("--key-file", str(kf), *extra)
    else:
        var = key_env or DEFAULT_KEY_ENV
        secret, source = os.environ.get(var, "").strip().encode(), f"environment variable {var}"
        if not secret:
            raise ConfigError(f"the ledger key is missing: {source} is not set; {_PROVISION}")
        heads = heads or default_heads_file(dataset)
        cli = (*(("--key-env", var) if key_env else ()), *extra)
    if len(secret) < MIN_KEY_CHARS:
        raise ConfigError(
            f"the ledger key in {source} is too short ({len(secret)} characters, at least "
            f"{MIN_KEY_CHARS}); {_PROVISION}"
        )
    return LedgerKey(secret, source, heads.resolve(), cli)


def init_command(
    path: Path, dataset: str, key: LedgerKey, epsilon: str | None, delta: str | None
) -> str:
    """The exact `privpipe budget init` command that creates this ledger."""
    words = [
        "privpipe",
        "budget",
        "init",
        str(path),
        "--dataset",
        dataset,
        "--epsilon",
        epsilon or "<lifetime epsilon>",
    ]
    if delta is not None and delta != "0":
        words += ["--delta", delta]
    return " ".join(w if w.startswith("<") else shlex.quote(w) for w in [*words, *key.cli])
