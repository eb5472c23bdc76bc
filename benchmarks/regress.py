"""Did a stage get slower? A bench_demo JSON line (or a run's manifest) against the record.

The recorded figures are ``benchmarks/recorded.jsonl``: one JSON line per recorded run
(bench_demo's line: benchmark, rows, date, commit, machine, wall/CPU seconds, the
manifest's stage timings). RESULTS.md stays the human record. The newest recorded line of
the same benchmark and row count is the reference; every stage of it is compared with the
new figures, with the run's wall, CPU and pipeline seconds:

- slower: more than ``--tolerance`` (default 20%) AND more than ``--min-seconds``
  (default 0.5 s) above the record (both, so tiny stages do not flap on a shared machine);
- missing: a recorded stage the new run does not have (renamed, or no longer run);
- new: a stage the record does not have (reported, never a failure).

Exit 1 if any stage is slower (with ``--strict`` also if one is missing), else 0.

    python benchmarks/regress.py NEW.jsonl|manifest.json [--recorded FILE] [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded.jsonl"
TOTALS = ("wall_s", "cpu_s", "pipeline_s")  # compared as "(wall_s)", "(cpu_s)", ...


@dataclass
class Comparison:
    """Stages slower / faster than the record (name, recorded s, new s); missing; new."""

    slower: list[tuple[str, float, float]] = field(default_factory=list)
    faster: list[tuple[str, float, float]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)

    def failed(self, strict: bool = False) -> bool:
        return bool(self.slower) or (strict and bool(self.missing))

    def lines(self) -> list[str]:
        out = [
            f"SLOWER {name}: {old:.2f}s -> {new:.2f}s ({_pct(old, new)})"
            for name, old, new in self.slower
        ]
        out += [f"missing {name}: recorded, not in the new run" for name in self.missing]
        out += [
            f"faster {name}: {old:.2f}s -> {new:.2f}s ({_pct(old, new)})"
            for name, old, new in self.faster
        ]
        out += [f"new {name}: not in the record" for name in self.new]
        return out


def _pct(old: float, new: float) -> str:
    return f"{(new - old) / old:+.0%}" if old > 0 else "new time"


def figures(doc: Mapping[str, Any]) -> dict[str, float]:
    """``{name: seconds}`` of a bench line or a manifest: every stage, and the totals as
    ``(wall_s)``, ``(cpu_s)``, ``(pipeline_s)`` (a bench line's own wall/CPU of the whole
    process tree first, else the manifest's)."""
    timings = doc.get("timings")
    if not isinstance(timings, Mapping):
        raise ValueError("no timings: expected a bench_demo JSON line or a run's manifest.json")
    out = {str(k): float(v) for k, v in (timings.get("stages") or {}).items()}
    for key in TOTALS:
        value = doc.get(key, timings.get(key)) if key != "pipeline_s" else timings.get(key)
        if value is not None:
            out[f"({key})"] = float(value)
    return out


def compare(
    recorded: Mapping[str, float],
    new: Mapping[str, float],
    tolerance: float = 0.2,
    min_seconds: float = 0.5,
) -> Comparison:
    """Each recorded figure against the new one (see the module docstring for the rules)."""
    result = Comparison()
    for name, old in recorded.items():
        if name not in new:
            result.missing.append(name)
            continue
        now = new[name]
        if now > old * (1 + tolerance) and now - old > min_seconds:
            result.slower.append((name, old, now))
        elif now < old / (1 + tolerance) and old - now > min_seconds:
            result.faster.append((name, old, now))
    result.new = [name for name in new if name not in recorded]
    result.slower.sort(key=lambda s: s[1] - s[2])  # the largest slow-down first
    return result


def reference(
    lines: Sequence[Mapping[str, Any]], doc: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The newest recorded line of the same benchmark and rows as ``doc`` (None: none)."""
    rows = doc.get("rows", doc.get("rows_read"))  # a bench line, or a manifest
    kind = doc.get("benchmark", "demo")
    same = [r for r in lines if r.get("benchmark", "demo") == kind and r.get("rows") == rows]
    return same[-1] if same else None


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, or the one object of a JSON file (a manifest)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("{") and "\n{" not in text.strip():
        return [json.loads(text)]
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new", help="bench_demo output (JSON lines) or a run's manifest.json")
    ap.add_argument("--recorded", default=str(RECORDED), help="the record (JSON lines)")
    ap.add_argument("--tolerance", type=float, default=0.2, help="relative (default 0.2)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="absolute (default 0.5)")
    ap.add_argument("--strict", action="store_true", help="a missing stage fails too")
    ap.add_argument("--record", action="store_true", help="append the new line to the record")
    args = ap.parse_args(argv)
    docs = [d for d in read_lines(Path(args.new)) if isinstance(d.get("timings"), Mapping)]
    if not docs:
        print(f"regress: {args.new}: no line with timings", file=sys.stderr)
        return 2
    doc = docs[-1]
    recorded_path = Path(args.recorded)
    lines = read_lines(recorded_path) if recorded_path.exists() else []
    ref = reference(lines, doc)
    failed = False
    if ref is None:
        print(f"regress: no recorded figures for {doc.get('rows')} rows in {recorded_path}")
    else:
        result = compare(figures(ref), figures(doc), args.tolerance, args.min_seconds)
        print(
            f"regress: against the record of {ref.get('date')} (commit {ref.get('commit')}); "
            f"tolerance {args.tolerance:.0%} and {args.min_seconds:g}s"
        )
        for line in result.lines():
            print(f"regress:   {line}")
        failed = result.failed(args.strict)
        print(f"regress: {'FAILED' if failed else 'ok'}: {len(result.slower)} slower stage(s)")
    if args.record:
        with recorded_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")
        print(f"regress: recorded in {recorded_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
