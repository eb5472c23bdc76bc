"""configs/demo.yaml adapted to the size of a `privpipe demo --rows N` run.

A few of the demo config's parameters depend on how large the data may be:
``schema.max_units`` (a public upper bound on persons; a larger data set is refused), every
``delta``, which must stay below 1/max_units, and ``attacks.targets`` (a sample no larger
than the persons). They are derived from N, the size the operator asked for (a public
parameter), never from the data: the demo has at most one person per row, so persons <= N.
Values that already fit N are kept, so the demo up to 10M rows runs the config as written.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BASE_MAX_UNITS = 10_000_000  # demo.yaml's bound: kept for any N up to it
DELTA_MARGIN = 10  # an adapted delta is at most 1 / (10 * max_units)


@dataclass(frozen=True)
class DemoSize:
    """The size-dependent parameters for a demo of ``rows`` rows."""

    rows: int
    max_units: int  # a power of ten >= rows (persons <= rows), at least BASE_MAX_UNITS
    max_delta: float  # every delta at most this (below 1/max_units with a margin)
    max_targets: int  # attack targets: no more than the persons can be


def demo_size(rows: int) -> DemoSize:
    """The public, size-dependent parameters of the demo for ``rows`` requested rows."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    max_units = BASE_MAX_UNITS
    while max_units < rows:
        max_units *= 10
    return DemoSize(rows, max_units, 1 / (DELTA_MARGIN * max_units), rows)


def adapt(cfg: Mapping[str, Any], rows: int) -> tuple[dict[str, Any], list[str]]:
    """(a copy of the demo config fitted to ``rows`` rows, what changed: "key: old -> new").

    Only parameters that do not fit are changed: a larger max_units, a smaller delta, fewer
    attack targets; everything else is the config as written."""
    size = demo_size(rows)
    out: dict[str, Any] = copy.deepcopy(dict(cfg))
    changes: list[str] = []
    schema = out.get("schema") or {}
    old_units = schema.get("max_units")
    if old_units is not None and int(old_units) < size.max_units:
        schema["max_units"] = size.max_units
        changes.append(f"schema.max_units: {old_units} -> {size.max_units}")
    cap = 1 / (DELTA_MARGIN * int(schema.get("max_units") or size.max_units))
    for i, release in enumerate(out.get("releases") or []):
        delta = release.get("delta")
        if delta and float(delta) > cap:
            release["delta"] = cap
            changes.append(f"releases[{i}] {release.get('name')}.delta: {delta:g} -> {cap:g}")
    attacks = out.get("attacks") or {}
    targets = attacks.get("targets")
    if isinstance(targets, int) and not isinstance(targets, bool) and targets > size.max_targets:
        attacks["targets"] = size.max_targets
        changes.append(f"attacks.targets: {targets} -> {size.max_targets}")
    return out, changes


def demo_config_for(src: Path, dest: Path, rows: int) -> tuple[Path, list[str]]:
    """The config to run for ``rows`` rows: ``src`` itself when nothing changes, else the
    adapted copy written to ``dest`` (relative paths made absolute, as they were from
    ``src``'s folder), and the list of changes."""
    cfg = yaml.safe_load(src.read_text(encoding="utf-8"))
    adapted, changes = adapt(cfg, rows)
    if not changes:
        return src, []
    base = src.parent.resolve()
    for h in (adapted.get("hierarchies") or {}).values():
        if isinstance(h, dict) and isinstance(h.get("file"), str):
            h["file"] = str(base / h["file"])
    for section, key in (("input", "path"), ("budget", "ledger"), ("budget", "key_file"),
                         ("output", "dir")):  # fmt: skip
        part = adapted.get(section) or {}
        if isinstance(part.get(key), str):
            part[key] = str(base / part[key])
    head = f"# {src.name} adapted by `privpipe demo --rows {rows}`: {'; '.join(changes)}\n"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(head + yaml.safe_dump(adapted, sort_keys=False), encoding="utf-8")
    return dest, changes


DEMO_SMALL_ROWS = 50  # below this the demo's k=5 tables may find too few persons to publish


def fewest_rows(cfg: Mapping[str, Any]) -> int:
    """The fewest rows the config can possibly run on: every k-anonymous table needs at
    least k persons, and the demo has no more persons than rows."""
    ks = [int(r["k"]) for r in cfg.get("releases") or [] if isinstance(r.get("k"), int)]
    return max(ks, default=1)
