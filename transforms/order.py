"""Ordering hints for a runner that runs one stage at a time (Beam's FnApiRunner).

Such a runner runs a stage once its inputs are complete, in the order they became ready.
``after`` makes a PCollection wait for others (a side input of nothing), so that work
that can overlap a long search in a worker process runs while it does (see
``transforms.planning``). It changes when steps run, never what they compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.pvalue import AsList


def after(pcoll: beam.PCollection, gate: Sequence[beam.PCollection], label: str) -> Any:
    """``pcoll``'s elements, passed on once every PCollection of ``gate`` is complete
    (``pcoll`` itself when ``gate`` is empty)."""
    if not gate:
        return pcoll
    done = tuple(gate) | f"{label}/Gate" >> beam.Flatten() | f"{label}/Done" >> beam.Map(_nothing)
    return pcoll | f"{label}/Wait" >> beam.Map(_first, AsList(done))


def _nothing(element: Any) -> None:
    return None


def _first(element: Any, done: list[None]) -> Any:
    return element
