"""Where a run's files sit, for tests: one place to change when the layout changes.

Tests never spell output paths themselves; they ask here. Issue 11 (the publication
boundary) moves published releases to ``DIR/public/<name>/``, candidates to
``DIR/internal/candidates/<name>/`` and the operator's files (manifest, audit,
report, rejected rows) to ``DIR/internal/``; only these functions change then.
"""

from __future__ import annotations

from pathlib import Path


def release_dir(out: Path, name: str) -> Path:
    """The folder of release ``name`` (its data file and release.json) in run output ``out``."""
    return out / "releases" / name


def internal_file(out: Path, name: str) -> Path:
    """An operator file of run output ``out`` (manifest.json, audit.json, report.html, ...)."""
    return out / name
