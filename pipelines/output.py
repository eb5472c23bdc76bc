"""The output folder of a run: staged, then swapped into place as ``public/`` + ``internal/``.

Layout of DIR after a run (DESIGN.md "Outputs"): ``public/`` (what may be handed out:
published releases only) and ``internal/`` (manifest, audit, report, rejected rows,
candidates). Nothing else of DIR is touched, so a ledger or an input folder kept there
survives every run.

A run holds an exclusive lock on DIR itself (``flock`` on the folder, no file left
behind) from the moment it creates its staging folder until it commits or aborts: a second
run into the same DIR fails at once with :class:`~privpipe.errors.OutputBusy` (exit 1),
before it reads data or charges any budget, and never swaps folders under the first one.
A run writes only under ``DIR/.privpipe-staging-<run id>/`` (mode 0700, holding a lock
file for as long as the run lives). Releases are written to ``releases/<name>/`` there;
:meth:`RunOutput.arrange` sorts them into ``public/`` and ``internal/candidates/``.
:meth:`RunOutput.commit` then marks the staging folder ready and swaps ``public/`` and
``internal/`` in with renames (old ones into ``.privpipe-previous-<run id>/``). A run
killed in the middle of those renames is finished by the next run (:func:`recover`):
a ready staging folder of a dead run is rolled forward, an unready one deleted, and a
leftover ``.privpipe-previous-*`` removed. A live run's folders are never touched (its
lock is held). What recovery did is said in :attr:`RunOutput.notes` (the run prints it).
If the run fails, :meth:`abort` deletes the staging folder.

Tests kill a process at each step of the commit through :func:`_fault_point`, which reads
the environment variable ``PRIVPIPE_TEST_KILL_AT`` (tests only; unset in production).

Row-level scratch files (attack targets, DP aggregates, the profile) never go into DIR:
they live in :attr:`RunOutput.work`, a private temporary folder (mode 0700, from
``tempfile.mkdtemp`` under ``output.work_dir`` or the system temp folder) that commit and
abort delete; one left by a killed run is deleted by the next run using the same
work folder.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import glob
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from privpipe.errors import ConfigError, OutputBusy, OutputError

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


def _lock_dir(folder: Path) -> int | None:
    """An exclusive ``flock`` on the folder itself (its fd; None: a live process holds it).
    A file system without flock (some network mounts) gives an unlocked fd: the run goes
    on as it did before the lock existed rather than failing."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            return None
    return fd


KILL_ENV = "PRIVPIPE_TEST_KILL_AT"


def _fault_point(name: str) -> None:
    """Tests only: kill -9 this process here when ``PRIVPIPE_TEST_KILL_AT`` names this point."""
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


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
            _fault_point(f"commit:{name}-aside")
        os.replace(new, target)
        _fault_point(f"commit:{name}-in")
    _fsync_dir(out_dir)


def recover(out_dir: Path) -> list[str]:
    """Finish or remove what dead runs left in ``out_dir``; returns one sentence per entry.

    A staging folder whose lock is free belongs to a dead run: if it was marked ready
    (the commit had begun) its public/internal are swapped in (roll forward), else it
    is deleted. ``.privpipe-previous-*`` folders without a live staging folder go.
    Called with DIR's lock held (:class:`RunOutput`), so no live run is in the middle.
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
                handled.append(
                    f"finished the publication of run {run_id}, which was killed during "
                    "its commit (its public/ and internal/ are now in place)"
                )
            else:
                handled.append(
                    f"removed {entry.name}, left by run {run_id} which stopped before "
                    "publishing (nothing of it was published)"
                )
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            _unlock(handle)
    for entry in sorted(out_dir.iterdir()):
        if entry.name.startswith(_OLD_PREFIX) and entry.is_dir():
            run_id = entry.name[len(_OLD_PREFIX) :]
            if not (out_dir / f"{STAGING_PREFIX}{run_id}").exists():
                shutil.rmtree(entry, ignore_errors=True)
                handled.append(
                    f"removed {entry.name}, the replaced output a killed commit left behind"
                )
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
            handled.append(f"removed the scratch folder {entry} of a run that was killed")
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
        world_readable: bool = False,
    ) -> None:
        self.out_dir = out_dir
        self.run_id = run_id
        self.world_readable = world_readable  # output.world_readable: public/ 0755, not 0750
        self._lock: IO[str] | None = None
        self._dir_lock: int | None = None
        self._work_lock: IO[str] | None = None
        self._work: Path | None = None
        self._done = True  # nothing to abort until the staging folder exists
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputError(
                f"{out_dir}: is a file, not a folder; choose another folder with --output or "
                f"{source}"
            )
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self._dir_lock = _lock_dir(out_dir)
        except OSError as e:
            raise OutputError(
                f"{out_dir}: output folder is not writable ({e.strerror}); choose another "
                f"folder with --output or {source}, or fix its permissions"
            ) from None
        if self._dir_lock is None:
            raise OutputBusy(
                f"{out_dir}: another privpipe run is writing to this output folder; wait "
                f"for it to finish or choose another folder with --output or {source} "
                "(nothing was read, published or charged)"
            )
        try:
            self.staging = out_dir / f"{STAGING_PREFIX}{run_id}"
            self.recovered = recover(out_dir)
            self.staging.mkdir(mode=0o700)
            self._done = False
            self._lock = _lock(self.staging)
            (self.staging / "releases").mkdir()
            (self.staging / INTERNAL).mkdir()
        except OSError as e:
            self.abort()
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

    @property
    def notes(self) -> list[str]:
        """What this run's start cleaned up after killed runs, one sentence each."""
        return [f"privpipe: {self.out_dir}: {n}" for n in self.recovered]

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
        # public/ is for the operator to hand out: group-readable, world-readable only with
        # output.world_readable; internal/ stays 0700
        os.chmod(self.public, 0o755 if self.world_readable else 0o750)

    def commit(self) -> list[str]:
        """Swap the staged public/ and internal/ into the output folder."""
        _fault_point("commit:start")
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
        _fault_point("commit:ready")
        previous = self.out_dir / f"{_OLD_PREFIX}{self.run_id}"
        try:
            _swap_in(self.out_dir, self.staging, previous)
        except OSError as e:
            self._roll_back(previous)
            raise OutputError(f"{self.out_dir}: could not publish the run: {e}") from None
        _fault_point("commit:swapped")
        shutil.rmtree(previous, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        _unlock(self._lock)
        self._done = True
        drop_legacy(self.out_dir)
        self._unlock_dir()
        return list(SWAPPED)

    def _unlock_dir(self) -> None:
        if self._dir_lock is not None:
            os.close(self._dir_lock)  # closing releases the flock
            self._dir_lock = None

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
        if not self._done:
            shutil.rmtree(self.staging, ignore_errors=True)
            _unlock(self._lock)
            self._done = True
        self._unlock_dir()


# ------------------------------------------------------------- output apart from input


def _parts(path: str | Path) -> tuple[str, ...]:
    return Path(os.path.abspath(path)).parts


def _reaches(pattern: str, folder: Path, exact: bool = False) -> bool:
    """Whether the glob ``pattern`` can match ``folder`` (``exact``) or a path inside it
    (``*``, ``?``, ``[...]`` match within one path segment, as :func:`glob.glob`)."""
    p, d = _parts(pattern), _parts(folder)
    if len(p) < len(d) or (exact and len(p) != len(d)):
        return False
    return all(fnmatch.fnmatchcase(d[i], p[i]) for i in range(len(d)))


def check_output_apart(
    out_dir: Path,
    inputs: Iterable[str],
    patterns: Iterable[str],
    out_key: str = "output.dir",
    in_key: str = "input.path",
) -> None:
    """ConfigError (exit 2), before anything is written, when a run could replace or read
    its own output: DIR is an input file's folder (or an input), an input lies inside
    DIR's public/ or internal/, or an input glob can match DIR itself or anything inside
    its public/, internal/ or staging folders (the next run would read the last run's
    output as input)."""
    fix = f"; keep them apart: give {out_key} a folder of its own, outside {in_key}'s reach"
    outs = dict.fromkeys([Path(os.path.abspath(out_dir)), Path(os.path.realpath(out_dir))])
    for path in inputs:
        if "://" in path:
            continue
        real = Path(os.path.realpath(path))
        for out in outs:
            if real == out or real.parent == out:
                raise ConfigError(
                    f"{out_key}: the output folder {out_dir} is the folder of the input file "
                    f"{path} ({in_key}); a run writes public/, internal/ and a staging "
                    f"folder there{fix}"
                )
            for name in (PUBLIC, INTERNAL):
                if real.is_relative_to(out / name):
                    raise ConfigError(
                        f"{in_key}: the input file {path} lies inside the output folder's "
                        f"{name}/ ({out_key}: {out_dir}), which every run replaces{fix}"
                    )
    for pattern in patterns:
        if "://" in pattern or not glob.has_magic(pattern):
            continue
        for out in outs:
            managed = [out / PUBLIC, out / INTERNAL, out / f"{STAGING_PREFIX}x"]
            if _reaches(pattern, out, exact=True) or any(_reaches(pattern, m) for m in managed):
                raise ConfigError(
                    f"{in_key}: the pattern {pattern} reaches the output folder {out_dir} "
                    f"({out_key}): a run would read its own output as input{fix}"
                )
