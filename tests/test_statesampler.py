"""Beam's state samplers are made with a 10 ms period once the transforms are imported."""

from __future__ import annotations

import time
from collections.abc import Iterator

import apache_beam as beam
import pytest
from apache_beam.runners.worker import statesampler as beam_statesampler
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.counters import CounterFactory

from privpipe.transforms import statesampler


@pytest.fixture
def beams_default() -> Iterator[None]:
    """Beam's own default for the test, put back as it was after it."""
    init = beam_statesampler.StateSampler.__init__
    kept = init.__defaults__
    init.__defaults__ = (200,)
    try:
        yield
    finally:
        init.__defaults__ = kept


def test_importing_the_transforms_installs_it() -> None:
    assert statesampler.installed()
    sampler = beam_statesampler.StateSampler("step", CounterFactory())
    assert sampler.sampling_period_ms == statesampler.PERIOD_MS == 10


def test_install_sets_the_period_over_beams_default(beams_default: None) -> None:
    assert not statesampler.installed()
    assert beam_statesampler.StateSampler("s", CounterFactory()).sampling_period_ms == 200
    statesampler.install()
    assert statesampler.installed()
    assert beam_statesampler.StateSampler("s", CounterFactory()).sampling_period_ms == 10
    statesampler.install()  # once is enough: a second install changes nothing
    assert beam_statesampler.StateSampler.__init__.__defaults__ == (10,)


def test_a_period_set_by_someone_else_is_left_alone(beams_default: None) -> None:
    beam_statesampler.StateSampler.__init__.__defaults__ = (50,)
    statesampler.install()
    assert beam_statesampler.StateSampler("s", CounterFactory()).sampling_period_ms == 50
    assert not statesampler.installed()


def test_an_explicit_period_still_wins() -> None:
    sampler = beam_statesampler.StateSampler("s", CounterFactory(), sampling_period_ms=300)
    assert sampler.sampling_period_ms == 300


def test_a_sampler_still_samples_and_stops() -> None:
    """The shorter period changes the sampling, not what Beam does with it: a sampler runs
    a scoped state, attributes its time to it, and stops."""
    sampler = beam_statesampler.StateSampler("step", CounterFactory())
    state = sampler.scoped_state(beam_statesampler.CounterName("s", step_name="t"), "process")
    sampler.start()
    with state:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.finished
    assert state.sampled_msecs_int() > 0


def test_a_pipeline_runs_with_it() -> None:
    with beam.Pipeline() as p:
        out = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
        assert_that(out, equal_to([2, 4, 6]))
