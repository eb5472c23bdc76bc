"""benchmarks/regress.py: which stages got slower than the recorded figures (pure logic)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_regress", ROOT / "benchmarks" / "regress.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_regress"] = module
    spec.loader.exec_module(module)
    return module


regress = _load()


def line(stages: dict[str, float], rows: int = 1000, **top: float) -> dict[str, object]:
    timings = {"wall_s": sum(stages.values()), "pipeline_s": stages.get("pipeline", 0.0)}
    return {"benchmark": "demo", "rows": rows, "timings": {**timings, "stages": stages}, **top}


def test_a_slower_stage_is_named_and_fails() -> None:
    old = {"search:k5": 10.0, "attacks": 5.0}
    result = regress.compare(old, {"search:k5": 13.0, "attacks": 5.1})
    assert [s[0] for s in result.slower] == ["search:k5"]
    assert result.failed()
    assert any(x.startswith("SLOWER search:k5: 10.00s -> 13.00s (+30%)") for x in result.lines())


def test_a_faster_stage_is_not_named_slower() -> None:
    result = regress.compare({"search:k5": 10.0, "read": 4.0}, {"search:k5": 6.0, "read": 4.2})
    assert result.slower == []
    assert [s[0] for s in result.faster] == ["search:k5"]
    assert not result.failed()


def test_both_tolerances_must_be_exceeded() -> None:
    # +200% but only 0.2 s: noise on a shared machine; +10% of a long stage: within 20%
    result = regress.compare({"commit": 0.1, "pipeline": 100.0}, {"commit": 0.3, "pipeline": 110.0})
    assert result.slower == []
    tighter = regress.compare({"pipeline": 100.0}, {"pipeline": 110.0}, tolerance=0.05)
    assert [s[0] for s in tighter.slower] == ["pipeline"]


def test_a_missing_stage_is_reported_and_fails_only_when_strict() -> None:
    result = regress.compare({"search:k5": 10.0, "search:l3": 3.0}, {"search": 12.0})
    assert result.missing == ["search:k5", "search:l3"]
    assert result.new == ["search"]
    assert not result.failed()
    assert result.failed(strict=True)
    assert "missing search:l3: recorded, not in the new run" in result.lines()


def test_figures_of_a_bench_line_and_of_a_manifest() -> None:
    bench = line({"pipeline": 50.0, "attacks": 5.0}, wall_s=70.0, cpu_s=80.0)
    assert regress.figures(bench) == {
        "pipeline": 50.0,
        "attacks": 5.0,
        "(wall_s)": 70.0,  # the bench's process tree, not the manifest's wall
        "(cpu_s)": 80.0,
        "(pipeline_s)": 50.0,
    }
    manifest = {"rows_read": 1000, "timings": {"wall_s": 60.0, "cpu_s": 55.0, "stages": {}}}
    assert regress.figures(manifest) == {"(wall_s)": 60.0, "(cpu_s)": 55.0}
    with pytest.raises(ValueError, match="no timings"):
        regress.figures({"rows": 1000})


def test_the_reference_is_the_newest_line_of_the_same_size() -> None:
    lines = [line({"a": 1.0}, rows=1000), line({"a": 2.0}, rows=5000), line({"a": 3.0}, rows=1000)]
    assert regress.reference(lines, line({}, rows=1000)) is lines[2]
    assert regress.reference(lines, {"rows_read": 5000, "timings": {}}) is lines[1]
    assert regress.reference(lines, line({}, rows=7)) is None


def test_main_exits_1_on_a_slower_stage_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text(json.dumps(line({"search:k5": 10.0, "read": 2.0})) + "\n")
    new = tmp_path / "new.jsonl"
    new.write_text("# bench_demo.py\n" + json.dumps(line({"search:k5": 20.0, "read": 2.0})) + "\n")
    assert regress.main([str(new), "--recorded", str(recorded)]) == 1
    out = capsys.readouterr().out
    assert "SLOWER search:k5" in out and "SLOWER read" not in out
    same = tmp_path / "same.jsonl"
    same.write_text(json.dumps(line({"search:k5": 10.2, "read": 2.0})) + "\n")
    assert regress.main([str(same), "--recorded", str(recorded), "--record"]) == 0
    assert len(recorded.read_text().splitlines()) == 2  # appended


def test_bench_demo_cores_from_cpu_samples() -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_demo", ROOT / "benchmarks" / "bench_demo.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # (seconds since start, CPU seconds of the tree): 2 cores busy from 10 s to 20 s
    samples = [(0.0, 1.0), (10.0, 2.0), (15.0, 12.0), (20.0, 22.0), (30.0, 23.0)]
    assert bench.cores_between(samples, 10.0, 20.0) == 2.0
    assert bench.cores_between(samples, 0.0, 30.0) == round(22 / 30, 2)
    assert bench.cores_between(samples, 12.5, 17.5) == 2.0  # interpolated between samples
    assert bench.cores_between(samples, 20.0, 20.0) is None
    assert bench.cores_between([], 0.0, 1.0) is None
