"""A finished run directory as data, and writing the report files into it atomically.

``load_run(DIR)`` reads ``internal/manifest.json`` and every release folder
(``public/<name>/`` and ``internal/candidates/<name>/``: ``release.json`` and
``data.csv``/``data.parquet``) so ``privpipe report RUN_DIR`` can rebuild the audit
from a finished run. Published tables are read as strings (labels like ``"02108"`` keep
their zeros); numeric columns of DP releases are converted where they are read.

An anonymised table is never held whole: its ``Release.data`` is the frequency table of
its published rows (distinct rows, their number in ``attacks.matching.WEIGHT``), the one
the pipeline staged beside it when there is one, else counted from the file in chunks
(memory bounded by distinct published rows, not rows); its label columns are categoricals
over the plain strings that occur, so the audit works per distinct label. What needs the
rows themselves in their published order (the row-order attack) reads a bounded head of
the file (:func:`head_rows`).
``write_reports(DIR, audit)`` writes ``audit.json``, ``report.md`` and ``report.html``,
each through a temporary file in the same folder and ``os.replace``.

Pure core: pandas (and its pyarrow, for Parquet), numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.attacks.matching import WEIGHT, mark_distinct, read_coded
from privpipe.dp.noise import planned_guarantee
from privpipe.formulas import unescape, unescape_column

if TYPE_CHECKING:  # the renderer (matplotlib) is imported where a report is rendered
    from privpipe.reports.render import Figures

__all__ = [
    "Release",
    "Run",
    "dumps_audit",
    "head_rows",
    "load_release",
    "load_run",
    "release_folders",
    "write_reports",
]

ANONYMISED_KINDS = frozenset({"k_anonymity", "l_diversity", "t_closeness"})
LOCAL_DP_KINDS = frozenset({"local_dp"})
CHUNK_ROWS = 500_000  # rows of a published table read at once when it is counted


@dataclass(frozen=True)
class Release:
    """One published release: its artefact (as published) and its release.json."""

    name: str
    kind: str
    data: pd.DataFrame
    document: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the published data file (an anonymised table's rows)

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


def _data_file(folder: Path) -> Path:
    for name in ("data.csv", "data.parquet"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"{folder}: no data.csv or data.parquet")


def _computed(frame: pd.DataFrame) -> pd.DataFrame:
    """A published CSV's cells as computed: the formula escapes (privpipe.formulas) undone."""
    frame.columns = [unescape(c) for c in frame.columns]
    for col in frame.columns:
        frame[col] = unescape_column(frame[col])
    return frame


def _read_table(folder: Path) -> pd.DataFrame:
    path = _data_file(folder)
    if path.suffix == ".csv":
        return _computed(pd.read_csv(path, dtype=str, keep_default_na=False))
    return pd.read_parquet(path).astype(str)


def _chunks(path: Path, rows: int) -> Any:
    """The published file's rows, ``rows`` at a time, as strings (CSV's empty cells ``""``)."""
    if path.suffix == ".csv":
        for chunk in pd.read_csv(path, dtype=str, keep_default_na=False, chunksize=rows):
            yield _computed(chunk)
        return
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=rows):
        yield batch.to_pandas().astype(str)


def _strings(table: pd.DataFrame) -> pd.DataFrame:
    """A frequency table's label columns as plain strings (missing -> ``""``, as a CSV
    reads them), ``WEIGHT`` as int64, rows sorted by their labels: the same table in the
    same order whether the pipeline staged it or the file was counted (a rebuilt report
    adds its figures up in the same order as the run's). The label columns are
    categoricals over the strings that occur: the audit's steps factorise, compare, group
    and map them per distinct label (a 10M run's tables hold millions of rows of a few
    hundred labels; as Python strings, their factorising and conversions to pandas'
    strings took ~10 s of its audit).

    ``table`` holds each distinct row once (the staged counts, or ``count_rows``'); so does
    the result, marked so (``attacks.matching.mark_distinct``): rows that become equal
    when missing turns into ``""`` beside a real ``""`` are merged, adding their weights."""
    labels = [c for c in table.columns if c != WEIGHT]
    coded = {c: _Plain.of(table[c]) for c in labels}
    weights = table[WEIGHT].to_numpy(dtype=np.int64)
    if labels and any(p.merges() for p in coded.values()):
        frame = pd.DataFrame(
            {**{c: pd.Series(p.strings(), dtype=object) for c, p in coded.items()},
             WEIGHT: weights}
        )  # fmt: skip
        merged = frame.groupby(labels, sort=False)[WEIGHT].sum().reset_index()
        frame = merged.astype({c: object for c in labels})  # grouping infers ``str``
        coded = {c: _Plain.of(frame[c]) for c in labels}
        weights = frame[WEIGHT].to_numpy(dtype=np.int64)
    order = _label_order([coded[c] for c in labels], len(weights))
    frame = pd.DataFrame(
        {**{c: p.categorical(order) for c, p in coded.items()}, WEIGHT: weights[order]}
    )
    return mark_distinct(frame) if labels else frame


def _label_order(columns: Sequence[_Plain], n: int) -> npt.NDArray[np.intp]:
    """Row order sorting by the columns' plain strings, the first column most significant,
    ties kept in place (as ``sort_values(kind="stable")``): one stable argsort of the
    ranks packed into one int64 key when the ranks' mixed radix fits (one sort of 8
    columns of 2M rows ~8× faster than ``np.lexsort`` of 8 keys), else that lexsort."""
    ranked = [p.ranks() for p in columns]
    if not ranked:
        return np.arange(n, dtype=np.intp)
    if math.prod(radix for _, radix in ranked) < 2**63:
        key = np.zeros(n, dtype=np.int64)
        for rank, radix in ranked:
            key *= radix
            key += rank
        return np.argsort(key, kind="stable")
    return np.lexsort([rank for rank, _ in reversed(ranked)])  # lexsort: last key first


@dataclass(frozen=True)
class _Plain:
    """A column as codes into its distinct values' plain strings (missing -> ``""``, the
    table's last entry): strings and sort ranks built per distinct value, then by code,
    instead of per row (pandas' Arrow strings convert to objects slowly)."""

    codes: npt.NDArray[np.intp]
    table: npt.NDArray[np.object_]
    missing: bool

    @staticmethod
    def of(column: pd.Series) -> _Plain:
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes, values = column.cat.codes.to_numpy(), column.cat.categories
        else:
            codes, values = pd.factorize(column, use_na_sentinel=True)
        table = np.array([*(str(v) for v in values), ""], dtype=object)
        codes = np.asarray(codes, dtype=np.intp)
        return _Plain(codes, table, bool((codes < 0).any()))

    def strings(self) -> npt.NDArray[np.object_]:
        """The rows' plain strings, in the column's order (one per row: only where a
        table's strings are needed as such, ``_plain`` and a merged missing cell)."""
        return np.asarray(self.table[self.codes], dtype=object)  # -1: the last, ""

    @cached_property
    def _ranked(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.object_]]:
        """Each row's rank among the sorted distinct plain strings, and those strings
        (made once: the sort and the categorical both take them)."""
        distinct, rank = np.unique(self.table, return_inverse=True)
        return np.asarray(rank, dtype=np.int64)[self.codes], distinct

    def ranks(self) -> tuple[npt.NDArray[np.int64], int]:
        """Each row's rank among the plain strings (equal strings tie), and the number of
        distinct strings (ranks are below it): sorting by ranks orders rows as sorting the
        strings does."""
        rank, distinct = self._ranked
        return rank, max(len(distinct), 1)

    def categorical(self, order: npt.NDArray[np.intp]) -> pd.Categorical:
        """The rows' plain strings in ``order`` (a permutation of the rows) as a
        categorical over the distinct strings that occur, sorted."""
        rank, distinct = self._ranked
        codes = rank[order]
        present = np.zeros(len(distinct), dtype=bool)
        present[codes] = True
        if not present.all():  # e.g. the missing cells' "" when none is missing
            codes = (np.cumsum(present) - 1)[codes]
            distinct = distinct[present]
        return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))

    def merges(self) -> bool:
        """Whether a missing cell and a real ``""`` become the same string."""
        return self.missing and bool((self.table[:-1] == "").any())


def _plain(column: pd.Series) -> npt.NDArray[np.object_]:
    """A column's values as ``str`` objects, missing as ``""`` (per distinct value)."""
    return _Plain.of(column).strings()


def count_rows(path: Path, rows: int = CHUNK_ROWS) -> pd.DataFrame:
    """The frequency table of a published file's rows (``WEIGHT``), read ``rows`` at a
    time: memory bounded by the distinct rows and one chunk, never the whole table."""
    total: pd.DataFrame | None = None
    columns: list[str] = []
    for chunk in _chunks(path, rows):
        columns = [str(c) for c in chunk.columns]
        part = chunk.groupby(columns, sort=False, dropna=False).size().rename(WEIGHT)
        part = part.reset_index()
        if total is not None:
            both = pd.concat([total, part], ignore_index=True)
            part = both.groupby(columns, sort=False, dropna=False)[WEIGHT].sum().reset_index()
        total = part
    if total is None:  # no rows: the header's columns
        head = pd.read_csv(path, dtype=str, nrows=0) if path.suffix == ".csv" else None
        cols = [unescape(c) for c in head.columns] if head is not None else []
        return pd.DataFrame({**{c: pd.Series([], dtype=object) for c in cols},
                             WEIGHT: np.zeros(0, np.int64)})  # fmt: skip
    return _strings(total)


def head_rows(release: Release, rows: int) -> pd.DataFrame:
    """The first ``rows`` published rows of a table in their published order (read from
    its file; a release built from rows, not a frequency table, gives its own head)."""
    source = getattr(release, "source", None)
    if WEIGHT not in release.data.columns or source is None:
        return release.data.iloc[:rows]
    if source.suffix == ".csv":
        return _computed(pd.read_csv(source, dtype=str, keep_default_na=False, nrows=rows))
    parts, have = [], 0
    for part in _chunks(source, rows):  # a Parquet batch may end at a row group: gather
        parts.append(part.iloc[: rows - have])
        have += len(parts[-1])
        if have >= rows:
            break
    if not parts:
        return release.data.iloc[:0].drop(columns=[WEIGHT])
    return pd.concat(parts, ignore_index=True)


def load_release(
    folder: str | os.PathLike[str], counts: str | os.PathLike[str] | None = None
) -> Release:
    """One release folder (``public/<name>/`` or ``internal/candidates/<name>/``). An
    anonymised table's ``data`` is the frequency table of its rows: ``counts`` (the one
    the pipeline staged, transforms.audit_truth) when it exists, else counted from the
    file in chunks."""
    path = Path(folder)
    doc_path = path / "release.json"
    document: dict[str, Any] = json.loads(doc_path.read_text()) if doc_path.exists() else {}
    kind = str(document.get("kind") or "unknown")
    source = None
    if kind in ANONYMISED_KINDS:
        source = _data_file(path)
        staged = Path(counts) if counts is not None else None
        if staged is not None and staged.exists():
            data = _strings(read_coded(staged))
        else:
            data = count_rows(source)
    else:
        data = _read_table(path)
    return Release(
        name=str(document.get("name") or path.name),
        kind=kind,
        data=data,
        document=document,
        source=source,
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
            releases[name] = Release(r.name, r.kind, r.data, {**r.document, **extra}, r.source)
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


def write_reports(
    run_dir: str | os.PathLike[str], audit: Mapping[str, Any], figures: Figures | None = None
) -> dict[str, Path]:
    """Write audit.json, report.md and report.html into ``run_dir``; returns their paths.
    ``figures``: the report's plots drawn already (``render.render_figures`` of this audit).

    Everything is rendered first, then each file goes through a temporary file and
    ``os.replace``, so a reader never sees a half-written report.
    """
    from privpipe.reports.render import render_html, render_markdown

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "audit.json": dumps_audit(audit),
        "report.md": render_markdown(audit),
        "report.html": render_html(audit, figures),
    }
    paths: dict[str, Path] = {}
    for name, text in texts.items():
        _atomic_write(out / name, text)
        paths[name] = out / name
    return paths
