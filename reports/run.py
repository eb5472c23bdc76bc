"""A finished run directory as data, and writing the report files into it atomically.

``load_run(DIR)`` reads ``internal/manifest.json`` and every release folder
(``public/<name>/`` and ``internal/candidates/<name>/``: ``release.json`` and
``data.csv``/``data.parquet``) so ``privpipe report RUN_DIR`` can rebuild the audit
from a finished run. Published tables are read as strings (labels like ``"02108"`` keep
their zeros); numeric columns of DP releases are converted where they are read.
``write_reports(DIR, audit)`` writes ``audit.json``, ``report.md`` and ``report.html``,
each through a temporary file in the same folder and ``os.replace``.

Pure core: pandas, numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dp.noise import planned_guarantee
from privpipe.formulas import unescape, unescape_column

__all__ = [
    "Release",
    "Run",
    "dumps_audit",
    "load_release",
    "load_run",
    "release_folders",
    "write_reports",
]

ANONYMISED_KINDS = frozenset({"k_anonymity", "l_diversity", "t_closeness"})
LOCAL_DP_KINDS = frozenset({"local_dp"})


@dataclass(frozen=True)
class Release:
    """One published release: its artefact (as published) and its release.json."""

    name: str
    kind: str
    data: pd.DataFrame
    document: Mapping[str, Any] = field(default_factory=dict)

    @property
    def guarantee(self) -> dict[str, Any]:
        return planned_guarantee(self.document)

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.document.get("parameters") or {})


@dataclass(frozen=True)
class Run:
    """A finished run directory: its manifest and its releases in manifest order."""

    path: Path
    manifest: Mapping[str, Any]
    releases: Mapping[str, Release]

    @property
    def label(self) -> str:
        """A short name for the run in comparisons: the run id, else the folder name."""
        return str(self.manifest.get("run_id") or self.path.name)


def _read_table(folder: Path) -> pd.DataFrame:
    for name in ("data.csv", "data.parquet"):
        path = folder / name
        if path.exists():
            if name.endswith(".csv"):  # the values computed: formula escapes undone
                frame = pd.read_csv(path, dtype=str, keep_default_na=False)
                frame.columns = [unescape(c) for c in frame.columns]
                for col in frame.columns:
                    frame[col] = unescape_column(frame[col])
                return frame
            return pd.read_parquet(path).astype(str)
    raise FileNotFoundError(f"{folder}: no data.csv or data.parquet")


def load_release(folder: str | os.PathLike[str]) -> Release:
    """One release folder (``public/<name>/`` or ``internal/candidates/<name>/``)."""
    path = Path(folder)
    doc_path = path / "release.json"
    document: dict[str, Any] = json.loads(doc_path.read_text()) if doc_path.exists() else {}
    return Release(
        name=str(document.get("name") or path.name),
        kind=str(document.get("kind") or "unknown"),
        data=_read_table(path),
        document=document,
    )


def release_folders(run_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Name → folder of every release of a finished run: published ones in ``public/``,
    candidates in ``internal/candidates/`` (runs before the publication boundary:
    ``releases/``)."""
    path = Path(run_dir)
    found: dict[str, Path] = {}
    for folder in (path / "public", path / "internal" / "candidates", path / "releases"):
        if folder.is_dir():
            for p in sorted(folder.iterdir()):
                if p.is_dir() and p.name not in found:
                    found[p.name] = p
    return found


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    """``internal/manifest.json`` and every release of a finished run (published and
    candidates; manifest order first)."""
    path = Path(run_dir)
    manifest_path = path / "internal" / "manifest.json"
    if not manifest_path.exists() and (path / "manifest.json").exists():
        manifest_path = path / "manifest.json"  # a run before the publication boundary
    if not manifest_path.exists():
        raise FileNotFoundError(
            f"{path}: no internal/manifest.json (not a finished privpipe run folder)"
        )
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    folders = release_folders(path)
    names = [str(n) for n in manifest.get("releases") or []]
    names += [n for n in folders if n not in names]
    releases = {n: load_release(folders[n]) for n in names if n in folders}
    details = manifest.get("release_details") or {}
    for name, extra in details.items():  # a published release.json + what left it = the whole
        if name in releases and extra:
            r = releases[name]
            releases[name] = Release(r.name, r.kind, r.data, {**r.document, **extra})
    return Run(path, manifest, releases)


def dumps_audit(audit: Mapping[str, Any]) -> str:
    """audit.json's text: sorted keys would scramble sections, so insertion order, indent 2."""
    return json.dumps(audit, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_reports(run_dir: str | os.PathLike[str], audit: Mapping[str, Any]) -> dict[str, Path]:
    """Write audit.json, report.md and report.html into ``run_dir``; returns their paths.

    Everything is rendered first, then each file goes through a temporary file and
    ``os.replace``, so a reader never sees a half-written report.
    """
    from reports.render import render_html, render_markdown

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "audit.json": dumps_audit(audit),
        "report.md": render_markdown(audit),
        "report.html": render_html(audit),
    }
    paths: dict[str, Path] = {}
    for name, text in texts.items():
        _atomic_write(out / name, text)
        paths[name] = out / name
    return paths
