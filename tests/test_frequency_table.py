"""The release summary (coded frequency table) equals pandas' value counts, however the
batches are split and merged, with string or categorical columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.anonymize import COUNT, FrequencyTable, _value_counts


def key(d: pd.DataFrame) -> list[tuple[str, str, str, int]]:
    return sorted(
        zip(
            d["a"].astype(object).where(d["a"].notna(), "<NA>").astype(str),
            d["b"].astype(object).astype(str),
            d["c"].astype(object).astype(str),
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
    categorical=st.booleans(),
)
def test_frequency_table_matches_pandas(
    seed: int, n: int, step: int, cut: int, categorical: bool
) -> None:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "a": pd.array(rng.choice(["x", "y", "z", None], n), dtype="str"),
            "b": pd.array(rng.integers(0, 50, n), dtype="Int64"),
            "c": pd.array(rng.integers(0, 3, n).astype(str), dtype="str"),
        }
    )
    fn = FrequencyTable(["a", "b", "c"], categorical=categorical)
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
    for c in ("a", "b", "c"):  # per-value counts as the search step reads them
        want = expected.groupby(c, dropna=False)[COUNT].sum()
        pd.testing.assert_series_equal(_value_counts(out[c], out[COUNT]), want)


def test_empty_input_gives_empty_table() -> None:
    fn = FrequencyTable(["a"])
    out = fn.extract_output(fn.create_accumulator())
    assert list(out.columns) == ["a", "count"] and len(out) == 0
