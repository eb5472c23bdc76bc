"""Every hierarchy of a config, made complete once the data's distinct values are known.

ARX files and explicit groupings load without data (at plan time); masks, intervals
and dates take their domain from the data's distinct values. The resolver is a
small picklable value, so the same code runs on the driver (profile checks) and on
the worker that runs an anonymisation search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import (
    Hierarchy,
    build_dates,
    build_intervals,
    build_mask,
    build_prefix,
    canonical_factorize,
)
from privpipe.dp.cells import canonical_labels
from privpipe.errors import ConfigError, InputDataError
from privpipe.pipelines.config import HierarchyConfig, PrivpipeConfig


@dataclass(frozen=True)
class HierarchyResolver:
    """Config hierarchies plus the ones already loaded; call with value counts per column."""

    configs: Mapping[str, HierarchyConfig]
    loaded: Mapping[str, Hierarchy]

    def __call__(self, value_counts: Mapping[str, pd.Series]) -> dict[str, Hierarchy]:
        """All hierarchies, each checked to cover every value in the data (exit 3 if not)."""
        out: dict[str, Hierarchy] = {}
        no_rows = all(len(v) == 0 for v in value_counts.values())
        for col, hc in self.configs.items():
            counts = value_counts.get(col, pd.Series(dtype="int64"))
            if no_rows and col not in self.loaded:  # a builder with nothing to build from
                from privpipe.pipelines.rejections import NO_ROWS  # the driver re-reads to explain

                raise InputDataError(f"{NO_ROWS}: every input row was rejected")
            h = self.loaded.get(col) or build_from_data(col, hc, list(counts.index))
            problems = label_collisions(h, f"hierarchies.{col}")
            if problems:
                raise ConfigError("\n".join(problems))
            h.check_covers(counts)
            out[col] = h
        return out


def build_from_data(col: str, hc: HierarchyConfig, values: list[object]) -> Hierarchy:
    """A builder hierarchy (mask, prefix, intervals, dates) over the data's distinct values."""
    key = f"hierarchies.{col}.{hc.kind}"
    aliases = dict(hc.map)
    if hc.mask is not None:
        return build_mask(
            col, values, digits=hc.mask.digits, char=hc.mask.char, key=key, aliases=aliases
        )
    if hc.prefix is not None:
        return build_prefix(col, values, hc.prefix.lengths, key=key, aliases=aliases)
    if hc.intervals is not None:
        iv = hc.intervals
        return build_intervals(
            col,
            values,
            widths=iv.widths,
            start=iv.start,
            lower=iv.lower,
            upper=iv.upper,
            key=key,
            aliases=aliases,
        )
    if hc.dates is not None:
        return build_dates(
            col,
            values,
            levels=tuple(hc.dates.levels),
            format=hc.dates.format,
            key=key,
            aliases=aliases,
        )
    raise AssertionError(f"{key}: file, groups and codes hierarchies are loaded at plan time")


@dataclass(frozen=True)
class HierarchyLabeler:
    """Labels of a column at a hierarchy level, batch by batch (for DP cells).

    File and grouping hierarchies are loaded at plan time; builders (mask, intervals,
    dates) label a value from the value alone, so each batch builds them over its own
    distinct values and every batch gets the same label for the same value.
    """

    configs: Mapping[str, HierarchyConfig]
    loaded: Mapping[str, Hierarchy]

    def __call__(self, col: str, level: int, values: pd.Series) -> npt.NDArray[np.object_]:
        if level == 0:
            return canonical_labels(col, 0, values)
        hc = self.configs.get(col)
        if hc is None:
            raise ConfigError(f"levels.{col}: {col!r} has no hierarchy; add hierarchies.{col}")
        h = self.loaded.get(col)
        if h is None:
            _, uniques = canonical_factorize(values)
            h = build_from_data(col, hc, [v for v in uniques.tolist() if v != ""])
        if level > h.height:
            raise ConfigError(
                f"levels.{col}: level {level} is above the top of its hierarchy ({h.height})"
            )
        codes = h.encode(values)
        if (codes < 0).any():  # DP cells: nothing exact about the data in the message
            raise InputDataError(
                f"column {col!r}: some values are not in hierarchies.{col} (withheld: this is "
                "a DP release's input); add them to the hierarchy (or a map alias) or fix the "
                "data"
            )
        return h.generalize(codes, level)


def label_collisions(h: Hierarchy, key: str, limit: int = 3) -> list[str]:
    """A generalised label that is another raw value of the column would be read as that
    value (Male→Female publishes male rows as "Female"): one problem per level, with up to
    ``limit`` examples. A label may equal its own raw value (a value kept as is)."""
    table = h.table
    raw = pd.Index(table[:, 0], dtype=object)
    if not raw.is_unique:
        return []  # the hierarchy's own validation reports duplicated raw values
    own = np.arange(table.shape[0])
    out: list[str] = []
    for level in range(1, table.shape[1]):
        hit = raw.get_indexer(pd.Index(table[:, level], dtype=object))
        bad = np.flatnonzero((hit >= 0) & (hit != own))
        if bad.size == 0:
            continue
        shown = ", ".join(f"{table[i, 0]!r} → {table[i, level]!r}" for i in bad[:limit])
        more = f" and {bad.size - limit} more" if bad.size > limit else ""
        source = f" ({h.source})" if h.source else ""
        out.append(
            f"{key}{source}: level {level} labels raw values as other raw values of "
            f"{h.attribute!r} ({shown}{more}): a published label would be read as a "
            "different value; give generalised values labels that are not raw values "
            "(e.g. 'Female|Male' or '*')"
        )
    return out


def _probe(hc: HierarchyConfig) -> list[object] | None:
    """One value of the declared form of a builder (to learn its height without data)."""
    if hc.mask is not None:
        return None if hc.mask.digits is None else ["0" * hc.mask.digits]
    if hc.prefix is not None:
        return ["0" * (hc.prefix.lengths[0] + 1)]
    if hc.intervals is not None:
        iv = hc.intervals
        return [iv.lower if iv.lower is not None else iv.start]
    if hc.dates is not None:
        import datetime as _dt

        return [_dt.date(2000, 1, 3).strftime(hc.dates.format)]
    return None


def static_problems(cfg: PrivpipeConfig, loaded: Mapping[str, Hierarchy]) -> list[str]:
    """What can be checked about the hierarchies without data, each with its key path:
    builders against the declared column types, builders applied to the public domains
    the config gives, and every DP level against the top of its hierarchy."""
    out: list[str] = []
    types = cfg.schema_.types
    heights: dict[str, int] = {col: h.height for col, h in loaded.items()}
    for col, hc in cfg.hierarchies.items():
        if col in loaded:
            out += label_collisions(loaded[col], f"hierarchies.{col}")
            continue
        key = f"hierarchies.{col}.{hc.kind}"
        declared = types.get(col)
        if (hc.mask is not None or hc.prefix is not None) and declared == "float":
            verb = "masks" if hc.mask is not None else "cuts prefixes of"
            out.append(f"{key}: {verb} codes as text, but schema.types.{col} is float; "
                       f"declare it string (or integer) or use intervals")  # fmt: skip
        if hc.dates is not None and declared in ("integer", "float"):
            out.append(f"{key}: needs dates as text in format {hc.dates.format!r}, but "
                       f"schema.types.{col} is {declared}; declare it string")  # fmt: skip
        probe = _probe(hc)
        if probe is not None:
            try:
                heights[col] = build_from_data(col, hc, probe).height
            except (ConfigError, InputDataError) as e:
                out.append(f"{key}: {e}")
        for i, r in enumerate(cfg.releases):
            domain = getattr(r, "domain", None) or {}
            values = domain.get(col) if isinstance(domain, Mapping) else None
            if not values:
                continue
            try:  # the builder on the public domain the config declares for this column
                build_from_data(col, hc, [str(v) for v in values])
            except (ConfigError, InputDataError) as e:
                out.append(f"releases[{i}].domain.{col}: does not fit {key}: {e}")
    for i, r in enumerate(cfg.releases):
        query_list = getattr(r, "query_list", None)
        if query_list is None:
            continue
        for q in query_list():
            for col, level in q.levels.items():
                top = heights.get(col)
                if top is not None and level > top:
                    out.append(
                        f"releases[{i}].levels.{col}: level {level} is above the top of "
                        f"hierarchies.{col} ({top}); use a level from 0 to {top}"
                    )
    return out


def check_static(cfg: PrivpipeConfig, loaded: Mapping[str, Hierarchy], where: str) -> None:
    """ConfigError (exit 2) listing :func:`static_problems`; at validate and before any
    charge, so no run fails on them after reading or after spending."""
    problems = static_problems(cfg, loaded)
    if problems:
        raise ConfigError(f"{where}: " + f"\n{where}: ".join(problems))
