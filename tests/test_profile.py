"""The batch-wise profile equals the same statistics computed by pandas on the whole table."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import example, given, settings
from hypothesis import strategies as st

from privpipe.hashing import combine_hashes
from privpipe.transforms.profile import ProfileFn, _hash, split_internal


def run_combine(fn: ProfileFn, batches: list[pd.DataFrame], split: int) -> dict:
    """Combine as a runner would: several accumulators, merged."""
    accs = []
    for chunk in (batches[:split], batches[split:]):
        acc = fn.create_accumulator()
        for b in chunk:
            acc = fn.add_input(acc, b)
        accs.append(acc)
    return fn.extract_output(fn.merge_accumulators(accs))


def table(seed: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "zip": rng.choice(["47677", "47678", "47602", "13053"], n),
            "age": pd.array(rng.integers(20, 40, n), dtype="Int64"),
            "sex": rng.choice(["M", "F"], n),
            "disease": pd.array(rng.choice(["flu", "ulcer", None], n), dtype="str"),
        }
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400),
    parts=st.integers(1, 7),
    split=st.integers(0, 7),
)
def test_profile_matches_pandas(seed: int, n: int, parts: int, split: int) -> None:
    df = table(seed, n)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    batches = [df.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(bounds) if b > a]
    fn = ProfileFn(list(df.columns), ["zip", "age", "sex"], ["zip", "age", "sex", "disease"])
    public, counts = split_internal(run_combine(fn, batches, min(split, len(batches))))
    assert public["rows"] == n
    for col in df.columns:
        assert public["columns"][col]["distinct"] == df[col].nunique(dropna=True)
        assert public["columns"][col]["missing"] == int(df[col].isna().sum())
    sizes = df.groupby(["zip", "age", "sex"]).size()
    assert public["qi_combinations"]["distinct"] == len(sizes)
    assert public["qi_combinations"]["unique"] == int((sizes == 1).sum())
    assert public["qi_combinations"]["unique_share_of_rows"] == (sizes == 1).sum() / n
    for col in ["zip", "age", "sex", "disease"]:
        expected = df[col].value_counts(dropna=True)
        got = counts[col]
        assert dict(zip(map(str, got.index), got.to_numpy(), strict=True)) == dict(
            zip(map(str, expected.index), expected.to_numpy(), strict=True)
        )


def test_published_profile_holds_no_values() -> None:
    df = table(1, 50)
    fn = ProfileFn(list(df.columns), ["zip"], ["zip"])
    public, _ = split_internal(run_combine(fn, [df], 1))
    assert "47677" not in repr(public)


def test_compaction_keeps_counts_exact() -> None:
    """Many batches trigger the amortised compaction; counts stay exact."""
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 300_000, 400_000).astype(str)
    df = pd.DataFrame({"pid": ids, "q": rng.integers(0, 1000, 400_000).astype(str)})
    batches = [df.iloc[i : i + 20_000].reset_index(drop=True) for i in range(0, len(df), 20_000)]
    fn = ProfileFn(["pid", "q"], ["q", "pid"], [])
    public, _ = split_internal(run_combine(fn, batches, 11))
    assert public["columns"]["pid"]["distinct"] == df["pid"].nunique()
    sizes = df.groupby(["q", "pid"]).size()
    assert public["qi_combinations"]["distinct"] == len(sizes)
    assert public["qi_combinations"]["unique"] == int((sizes == 1).sum())


def test_value_counts_summed_over_many_batches_stay_exact() -> None:
    """More batches than are summed at once (the pending counts folded several times, in
    each of two partial profiles and in their merge), a batch whose column is all
    missing, and values that appear in late batches only."""
    frames = [table(seed, 150) for seed in range(90)]
    frames[40] = frames[40].assign(disease=pd.array([None] * 150, dtype="str"))
    frames[80] = frames[80].assign(zip="99999")  # a value no earlier batch had
    df = pd.concat(frames, ignore_index=True)
    fn = ProfileFn(list(df.columns), ["zip"], ["zip", "age", "disease"])
    _, counts = split_internal(run_combine(fn, frames, 37))
    for col in ("zip", "age", "disease"):
        expected = df[col].value_counts(dropna=True)
        got = dict(zip(map(str, counts[col].index), counts[col].to_numpy(), strict=True))
        assert got == {str(k): int(v) for k, v in expected.items()}, col


def test_counted_columns_keep_no_hashes_their_value_counts_give_the_distinct_count() -> None:
    """A counted column's distinct count is the number of values its exact counts hold:
    no per-batch hashes of it are kept (sorted and merged for nothing before). Floats
    -0.0 and 0.0 are one value, as pandas counts them; a column of nothing but missing
    values has none. A column that is not counted (the unit here) keeps its hashes."""
    df = pd.DataFrame(
        {
            "pid": ["a", "b", "c", "d", "e", "f"],
            "zip": ["1", "1", "2", None, "3", "3"],
            "w": [0.0, -0.0, 1.5, np.nan, 1.5, 2.0],
            "none": pd.array([None] * 6, dtype="str"),
        }
    )
    fn = ProfileFn(list(df.columns), ["zip"], ["zip", "w", "none"], exact=["pid", "w", "none"])
    acc = fn.create_accumulator()
    for part in (df.iloc[:4], df.iloc[4:]):
        acc = fn.add_input(acc, part.reset_index(drop=True))
    assert not {"zip", "w", "none"} & set(acc.hashes)
    assert "pid" in acc.hashes
    public, _ = split_internal(fn.extract_output(fn.merge_accumulators([acc])))
    cols = public["columns"]
    assert (cols["zip"]["distinct"], cols["zip"]["missing"]) == (3, 1)
    assert (cols["w"]["distinct"], cols["w"]["missing"]) == (3, 1)  # 0.0, 1.5, 2.0
    assert (cols["none"]["distinct"], cols["none"]["missing"]) == (0, 6)
    assert cols["pid"]["distinct"] == 6 and all(c["exact"] for c in cols.values())


def test_a_counted_column_is_exact_even_when_exact_leaves_it_out() -> None:
    """Its exact value counts are kept anyway: no HyperLogLog estimate is made of it."""
    df = table(3, 300)
    fn = ProfileFn(list(df.columns), ["zip"], ["zip", "disease"], exact=[])
    acc = fn.add_input(fn.create_accumulator(), df)
    assert "disease" not in acc.sketches and "age" in acc.sketches
    public, _ = split_internal(fn.extract_output(acc))
    assert public["columns"]["disease"] == {
        "distinct": df["disease"].nunique(dropna=True),
        "missing": int(df["disease"].isna().sum()),
        "exact": True,
    }


def test_unique_persons_count_a_person_once() -> None:
    """Two visits of one person share a QI combination: that person is still unique."""
    df = pd.DataFrame(
        {
            "pid": ["a", "a", "b", "c", "c", "d"],
            "zip": ["1", "1", "2", "3", "3", "3"],
        }
    )
    fn = ProfileFn(["pid", "zip"], ["zip"], [], privacy_unit="pid")
    public, _ = split_internal(run_combine(fn, [df.iloc[:3], df.iloc[3:]], 1))
    q = public["qi_combinations"]
    assert q["unique"] == 1  # only zip 2 has one row
    assert q["persons"] == 4 and q["unique_persons"] == 2  # a (zip 1) and b (zip 2)
    assert q["unique_share_of_persons"] == 0.5


def test_row_hashes_combine_column_hashes_like_pandas() -> None:
    """The profile hashes each column once and combines: same as hashing the frame."""
    rng = np.random.default_rng(0)
    n = 5000
    df = pd.DataFrame(
        {
            "a": pd.array(rng.choice(["x", "y", None], n), dtype="str"),
            "b": pd.array(rng.integers(0, 9, n), dtype="Int64"),
            "c": rng.random(n),
        }
    )

    def pandas_hash(values: pd.Series | pd.DataFrame) -> np.ndarray:
        return pd.util.hash_pandas_object(values, index=False).to_numpy(dtype=np.uint64)

    for cols in (["a"], ["a", "b"], ["c", "a", "b"]):
        assert (combine_hashes([pandas_hash(df[c]) for c in cols]) == pandas_hash(df[cols])).all()
    # the profile's own column hashes (strings by their bytes) keep rows apart the same way
    for cols in (["a"], ["a", "b"], ["c", "a", "b"]):
        ours = combine_hashes([_hash(df[c]) for c in cols])
        theirs = pandas_hash(df[cols])
        assert len(np.unique(ours)) == len(np.unique(theirs))
        assert pd.crosstab(ours, theirs).astype(bool).sum(axis=1).max() == 1


def test_columns_no_release_uses_are_estimated_and_marked() -> None:
    rng = np.random.default_rng(3)
    n = 60_000
    df = table(5, n)
    df["value"] = rng.random(n)  # ~60k distinct floats: used by no release
    df.loc[::10, "value"] = np.nan
    df["note"] = pd.array(rng.choice(["a", "b", "c", None], n), dtype="str")
    batches = [df.iloc[a : a + 7_000].reset_index(drop=True) for a in range(0, n, 7_000)]
    qis = ["zip", "age", "sex"]
    fn = ProfileFn(list(df.columns), qis, qis, exact=["disease"])
    public, _ = split_internal(run_combine(fn, batches, 4))
    cols = public["columns"]
    for col in ["zip", "age", "sex", "disease"]:  # QIs always, and the named columns
        assert cols[col]["exact"] is True
        assert cols[col]["distinct"] == df[col].nunique(dropna=True)
    for col in ["value", "note"]:
        assert cols[col]["exact"] is False
        assert cols[col]["missing"] == int(df[col].isna().sum())
        true = df[col].nunique(dropna=True)
        assert abs(cols[col]["distinct"] - true) <= max(1, 0.03 * true), (col, true)
    # without `exact` every column is exact (the default)
    everything, _ = split_internal(run_combine(ProfileFn(list(df.columns), qis, qis), batches, 4))
    assert everything["columns"]["value"] == {
        "distinct": df["value"].nunique(),
        "missing": int(df["value"].isna().sum()),
        "exact": True,
    }


def test_hll_estimate_tracks_the_true_count() -> None:
    from privpipe.transforms.profile import _HLL_M, hll_estimate, hll_update

    for n in (0, 1, 500, 200_000):
        registers = np.zeros(_HLL_M, dtype=np.uint8)
        values = pd.Series(np.arange(n, dtype=np.int64) * 7919)
        hll_update(registers, _hash(values))
        hll_update(registers, _hash(values[: n // 2]))  # repeats change nothing
        assert abs(hll_estimate(registers) - n) <= max(0.03 * n, 0 if n < 2 else 2), n


def test_a_dp_value_column_is_estimated_its_key_columns_exact(tmp_path: Path) -> None:
    """The profile counts exactly what a release keys on (QIs, sensitive, person, DP
    group_by and partition_by) and estimates a DP release's value column."""
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.run import exact_columns
    from tests.test_dp_pipeline import DPProject

    project = DPProject(tmp_path, persons=20)
    project.cfg["releases"].append(
        {"name": "pay", "kind": "dp_sum", "epsilon": 0.5, "delta": 1e-6, "value": "salary",
         "bounds": [0, 100000], "group_by": ["zip"], "max_partitions": 1}
    )  # fmt: skip
    project.save()
    exact = exact_columns(load_plan(project.config))
    assert {"id", "disease", "sex", "zip"} <= set(exact)
    assert "salary" not in exact


def test_a_text_columns_hashes_and_counts_from_one_encoding_are_the_usual_ones() -> None:
    from privpipe.transforms.profile import _hash_and_count

    rng = np.random.default_rng(3)
    for values in (
        pd.Series(rng.choice(["a", "bb", "ccc", None], 5000), dtype="str"),
        pd.Series(rng.choice(["a", "zoë", None], 300), dtype=object),
        pd.Series([f"z{i}" for i in rng.integers(0, 4000, 9000)], dtype="str"),
        pd.Series([None, None], dtype="str"),
    ):
        hashes, counts = _hash_and_count(values)
        assert np.array_equal(hashes, _hash(values))
        expected = values.value_counts(dropna=True)
        assert dict(zip(counts.index, counts.to_numpy(), strict=True)) == dict(expected.items())
        assert counts.dtype == np.int64 and (counts > 0).all()


def test_a_batch_of_nothing_but_missing_text_counts_no_extra_value() -> None:
    """A text column read as objects whose batch holds only missing values hashes its
    missing cells as the other batches do: the distinct count is the values', not one more."""
    batches = [
        pd.DataFrame({"dx": pd.Series(["flu", None, "cold"], dtype="str")}),
        pd.DataFrame({"dx": pd.Series([None, None], dtype=object)}),
        pd.DataFrame({"dx": pd.Series(["flu", "ulcer"], dtype=object)}),
    ]
    fn = ProfileFn(["dx"], [], [])
    public, _ = split_internal(run_combine(fn, batches, 2))
    assert public["columns"]["dx"] == {"distinct": 3, "missing": 3, "exact": True}


def _frequency_table(batches: list[pd.DataFrame], columns: list[str], unit: str | None):
    """The summary's frequency table of ``batches`` (person ids hashed as the run does)."""
    from privpipe.transforms.anonymize import FrequencyTable, hash_units

    fn = FrequencyTable(columns, categorical=True, hashed=[unit] if unit else [])
    acc = fn.create_accumulator()
    for b in batches:
        acc = fn.add_input(acc, hash_units(b, unit) if unit else b)
    return fn.extract_output(fn.merge_accumulators([acc]))


def people(seed: int, n: int, missing: bool = True) -> pd.DataFrame:
    """Persons with one to several rows; missing values in a QI (unless not ``missing``)
    and the sensitive one."""
    df = table(seed, n)
    rng = np.random.default_rng(seed + 1)
    df["pid"] = pd.array([f"p{i}" for i in rng.integers(0, max(n // 2, 1), n)], dtype="str")
    df["salary"] = rng.integers(0, 60, n)
    if missing:
        df.loc[rng.random(n) < 0.1, "sex"] = None
    return df


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 500),
    parts=st.integers(1, 6),
    unit=st.booleans(),
    missing=st.booleans(),
)
@example(seed=0, n=0, parts=1, unit=True, missing=True)  # every row rejected: an empty table
def test_a_profile_from_the_frequency_table_is_the_profile_of_every_batch(
    seed: int, n: int, parts: int, unit: bool, missing: bool
) -> None:
    """The QIs', the sensitive attribute's and the persons' figures taken from the
    summary's frequency table (``from_table``) are those counted batch by batch: distinct
    values, missing cells, combinations, unique rows and persons, and the value counts
    (as the strings the table compares). Without missing QIs the table's rows come in
    the combinations' order (counted as runs), with them not (hashed)."""
    from privpipe.transforms.profile import table_figures

    df = people(seed, n, missing)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    batches = [df.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(bounds) if b > a]
    batches = batches or [df]  # no rows: one empty batch
    qis, counted = ["zip", "age", "sex"], ["zip", "age", "sex", "disease"]
    pid = "pid" if unit else None
    columns = list(df.columns)
    every = ProfileFn(columns, qis, counted, pid, exact=[*counted, "pid"])
    want, want_counts = split_internal(run_combine(every, batches, parts // 2))
    fn = ProfileFn(columns, qis, counted, pid, exact=[*counted, "pid"], from_table=True)
    freq = _frequency_table(batches, [*counted, *(["pid"] if unit else [])], pid)
    partial = run_combine(fn, batches, parts // 2)
    got, got_counts = split_internal(fn.with_table(partial, table_figures(freq, qis, counted, pid)))
    assert got == want
    if unit and n:
        assert got["qi_combinations"]["persons"] == df["pid"].nunique()
    assert set(got_counts) == set(want_counts) == set(counted)
    for col in counted:
        expected = {str(k): int(v) for k, v in want_counts[col].items()}
        assert {str(k): int(v) for k, v in got_counts[col].items()} == expected


def test_a_profile_from_the_table_does_not_hash_the_columns_the_table_holds() -> None:
    """With ``from_table`` a batch adds no hashes, counts, combinations or pairs of the
    QIs, the sensitive attribute or the person: only rows, missing cells and the rest."""
    df = people(4, 300)
    qis, counted = ["zip", "age", "sex"], ["zip", "age", "sex", "disease"]
    fn = ProfileFn(list(df.columns), qis, counted, "pid", exact=counted, from_table=True)
    acc = fn.add_input(fn.create_accumulator(), df)
    assert acc.combos == [] and acc.pairs == [] and acc.pending_counts == {}
    assert set(acc.hashes) == set() and set(acc.sketches) == {"salary"}
    assert acc.missing["sex"] == int(df["sex"].isna().sum()) and acc.rows == 300
