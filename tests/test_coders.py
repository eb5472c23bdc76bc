"""``transforms.coders.BatchCoder``: Beam's default coder, without encoding a batch to
estimate its size for Beam's byte counters."""

from __future__ import annotations

import pickle
import struct
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
from hypothesis import given, settings
from hypothesis import strategies as st

import privpipe.transforms.coders as coders_module
from privpipe.pipelines.runner import runner_for
from privpipe.transforms.anonymize import FrequencyTable
from privpipe.transforms.coders import (
    BatchCoder,
    HandOverCoder,
    drop_handed_over,
    frame_bytes,
    handing_over,
    hands_over,
    use_batch_coder,
)
from privpipe.transforms.overlap import OverlappedCombineFn
from privpipe.transforms.timing import TimedCombineFn
from tests.beamtest import local_pipeline


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


_COLUMNS = {  # one column of n rows per kind a batch may carry
    "int8": lambda n: np.arange(n, dtype=np.int8),
    "int64": lambda n: np.arange(n, dtype=np.int64),
    "uint64": lambda n: np.arange(n, dtype=np.uint64),
    "float32": lambda n: np.linspace(0, 1, n, dtype=np.float32),
    "float64": lambda n: np.linspace(0, 1, n),
    "bool": lambda n: np.arange(n) % 2 == 0,
    "object": lambda n: np.array([f"x{i}" for i in range(n)], dtype=object),
    "str": lambda n: pd.array([f"s{i % 7}" for i in range(n)], dtype="str"),
    "string[pyarrow]": lambda n: pd.array([f"p{i}" for i in range(n)], dtype="string[pyarrow]"),
    "Int64": lambda n: pd.array([None if i % 3 == 0 else i for i in range(n)], dtype="Int64"),
    "boolean": lambda n: pd.array(
        [None if i % 4 == 0 else i % 2 == 0 for i in range(n)], dtype="boolean"
    ),
    "category": lambda n: pd.Categorical([f"c{i % 5}" for i in range(n)]),
    "wide category": lambda n: pd.Categorical(np.arange(n) % 300, categories=np.arange(300)),
    "datetime": lambda n: pd.date_range("2026-01-01", periods=n, freq="h").to_numpy(),
    "datetime tz": lambda n: pd.date_range("2026-01-01", periods=n, freq="h", tz="UTC"),
    "timedelta": lambda n: pd.to_timedelta(np.arange(n), unit="s").to_numpy(),
}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(_COLUMNS)), max_size=8),
    rows=st.integers(0, 40),
    cut=st.integers(0, 40),
)
def test_a_batchs_estimate_is_its_columns_nbytes(kinds: list[str], rows: int, cut: int) -> None:
    """``frame_bytes``: the sum of the columns' ``nbytes``, for every kind of column
    (several of one dtype share a block), and for a slice of rows."""
    frame = pd.DataFrame({f"{i}:{kind}": _COLUMNS[kind](rows) for i, kind in enumerate(kinds)})
    for each in (frame, frame.iloc[: min(cut, rows)], frame.iloc[::2]):
        assert frame_bytes(each) == sum(int(column.nbytes) for _, column in each.items())


def test_a_batchs_estimate_falls_back_where_pandas_holds_no_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frame = _batch(100)
    expected = int(frame.memory_usage(index=False, deep=False).sum())
    calls: list[bool] = []
    items = pd.DataFrame.items

    def counted(self: pd.DataFrame) -> Any:
        calls.append(True)
        return items(self)

    monkeypatch.setattr(pd.DataFrame, "items", counted)
    assert frame_bytes(frame) == expected and not calls  # from the block arrays
    monkeypatch.setattr(type(frame._mgr), "arrays", property(lambda self: None))
    assert frame_bytes(frame) == expected and calls == [True]


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


# --------------------------------------------------------------------------- hand-over


def test_hand_over_gives_the_object_itself_once() -> None:
    """``HandOverCoder``: the decoded object is the encoded one (no copy); a key decodes
    once (a second decode, or one in another process, is an error that says so); sizes
    are estimated without handing anything over."""
    coder = HandOverCoder()
    impl = coder.get_impl()
    value = {"big": np.arange(10)}
    before = len(coders_module._handed)
    assert impl.estimate_size(value) == 16 and len(coders_module._handed) == before
    encoded = impl.encode(value)
    assert len(encoded) == 16
    assert impl.decode(encoded) is value
    with pytest.raises(RuntimeError, match="decoded twice, or by a runner in another process"):
        impl.decode(encoded)
    assert len(coders_module._handed) == before
    # a key from another process is refused even where this process has that key (a fork)
    foreign = impl.encode(value)
    pid, key = struct.unpack("<qq", foreign)
    with pytest.raises(RuntimeError, match="not found in process"):
        impl.decode(struct.pack("<qq", pid + 1, key))
    assert impl.decode(foreign) is value
    # the coder travels in the pipeline proto: a copy hands over through the same registry
    copy = pickle.loads(pickle.dumps(coder))
    assert copy == coder and copy.decode(coder.encode(value)) is value


def test_frequency_tables_hand_over_only_when_built_to_hand_over() -> None:
    """A frequency table built while ``handing_over(True)`` (a graph for a runner in this
    process) has the hand-over accumulator coder, also through the timing and overlap
    wrappers; built otherwise (or after), Beam's default."""
    plain = FrequencyTable(["a"])
    with handing_over(True):
        handing = FrequencyTable(["a"])
        assert hands_over()
    assert not hands_over()
    assert not isinstance(plain.get_accumulator_coder(), HandOverCoder)
    assert isinstance(handing.get_accumulator_coder(), HandOverCoder)
    for wrapper in (TimedCombineFn, OverlappedCombineFn):
        assert isinstance(wrapper("s", handing).get_accumulator_coder(), HandOverCoder)
        assert not isinstance(wrapper("s", plain).get_accumulator_coder(), HandOverCoder)


_COLLECTED: list[pd.DataFrame] = []  # the in-process runner's outputs (a module global)


def _collect(table: pd.DataFrame) -> None:
    _COLLECTED.append(table)


def test_a_pipeline_handing_over_counts_as_one_that_pickles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the in-process runner, frequency tables whose accumulators are handed over by
    reference give the same table as pickled ones, every object handed over is taken, and
    the hand-over is used (partial tables of several bundles reach the merge)."""
    encoded: list[object] = []
    original = HandOverCoder.encode

    def counting(self: HandOverCoder, value: object) -> bytes:
        encoded.append(type(value).__name__)
        return original(self, value)

    monkeypatch.setattr(HandOverCoder, "encode", counting)
    rng = np.random.default_rng(7)
    batches = [
        pd.DataFrame({"a": pd.array(rng.choice(["x", "y", "z"], 500), dtype="str")})
        for _ in range(6)
    ]
    tables = []
    for hand_over in (False, True):
        _COLLECTED.clear()
        with handing_over(hand_over):
            fn = OverlappedCombineFn("t", FrequencyTable(["a"]))
        with local_pipeline() as p:
            _ = (
                p
                | beam.Create(batches, reshuffle=True)
                | beam.CombineGlobally(fn)
                | beam.Map(_collect)
            )
        (table,) = _COLLECTED
        tables.append(table.sort_values("a").reset_index(drop=True))
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert encoded and set(encoded) == {"_Partial"}
    assert not coders_module._handed  # every one taken
    assert drop_handed_over() == 0
