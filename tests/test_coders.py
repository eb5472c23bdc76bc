"""``transforms.coders.BatchCoder``: Beam's default coder, without encoding a batch to
estimate its size for Beam's byte counters."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam import typehints
from apache_beam.coders import coders, typecoders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import opcounters
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.counters import CounterFactory

from privpipe.pipelines.runner import runner_for
from privpipe.transforms.coders import BatchCoder, use_batch_coder


def _batch(n: int = 50_000) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "s": pd.array([f"v{i % 97}" for i in range(n)], dtype="string[pyarrow]"),
            "i": pd.array(np.arange(n), dtype="Int64"),
            "f": np.linspace(0, 1, n),
        }
    )


def test_a_batch_is_encoded_as_beams_default_coder_does() -> None:
    ours, beams = BatchCoder().get_impl(), coders.FastPrimitivesCoder().get_impl()
    for value in (_batch(), (1, "a"), {"k": [1.5, None]}, b"bytes", "text", 7):
        encoded = ours.encode(value)
        assert encoded == beams.encode(value)
        decoded = ours.decode(encoded)
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(decoded, value)
        else:
            assert decoded == value
        if not isinstance(value, pd.DataFrame):  # everything else measured as before
            assert ours.estimate_size(value) == beams.estimate_size(value)


def test_a_batchs_size_is_estimated_without_encoding_it(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    encoded = len(BatchCoder().get_impl().encode(batch))

    def refuse(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("the batch was encoded to measure it")

    monkeypatch.setattr("pickle.dumps", refuse)  # the coder made below pickles with this
    # Beam's byte counters sample an element through the coder's size estimate
    counters = opcounters.OperationCounters(
        CounterFactory(), "step", coders.WindowedValueCoder(BatchCoder(coders.PickleCoder())), 0
    )
    value = GlobalWindows.windowed_value(batch)
    size, _ = counters.coder_impl.get_estimated_size_and_observables(value)
    assert 0.5 * encoded < size < 2 * encoded
    beams = opcounters.OperationCounters(
        CounterFactory(),
        "step",
        coders.WindowedValueCoder(coders.FastPrimitivesCoder(coders.PickleCoder())),
        0,
    )
    with pytest.raises(AssertionError, match="encoded to measure"):  # as Beam's own does
        beams.coder_impl.get_estimated_size_and_observables(value)


def test_untyped_pcollections_get_it_once_a_runner_is_chosen() -> None:
    runner_for(PipelineOptions([]))
    use_batch_coder()  # idempotent: registered once
    fallback = typecoders.registry._fallback_coder
    assert [c for c in fallback._coders if c is BatchCoder] == [BatchCoder]
    assert isinstance(typecoders.registry.get_coder(typehints.Any), BatchCoder)
    assert isinstance(typecoders.registry.get_coder(pd.DataFrame), BatchCoder)
    assert not isinstance(typecoders.registry.get_coder(int), BatchCoder)
    p = beam.Pipeline(runner=runner_for(PipelineOptions([])))
    _ = p | beam.Create([_batch(10)], reshuffle=False) | "Keep" >> beam.Map(lambda b: b)
    proto = p.to_runner_api()
    payloads = [c.spec.payload for c in proto.components.coders.values()]
    assert any(b"BatchCoder" in payload for payload in payloads)
