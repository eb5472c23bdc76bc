"""The output folder of a run: everything is staged, then swapped into place at the end.

A run writes only under `DIR/.privpipe-staging-<run id>/`. `commit()` moves each
top-level entry it produced (manifest.json, releases/, rejected.csv, ...) into
DIR, replacing the previous run's entry of the same name as a whole (so a stale
release folder never mixes with new ones). If the run fails, `abort()` deletes the
staging folder and DIR is exactly as it was: no half-written output, no lost output.
Entries the run does not produce (e.g. the demo's input folder) are left alone.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

from privpipe.errors import OutputError

STAGING_PREFIX = ".privpipe-staging-"
_OLD_PREFIX = ".privpipe-previous-"
WORK_DIR = "_work"  # internal files of a run (never published), removed before commit


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


class RunOutput:
    """A staging folder inside the output folder, committed or aborted as a whole."""

    def __init__(self, out_dir: Path, run_id: str, source: str = "output.dir") -> None:
        self.out_dir = out_dir
        self.run_id = run_id
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.staging = out_dir / f"{STAGING_PREFIX}{run_id}"
            self.staging.mkdir()
            (self.staging / WORK_DIR).mkdir()
            probe = self.staging / WORK_DIR / ".write-test"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise OutputError(
                f"{out_dir}: output folder is not writable ({e.strerror}); choose another "
                f"folder with --output or {source}, or fix its permissions"
            ) from None
        self._done = False

    @property
    def work(self) -> Path:
        """Internal files of this run; deleted before anything is published."""
        return self.staging / WORK_DIR

    def commit(self) -> list[str]:
        """Move every staged entry into the output folder; returns the entry names."""
        shutil.rmtree(self.work, ignore_errors=True)
        names = sorted(os.listdir(self.staging))
        old = self.out_dir / f"{_OLD_PREFIX}{self.run_id}"
        moved_old: list[str] = []
        moved_new: list[str] = []
        try:
            for name in names:
                target = self.out_dir / name
                if target.exists() or target.is_symlink():
                    old.mkdir(exist_ok=True)
                    os.replace(target, old / name)
                    moved_old.append(name)
                os.replace(self.staging / name, target)
                moved_new.append(name)
        except OSError as e:
            for name in moved_new:  # roll back: new entries out, old ones back
                shutil.move(str(self.out_dir / name), str(self.staging / name))
            for name in moved_old:
                os.replace(old / name, self.out_dir / name)
            raise OutputError(f"{self.out_dir}: could not publish the run: {e}") from None
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self._done = True
        return names

    def abort(self) -> None:
        """Forget everything this run wrote."""
        if not self._done:
            shutil.rmtree(self.staging, ignore_errors=True)
            self._done = True
