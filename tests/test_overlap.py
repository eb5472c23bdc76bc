"""Combiners whose additions run on a thread of the accumulator's own
(``transforms.overlap``): same results as the wrapped CombineFn, in order, on another
thread, at most ``DEPTH`` batches waiting, errors raised again unchanged, accumulators
pickled as the wrapped ones; in a pipeline the stage's time still reaches the driver."""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.testing.util import assert_that, equal_to

from privpipe.transforms.anonymize import FrequencyTable
from privpipe.transforms.overlap import DEPTH, OverlappedCombineFn
from privpipe.transforms.timing import stage_counters
from tests.beamtest import local_pipeline


class _Record(beam.CombineFn):  # type: ignore[misc]
    """Keeps every element in the order it was added, and the thread that added it."""

    def __init__(self, gate: threading.Event | None = None, fail_on: object = None) -> None:
        super().__init__()
        self.gate = gate
        self.fail_on = fail_on

    def create_accumulator(self) -> list[Any]:
        return []

    def add_input(self, acc: list[Any], element: Any) -> list[Any]:
        if self.gate is not None:
            assert self.gate.wait(10)
        if element == self.fail_on:
            raise ValueError(f"bad element {element!r}")
        acc.append((element, threading.get_ident()))
        return acc

    def merge_accumulators(self, accs: Any) -> list[Any]:
        merged: list[Any] = []
        for acc in accs:
            merged.extend(acc)
        return merged

    def extract_output(self, acc: list[Any]) -> list[Any]:
        return [element for element, _ in acc]


def test_additions_run_in_order_on_another_thread() -> None:
    fn = OverlappedCombineFn("record", _Record())
    acc = fn.create_accumulator()
    for element in range(50):
        acc = fn.add_input(acc, element)
    inner = fn.compact(acc)
    assert [element for element, _ in inner] == list(range(50))
    threads = {thread for _, thread in inner}
    assert threads and threading.get_ident() not in threads
    assert fn.extract_output(fn.merge_accumulators([inner, fn.create_accumulator()])) == list(
        range(50)
    )


def test_the_stage_goes_on_while_at_most_depth_batches_wait() -> None:
    gate = threading.Event()
    fn = OverlappedCombineFn("record", _Record(gate))
    acc = fn.create_accumulator()
    returned: list[int] = []

    def feed() -> None:
        nonlocal acc
        for element in range(DEPTH + 3):
            acc = fn.add_input(acc, element)
            returned.append(element)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    deadline = time.monotonic() + 10
    while len(returned) < DEPTH + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # give a further call the time it would need to return
    # one addition held at the gate, DEPTH queued: the next call waits for a place
    assert len(returned) == DEPTH + 1
    gate.set()
    feeder.join(10)
    assert returned == list(range(DEPTH + 3))
    assert fn.extract_output(acc) == list(range(DEPTH + 3))


def test_an_error_of_an_addition_is_raised_again_unchanged() -> None:
    fn = OverlappedCombineFn("record", _Record(fail_on=3))
    acc = fn.create_accumulator()
    for element in range(5):
        acc = fn.add_input(acc, element)
    with pytest.raises(ValueError, match="bad element 3"):
        fn.extract_output(acc)
    # and by the next addition, once the failure is known
    acc = fn.create_accumulator()
    acc = fn.add_input(acc, 3)
    thread = acc._thread
    deadline = time.monotonic() + 10  # until the thread has failed on it, however slow
    with pytest.raises(ValueError, match="bad element 3"):
        while time.monotonic() < deadline:
            acc = fn.add_input(acc, 0)
            time.sleep(0.001)
    assert thread is not None and not thread.is_alive()  # stopped, not left waiting


def test_an_accumulator_pickles_as_the_wrapped_one() -> None:
    fn = OverlappedCombineFn("record", _Record())
    acc = fn.create_accumulator()
    for element in range(7):
        acc = fn.add_input(acc, element)
    copy = pickle.loads(pickle.dumps(acc))
    assert isinstance(copy, list) and [element for element, _ in copy] == list(range(7))
    # a decoded (plain) accumulator takes further additions
    copy = fn.add_input(copy, 7)
    assert fn.extract_output(copy) == list(range(8))


def _batches(rng: np.random.Generator, n: int) -> list[pd.DataFrame]:
    return [
        pd.DataFrame(
            {
                "zip": rng.integers(0, 30, 500).astype(str),
                "age": pd.array(rng.integers(0, 90, 500), dtype="Int64"),
            }
        )
        for _ in range(n)
    ]


def test_the_frequency_table_is_the_same_overlapped() -> None:
    rng = np.random.default_rng(11)  # test data, not a release
    batches = _batches(rng, 9)
    plain = FrequencyTable(["zip", "age"])
    fn = OverlappedCombineFn("summary", FrequencyTable(["zip", "age"]))
    expected, acc = plain.create_accumulator(), fn.create_accumulator()
    for batch in batches:
        expected = plain.add_input(expected, batch)
        acc = fn.add_input(acc, batch)
    want = plain.extract_output(expected).sort_values(["zip", "age"]).reset_index(drop=True)
    got = fn.extract_output(acc).sort_values(["zip", "age"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    assert int(got["count"].sum()) == 9 * 500


@pytest.mark.slow
def test_in_a_pipeline_results_and_stage_time_reach_the_driver() -> None:
    p = local_pipeline()
    total = (
        p
        | beam.Create(list(range(40)))
        | beam.CombineGlobally(OverlappedCombineFn("record", _Slow()))
        | beam.Map(sorted)
    )
    assert_that(total, equal_to([list(range(40))]))
    result = p.run()
    result.wait_until_finish()
    assert stage_counters(result)["record"] >= 40 * 2


class _Slow(_Record):
    """2.5 ms of CPU per element (the stage's figure is the additions' CPU time)."""

    def add_input(self, acc: list[Any], element: Any) -> list[Any]:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.0025:
            pass
        return super().add_input(acc, element)


def test_a_run_can_exit_with_an_accumulator_never_settled() -> None:
    fn = OverlappedCombineFn("record", _Record(threading.Event()))
    acc = fn.create_accumulator()
    acc = fn.add_input(acc, 1)  # held at a gate that never opens
    threads = [t for t in threading.enumerate() if t.name == "privpipe-combine"]
    assert threads and all(t.daemon for t in threads)
