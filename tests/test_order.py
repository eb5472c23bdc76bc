"""``transforms.order.after``: on Beam's FnApiRunner (one stage at a time) a step gated on
other PCollections runs after them, and its elements pass through unchanged."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from privpipe.transforms.order import after

EVENTS: list[str] = []  # the steps run in this process (FnApiRunner, in memory)


def record(element: Any, name: str) -> Any:
    EVENTS.append(name)
    return element


def test_a_gated_step_runs_after_its_gate() -> None:
    """Without the gate, "gated" is fused with "early" and runs before "late", which is
    two shuffles further away."""
    EVENTS.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        early = p | "A" >> beam.Create([1, 2]) | "Early" >> beam.Map(record, "early")
        late = (
            p
            | "B" >> beam.Create([(3, 3)])
            | "Shuffle1" >> beam.GroupByKey()
            | "Rekey" >> beam.MapTuple(lambda key, values: (key, len(values)))
            | "Shuffle2" >> beam.GroupByKey()
            | "Late" >> beam.Map(record, "late")
        )
        gated = after(early, [late], "AfterLate") | "Gated" >> beam.Map(record, "gated")
        assert_that(gated, equal_to([1, 2]))  # passed on unchanged
    assert EVENTS.index("late") < EVENTS.index("gated")
    assert EVENTS.count("gated") == 2 and EVENTS.count("late") == 1


def test_no_gate_is_the_pcollection_itself() -> None:
    with beam.Pipeline(runner=FnApiRunner()) as p:
        early = p | beam.Create([1])
        assert after(early, [], "Nothing") is early
