"""The output folder of a run: staged, then swapped into place as ``public/`` + ``internal/``.

Layout of DIR after a run (DESIGN.md "Outputs"): ``public/`` (what may be handed out:
published releases only) and ``internal/`` (manifest, audit, report, rejected rows,
candidates). Nothing else of DIR is touched, so a ledger or an input folder kept there
survives every run.

A run writes only under ``DIR/.privpipe-staging-<run id>/`` (mode 0700, holding a lock
file for as long as the run lives). Releases are written to ``releases/<name>/`` there;
:meth:`RunOutput.arrange` sorts them into ``public/`` and ``internal/candidates/``.
:meth:`RunOutput.commit` then marks the staging folder ready and swaps ``public/`` and
``internal/`` in with renames (old ones into ``.privpipe-previous-<run id>/``). A run
killed in the middle of those renames is finished by the next run (:func:`recover`):
a ready staging folder of a dead run is rolled forward, an unready one deleted, and a
leftover ``.privpipe-previous-*`` removed. A live run's folders are never touched (its
lock is held). If the run fails, :meth:`abort` deletes the staging folder.

Row-level scratch files (attack targets, DP aggregates, the profile) never go into DIR:
they live in :attr:`RunOutput.work`, a private temporary folder (mode 0700, from
``tempfile.mkdtemp`` under ``output.work_dir`` or the system temp folder) that commit and
abort delete; one left by a killed run is deleted by the next run using the same
work folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from privpipe.errors import OutputError

STAGING_PREFIX = ".privpipe-staging-"
_OLD_PREFIX = ".privpipe-previous-"
WORK_PREFIX = "privpipe-work-"
PUBLIC = "public"
INTERNAL = "internal"
CANDIDATES = "candidates"
SWAPPED = (PUBLIC, INTERNAL)  # the entries of DIR a run replaces, as wholes
_LOCK = ".lock"
_READY = ".ready"


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _lock(folder: Path) -> IO[str] | None:
    """An exclusive lock on ``folder/.lock`` (None: another live process holds it)."""
    try:
        handle = open(folder / _LOCK, "a")  # noqa: SIM115 - held for the run's lifetime
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _unlock(handle: IO[str] | None) -> None:
    if handle is not None:
        handle.close()  # closing releases the flock


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _swap_in(out_dir: Path, staging: Path, previous: Path) -> None:
    """Move each staged public/internal into DIR (the old one aside first); idempotent."""
    for name in SWAPPED:
        new = staging / name
        if not new.exists():
            continue  # already moved in
        target = out_dir / name
        if target.exists() or target.is_symlink():
            previous.mkdir(exist_ok=True)
            if (previous / name).exists():
                shutil.rmtree(previous / name, ignore_errors=True)
            os.replace(target, previous / name)
        os.replace(new, target)
    _fsync_dir(out_dir)


def recover(out_dir: Path) -> list[str]:
    """Finish or remove what dead runs left in ``out_dir``; returns the entries handled.

    A staging folder whose lock is free belongs to a dead run: if it was marked ready
    (the commit had begun) its public/internal are swapped in (roll forward), else it
    is deleted. ``.privpipe-previous-*`` folders without a live staging folder go.
    """
    handled: list[str] = []
    if not out_dir.is_dir():
        return handled
    for entry in sorted(out_dir.iterdir()):
        if not entry.name.startswith(STAGING_PREFIX) or not entry.is_dir():
            continue
        handle = _lock(entry)
        if handle is None:
            continue  # a live run
        try:
            run_id = entry.name[len(STAGING_PREFIX) :]
            if (entry / _READY).exists():
                _swap_in(out_dir, entry, out_dir / f"{_OLD_PREFIX}{run_id}")
            shutil.rmtree(entry, ignore_errors=True)
            handled.append(entry.name)
        finally:
            _unlock(handle)
    for entry in sorted(out_dir.iterdir()):
        if entry.name.startswith(_OLD_PREFIX) and entry.is_dir():
            run_id = entry.name[len(_OLD_PREFIX) :]
            if not (out_dir / f"{STAGING_PREFIX}{run_id}").exists():
                shutil.rmtree(entry, ignore_errors=True)
                handled.append(entry.name)
    return handled


def recover_work(parent: Path) -> list[str]:
    """Delete the scratch folders of dead runs in ``parent`` (ours, with a free lock)."""
    handled: list[str] = []
    try:
        entries = sorted(parent.glob(f"{WORK_PREFIX}*"))
    except OSError:
        return handled
    for entry in entries:
        try:
            if not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        handle = _lock(entry)
        if handle is None:
            continue
        try:
            shutil.rmtree(entry, ignore_errors=True)
            handled.append(entry.name)
        finally:
            _unlock(handle)
    return handled


_LEGACY = ("releases", "manifest.json", "audit.json", "report.md", "report.html", "rejected.csv")


def drop_legacy(out_dir: Path) -> list[str]:
    """Remove a pre-boundary run's output (releases/ and the operator files at DIR's top),
    recognised by its manifest; they would otherwise sit beside public/ looking published."""
    manifest = out_dir / "manifest.json"
    try:
        if "privpipe_version" not in manifest.read_text(encoding="utf-8")[:4096]:
            return []
    except (OSError, UnicodeDecodeError):
        return []
    dropped = []
    for name in _LEGACY:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            dropped.append(name)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
            dropped.append(name)
    return dropped


class RunOutput:
    """A staging folder inside the output folder, committed or aborted as a whole, and a
    private scratch folder outside it."""

    def __init__(
        self,
        out_dir: Path,
        run_id: str,
        source: str = "output.dir",
        work_dir: Path | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.run_id = run_id
        self._lock: IO[str] | None = None
        self._work_lock: IO[str] | None = None
        self._work: Path | None = None
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.recovered = recover(out_dir)
            self.staging = out_dir / f"{STAGING_PREFIX}{run_id}"
            self.staging.mkdir(mode=0o700)
            self._lock = _lock(self.staging)
            (self.staging / "releases").mkdir()
            (self.staging / INTERNAL).mkdir()
        except OSError as e:
            raise OutputError(
                f"{out_dir}: output folder is not writable ({e.strerror}); choose another "
                f"folder with --output or {source}, or fix its permissions"
            ) from None
        try:
            parent = work_dir if work_dir is not None else Path(tempfile.gettempdir())
            parent.mkdir(parents=True, exist_ok=True)
            self.recovered += recover_work(parent)
            self._work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{run_id}-", dir=parent))
            self._work_lock = _lock(self._work)
        except OSError as e:
            self.abort()
            raise OutputError(
                f"{work_dir or 'the system temp folder'}: cannot create the run's private "
                f"scratch folder ({e.strerror}); set output.work_dir to a writable folder "
                "(one every Beam worker can see)"
            ) from None
        self._done = False

    @property
    def work(self) -> Path:
        """Row-level scratch files of this run: outside DIR, mode 0700, always deleted."""
        assert self._work is not None
        return self._work

    @property
    def releases(self) -> Path:
        """Where the run writes every release (``<name>/``) before :meth:`arrange`."""
        return self.staging / "releases"

    @property
    def internal(self) -> Path:
        """The staged ``internal/`` (manifest, audit, report, rejected rows, candidates)."""
        return self.staging / INTERNAL

    @property
    def public(self) -> Path:
        """The staged ``public/``: published releases only."""
        return self.staging / PUBLIC

    def arrange(self, published: Iterable[str]) -> None:
        """Sort the staged releases: ``published`` into public/, the rest into
        internal/candidates/."""
        chosen = set(published)
        self.public.mkdir(exist_ok=True)
        candidates = self.internal / CANDIDATES
        for folder in sorted(self.releases.iterdir()) if self.releases.exists() else []:
            if folder.name in chosen:
                os.replace(folder, self.public / folder.name)
            else:
                candidates.mkdir(exist_ok=True)
                os.replace(folder, candidates / folder.name)
        shutil.rmtree(self.releases, ignore_errors=True)
        missing = sorted(n for n in chosen if not (self.public / n).is_dir())
        if missing:
            raise OutputError(f"publish: release(s) {missing} were not produced by this run")
        os.chmod(self.public, 0o755)  # public/ is meant to be read; internal/ stays 0700

    def commit(self) -> list[str]:
        """Swap the staged public/ and internal/ into the output folder."""
        if not self.public.exists():
            self.arrange(())
        self._drop_work()
        os.chmod(self.internal, 0o700)
        ready = self.staging / _READY
        with open(ready, "w") as f:
            f.write(self.run_id)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.staging)
        previous = self.out_dir / f"{_OLD_PREFIX}{self.run_id}"
        try:
            _swap_in(self.out_dir, self.staging, previous)
        except OSError as e:
            self._roll_back(previous)
            raise OutputError(f"{self.out_dir}: could not publish the run: {e}") from None
        shutil.rmtree(previous, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        _unlock(self._lock)
        self._done = True
        drop_legacy(self.out_dir)
        return list(SWAPPED)

    def _roll_back(self, previous: Path) -> None:
        """Undo a failed swap: new entries back to staging, old ones back in place."""
        for name in SWAPPED:
            if not (self.staging / name).exists() and (self.out_dir / name).exists():
                os.replace(self.out_dir / name, self.staging / name)
            if (previous / name).exists() and not (self.out_dir / name).exists():
                os.replace(previous / name, self.out_dir / name)
        (self.staging / _READY).unlink(missing_ok=True)
        shutil.rmtree(previous, ignore_errors=True)

    def _drop_work(self) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            _unlock(self._work_lock)
            self._work_lock = None

    def abort(self) -> None:
        """Forget everything this run wrote (scratch folder included)."""
        self._drop_work()
        if not getattr(self, "_done", False):
            shutil.rmtree(self.staging, ignore_errors=True)
            _unlock(self._lock)
            self._done = True
