"""Where a run's files sit, for tests: one place to change when the layout changes.

Tests never spell output paths themselves; they ask here. Layout (issue 11, the
publication boundary): published releases in ``DIR/public/<name>/``, candidates in
``DIR/internal/candidates/<name>/``, the operator's files (manifest, audit, report,
rejected rows) in ``DIR/internal/``.
"""

from __future__ import annotations

from pathlib import Path


def public_dir(out: Path, name: str) -> Path:
    """The folder of published release ``name`` (only what may be handed out)."""
    return out / "public" / name


def candidate_dir(out: Path, name: str) -> Path:
    """The folder of candidate release ``name`` (computed and compared, not published)."""
    return out / "internal" / "candidates" / name


def release_dir(out: Path, name: str) -> Path:
    """The folder of release ``name`` (its data file and release.json) in run output
    ``out``: the published one if it was published, else the candidate's."""
    published = public_dir(out, name)
    return published if published.is_dir() else candidate_dir(out, name)


def internal_file(out: Path, name: str) -> Path:
    """An operator file of run output ``out`` (manifest.json, audit.json, report.html, ...)."""
    return out / "internal" / name
