"""Stage timings: the driver's StageClock, the pipeline's Beam counters, their merge."""

from __future__ import annotations

import time

import apache_beam as beam
import pandas as pd
import pytest

from privpipe import timing
from privpipe.timing import StageClock, merge_stages, slowest
from privpipe.transforms.timing import TimedCombineFn, TimedDoFn, stage_counters, stage_ms, timed
from tests.beamtest import local_pipeline


def test_stages_accumulate_and_nest_exclusively() -> None:
    clock = StageClock()
    with clock.stage("audit"):
        time.sleep(0.02)
        with clock.stage("report"):
            time.sleep(0.3)
    with clock.stage("audit"):
        time.sleep(0.02)
    got = clock.as_dict()
    assert list(got) == ["report", "audit"]
    assert got["report"] >= 0.3
    assert 0.04 <= got["audit"] < 0.3  # the inner 0.3 s is the report's, not counted twice


def test_module_stage_needs_an_active_clock() -> None:
    with timing.stage("utility"):  # no run: nothing recorded, nothing fails
        pass
    clock = StageClock()
    with timing.active(clock):
        assert timing.current() is clock
        with timing.stage("utility"):
            time.sleep(0.01)
    assert timing.current() is None
    assert clock.as_dict()["utility"] >= 0.01
    t = clock.timings()
    assert t["stages"] == {"utility": clock.as_dict()["utility"]} and t["wall_s"] >= 0.01


def test_merge_and_slowest() -> None:
    merged = merge_stages({"graph": 2.0, "pipeline": 30.0}, {"search:k5": 12500, "read": 900})
    assert merged == {"graph": 2.0, "pipeline": 30.0, "read": 0.9, "search:k5": 12.5}
    assert slowest(merged, 2) == "pipeline 30.0s, search:k5 12.5s"


class _Slow(beam.DoFn):  # type: ignore[misc]
    def process(self, x: int, offset: int) -> object:
        time.sleep(0.02)
        yield x + offset


class _Sum(beam.CombineFn):  # type: ignore[misc]
    def create_accumulator(self) -> int:
        return 0

    def add_input(self, acc: int, x: int) -> int:
        time.sleep(0.01)
        return acc + x

    def merge_accumulators(self, accs: object) -> int:
        return sum(accs)  # type: ignore[call-overload,no-any-return]

    def extract_output(self, acc: int) -> int:
        return acc


def _frame(n: int) -> pd.DataFrame:
    with stage_ms("frame"):
        time.sleep(0.01)
        return pd.DataFrame({"n": [n]})


@pytest.mark.slow
def test_pipeline_counters_reach_the_driver() -> None:
    p = local_pipeline()
    nums = p | beam.Create([1, 2, 3]) | beam.ParDo(TimedDoFn("plus", _Slow()), 10)
    total = nums | beam.CombineGlobally(TimedCombineFn("sum", _Sum()))
    _ = total | beam.Map(timed("frame_of", _frame))
    result = p.run()
    result.wait_until_finish()
    ms = stage_counters(result)
    assert set(ms) == {"plus", "sum", "frame", "frame_of"}
    assert ms["plus"] >= 55 and ms["sum"] >= 25 and ms["frame_of"] >= ms["frame"] >= 9
