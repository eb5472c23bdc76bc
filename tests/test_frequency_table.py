"""The release summary (hashed frequency table) equals pandas' value counts, however the
batches are split and merged."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.anonymize import FrequencyTable


def key(d: pd.DataFrame) -> list[tuple[str, str, str, int]]:
    return sorted(
        zip(
            d["a"].fillna("<NA>").astype(str),
            d["b"].astype(str),
            d["c"].astype(str),
            d["count"].astype(int),
            strict=True,
        )
    )


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 3000),
    step=st.integers(1, 700),
    cut=st.integers(0, 3000),
)
def test_frequency_table_matches_pandas(seed: int, n: int, step: int, cut: int) -> None:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "a": pd.array(rng.choice(["x", "y", "z", None], n), dtype="str"),
            "b": pd.array(rng.integers(0, 50, n), dtype="Int64"),
            "c": pd.array(rng.integers(0, 3, n).astype(str), dtype="str"),
        }
    )
    fn = FrequencyTable(["a", "b", "c"])
    accs = []
    for part in (df.iloc[: min(cut, n)], df.iloc[min(cut, n) :]):
        acc = fn.create_accumulator()
        for i in range(0, len(part), step):
            acc = fn.add_input(acc, part.iloc[i : i + step])
        accs.append(acc)
    out = fn.extract_output(fn.merge_accumulators(accs))
    expected = df.astype("str").value_counts(dropna=False).rename("count").reset_index()
    assert key(out) == key(expected)
    assert int(out["count"].sum()) == n


def test_empty_input_gives_empty_table() -> None:
    fn = FrequencyTable(["a"])
    out = fn.extract_output(fn.create_accumulator())
    assert list(out.columns) == ["a", "count"] and len(out) == 0
