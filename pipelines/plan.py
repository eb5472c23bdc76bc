"""From a YAML file to an immutable Plan: the validated config plus everything resolved.

A Plan is what the pipeline runs: absolute input paths (globs expanded), the
output folder, the config's sha256 for the manifest, and the hierarchies that
can be loaded without reading data (ARX files, explicit groupings). Builders
that derive their domain from the data (intervals, masks, dates) are built
later from the data's distinct values.
"""

from __future__ import annotations

import difflib
import glob
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from privpipe.anonymity.hierarchy import Hierarchy, build_grouping, load_arx_csv, load_code_lists
from privpipe.dp.spec import BOUNDED_KINDS
from privpipe.errors import ConfigError, InputDataError
from privpipe.pipelines.config import (
    ColumnType,
    HierarchyConfig,
    PrivpipeConfig,
    read_config,
    sweep_groups,
    validate_config,
)
from privpipe.pipelines.output import check_output_apart
from privpipe.transforms.io import InputSpec

_EXTENSIONS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


@dataclass(frozen=True)
class Plan:
    """A validated config with paths resolved; immutable."""

    config: PrivpipeConfig
    config_path: Path
    config_sha256: str
    input_paths: tuple[str, ...]
    input_format: str
    output_dir: Path
    hierarchies: MappingProxyType[str, Hierarchy] = field(
        default_factory=lambda: MappingProxyType({})
    )
    ledger_override: Path | None = None
    key_file_override: Path | None = None  # the demo's own ledger key
    sweeps: MappingProxyType[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    period_override: int | None = None  # `privpipe run --period N` (continual counts)
    input_duplicates: tuple[str, ...] = ()  # input paths dropped: the same file as another
    only: tuple[str, ...] | None = None  # `privpipe run --only`: the releases selected

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled with its read-only mappings as plain dicts (a mapping proxy does not
        pickle), for a worker process (``privpipe.workers``)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["hierarchies"], values["sweeps"] = dict(self.hierarchies), dict(self.sweeps)
        return _unpickle_plan, (values,)

    @property
    def ledger_path(self) -> Path | None:
        """The budget ledger file: budget.ledger resolved, or the override (the demo's)."""
        if self.ledger_override is not None:
            return self.ledger_override
        b = self.config.budget
        return None if b is None else self.resolve(b.ledger)

    @property
    def name(self) -> str:
        return self.config.name

    def resolve(self, path: str) -> Path:
        """A config-relative path made absolute."""
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else (self.config_path.parent / p)

    def input_spec(self) -> InputSpec:
        """What the batched reader needs, derived from the config."""
        c = self.config
        s = c.schema_
        required = list(s.quasi_identifiers)
        for col in (s.sensitive, s.privacy_unit):
            if col and col not in required:
                required.append(col)
        for col in s.types:
            if col not in required:
                required.append(col)
        for r in c.releases:
            for col in dp_columns(r):
                if col not in required:
                    required.append(col)
        return InputSpec(
            paths=self.input_paths,
            format=self.input_format,  # type: ignore[arg-type]
            delimiter=c.input.delimiter,
            quotechar=c.input.quotechar,
            encoding=c.input.encoding,
            header=c.input.header,
            column_names=tuple(c.input.columns) if c.input.columns else None,
            batch_rows=c.input.batch_rows,
            split_bytes=max(1, int(c.input.split_mb * 2**20)),
            required_columns=tuple(required),
            column_types=dict(self.column_types()),
            nonempty_columns=tuple(s.quasi_identifiers),
            multiline_records=c.input.multiline_records,
        )

    def column_types(self) -> dict[str, ColumnType]:
        """Declared types, plus numeric for columns with an intervals hierarchy."""
        types: dict[str, ColumnType] = dict(self.config.schema_.types)
        for col, h in self.config.hierarchies.items():
            if h.intervals is not None and col not in types:
                types[col] = "float"
        for r in self.config.releases:
            if r.kind in BOUNDED_KINDS and r.value not in types:  # type: ignore[union-attr]
                types[r.value] = "float"  # type: ignore[union-attr]
        return types


def _unpickle_plan(values: dict[str, Any]) -> Plan:
    values["hierarchies"] = MappingProxyType(values["hierarchies"])
    values["sweeps"] = MappingProxyType(values["sweeps"])
    return Plan(**values)


def dp_columns(release: object) -> list[str]:
    """Columns a DP release reads: its key columns and its value column."""
    key_columns = getattr(release, "key_columns", None)
    if key_columns is None:
        return []
    cols: list[str] = list(key_columns())
    value = getattr(release, "value", None)
    return cols + ([value] if value else [])


def unique_files(paths: list[str]) -> tuple[list[str], list[str]]:
    """Paths with each file once (by resolved real path: ``./x``, globs, symlinks), and the
    dropped duplicates. Reading a file twice would count its records twice."""
    seen: set[object] = set()
    kept: list[str] = []
    dropped: list[str] = []
    for path in paths:
        real: object = os.path.realpath(path) if "://" not in path else path
        try:  # hard links too: the same inode is the same file
            st = os.stat(path)
            real = (st.st_dev, st.st_ino)
        except (OSError, ValueError):
            pass
        if real in seen:
            dropped.append(path)
        else:
            seen.add(real)
            kept.append(path)
    return kept, dropped


def select_releases(data: Any, only: Sequence[str], where: str) -> Any:
    """The raw config as if it listed only the releases named in ``only`` (``run --only``):
    their sweeps kept, ``publish:`` cut to them. Without ``publish:`` a config of several
    releases publishes none, and so does its selection (one release left is not published
    by default). Unknown names are a ConfigError naming the nearest release."""
    if not isinstance(data, Mapping) or not isinstance(data.get("releases"), list):
        return data
    names = [r.get("name") for r in data["releases"] if isinstance(r, Mapping)]
    for name in only:
        if name not in names:
            near = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(
                f"--only: {where} has no release named {name!r}{hint} (releases: "
                f"{', '.join(map(str, names))})"
            )
    keep = set(only)
    kept_sweeps = [
        sw
        for sw in data.get("sweep") or []
        if isinstance(sw, Mapping) and sw.get("release") in keep
    ]
    points = {n for names_ in sweep_groups({"sweep": kept_sweeps}).values() for n in names_}
    out = dict(data)
    out["releases"] = [
        r for r in data["releases"] if isinstance(r, Mapping) and r.get("name") in keep
    ]
    out["sweep"] = kept_sweeps
    publish = data.get("publish")
    if publish is None:
        out["publish"] = names[:1] if len(names) == 1 else []
    elif isinstance(publish, list):
        out["publish"] = [n for n in publish if n in keep or n in points]
    return out


_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_regular_files(paths: list[str], key: str) -> None:
    """InputDataError (exit 3) for a local input that is not a regular file: privpipe
    reads an input by byte ranges and more than once, which a pipe or a folder cannot give
    (a FIFO would look empty, a folder unreadable)."""
    for path in paths:
        if "://" in path:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # a missing file is reported by the reader, with the same wording
        for test, what in _NOT_REGULAR:
            if test(mode):
                hint = (
                    "name the files inside it (e.g. a glob: folder/*.csv)"
                    if what == "a directory"
                    else "write the stream to a file first and give that file"
                )
                raise InputDataError(f"{path}: {key}: is {what}, not a regular file; {hint}")


Stamp = tuple[str, int, int, int]  # path, size, mtime (ns), inode


def input_stamps(paths: tuple[str, ...]) -> list[Stamp]:
    """Size, modification time and inode of each local input, taken before reading."""
    stamps = []
    for path in paths:
        if "://" in path:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        stamps.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return stamps


def input_size(stamps: list[Stamp], paths: tuple[str, ...]) -> int | None:
    """The inputs' total size from their :func:`input_stamps`; None when one of ``paths``
    has none (a remote input)."""
    return sum(st[1] for st in stamps) if len(stamps) == len(paths) else None


def check_unchanged(stamps: list[Stamp]) -> None:
    """InputDataError (exit 3) when an input changed after :func:`input_stamps`: the
    pipeline reads inputs more than once, and two reads of a changing file disagree
    (as a hierarchy, count or suppression error that would not say why)."""
    for path, size, mtime, ino in stamps:
        try:
            st = os.stat(path)
            now: tuple[int, int, int] | None = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            now = None
        if now != (size, mtime, ino):
            what = "was removed" if now is None else "changed (size, time or inode)"
            raise InputDataError(
                f"{path}: the input file {what} while this run was reading it; nothing was "
                "published. Run again once the file is complete (write inputs to a temporary "
                "name and rename them into place)"
            )


def load_plan(
    path: str | Path,
    output_dir: str | Path | None = None,
    input_override: str | Path | None = None,
    ledger_override: str | Path | None = None,
    period_override: int | None = None,
    key_file_override: str | Path | None = None,
    only: Sequence[str] | None = None,
) -> Plan:
    """Read, validate and resolve a config file into a Plan (no data is read); with
    ``only``, the config as if it listed only those releases (:func:`select_releases`)."""
    p = Path(path).resolve()
    data, digest = read_config(p)
    if only is not None:
        data = select_releases(data, only, p.name)
    cfg = validate_config(data, p.name)
    base = p.parent
    # a path from the config resolves against the config's folder, one given as an
    # argument against the working directory
    raw_paths: list[str]
    if input_override is not None:
        raw_paths = [str(Path(input_override).resolve())]
    else:
        raw_paths = cfg.input.path if isinstance(cfg.input.path, list) else [cfg.input.path]
    paths: list[str] = []
    for rp in raw_paths:
        ap = Path(os.path.expanduser(str(rp)))
        ap = ap if ap.is_absolute() else base / ap
        if glob.has_magic(str(ap)):
            matches = sorted(glob.glob(str(ap)))
            if not matches:
                raise InputDataError(
                    f"{p.name}: input.path: no file matches {str(ap)!r}; check the pattern"
                )
            paths.extend(matches)
        else:
            paths.append(str(ap))
    paths, duplicates = unique_files(paths)
    check_regular_files(paths, "--input" if input_override is not None else "input.path")
    fmt: str | None = cfg.input.format
    if fmt is None:
        exts = {_EXTENSIONS.get(Path(q).suffix.lower()) for q in paths}
        if len(exts) != 1 or None in exts:
            raise ConfigError(
                f"{p.name}: input.format: cannot tell the format from the file extension(s) "
                f"of {', '.join(Path(q).name for q in paths[:3])}; set format: csv|parquet|jsonl"
            )
        fmt = exts.pop()
    out = Path(output_dir) if output_dir else Path(os.path.expanduser(cfg.output.dir))
    out = out if out.is_absolute() else (Path.cwd() / out if output_dir else base / out)
    check_output_apart(  # before anything is written (faults: the output never eats input)
        out, paths, [str(base / os.path.expanduser(str(r))) for r in raw_paths],
        "--output" if output_dir else "output.dir",
        "--input" if input_override is not None else "input.path",
    )  # fmt: skip
    groups = {k: tuple(v) for k, v in sweep_groups(data).items()}
    plan = Plan(
        config=cfg,
        sweeps=MappingProxyType(groups),
        config_path=p,
        config_sha256=digest,
        input_paths=tuple(paths),
        input_duplicates=tuple(duplicates),
        input_format=str(fmt),
        output_dir=out,
        ledger_override=Path(ledger_override).resolve() if ledger_override else None,
        key_file_override=Path(key_file_override).resolve() if key_file_override else None,
        period_override=period_override,
        only=tuple(only) if only is not None else None,
    )
    return with_static_hierarchies(plan)


def with_static_hierarchies(plan: Plan) -> Plan:
    """Load the hierarchies that need no data: ARX files and explicit groupings."""
    loaded: dict[str, Hierarchy] = {}
    for col, h in plan.config.hierarchies.items():
        loaded_h = load_static_hierarchy(plan, col, h)
        if loaded_h is not None:
            loaded[col] = loaded_h
    return Plan(**{**plan.__dict__, "hierarchies": MappingProxyType(loaded)})


def load_static_hierarchy(plan: Plan, col: str, h: HierarchyConfig) -> Hierarchy | None:
    if h.file is not None:
        path = plan.resolve(h.file)
        return load_arx_csv(path, col, delimiter=h.delimiter, aliases=dict(h.map))
    if h.groups is not None:
        return build_grouping(col, h.groups, key=f"hierarchies.{col}.groups", aliases=dict(h.map))
    if h.codes is not None:
        return load_code_lists(
            col,
            [plan.resolve(f) for f in h.codes.files],
            delimiter=h.codes.delimiter,
            key=f"hierarchies.{col}.codes",
            aliases=dict(h.map),
        )
    return None
