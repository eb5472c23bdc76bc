"""The release summary (coded frequency table) equals pandas' value counts, however the
batches are split and merged, with string or categorical columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import example, given, settings
from hypothesis import strategies as st

from privpipe.transforms.anonymize import COUNT, FrequencyTable, _value_counts


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
    if not categorical:  # str columns, missing values missing (not the string "nan")
        assert all(out[c].dtype == "str" for c in ("a", "b", "c"))
        assert int(out["a"].isna().sum()) == int(expected.loc[expected["a"].isna(), "a"].size)
    for c in ("a", "b", "c"):  # per-value counts as the search step reads them
        want = expected.groupby(c, dropna=False)[COUNT].sum()
        pd.testing.assert_series_equal(_value_counts(out[c], out[COUNT]), want)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.sampled_from([0.0, -0.0, 1.5, np.nan]), min_size=1, max_size=12),
    step=st.integers(1, 12),
)
def test_a_float_column_is_counted_the_same_whatever_the_batches(
    values: list[float], step: int
) -> None:
    """-0.0 and 0.0 are one value, in one batch (as pandas factorises) and across batches
    (they used to be two rows, "-0.0" and "0.0", when they arrived in different batches)."""
    frame = pd.DataFrame({"x": np.asarray(values, dtype=np.float64)})
    fn = FrequencyTable(["x"])
    whole = fn.extract_output(fn.add_input(fn.create_accumulator(), frame))
    acc = fn.create_accumulator()
    for i in range(0, len(frame), step):
        acc = fn.add_input(acc, frame.iloc[i : i + step])
    parts = fn.extract_output(acc)

    def counts(t: pd.DataFrame) -> list[tuple[str, int]]:
        labels = t["x"].astype(object).where(t["x"].notna(), "<NA>").astype(str)
        return sorted(zip(labels, t[COUNT].astype(int), strict=True))

    assert counts(parts) == counts(whole)
    assert "-0.0" not in set(parts["x"].dropna())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["a", "b", "[1-5]", "*"])),
            st.sampled_from([0.0, -0.0, 1.5, np.nan]),
        ),
        min_size=1,
        max_size=40,
    ),
    step=st.integers(1, 40),
    extra=st.booleans(),
)
@example(rows=[("a", 0.0), ("b", 1.5), ("a", 1.5)], step=1, extra=True)  # two dtype objects
def test_categorical_columns_are_counted_as_their_values(
    rows: list[tuple[str | None, float]], step: int, extra: bool
) -> None:
    """A categorical column (a recoding's labels: counted by its codes) gives the table
    its values give, missing and unused categories, -0.0 and batches included; only the
    values present enter the table's categories."""
    text = pd.Series([r[0] for r in rows], dtype="str")
    number = pd.Series([r[1] for r in rows], dtype=np.float64)
    plain = pd.DataFrame({"t": text, "x": number})
    unused = ["never"] if extra else []
    cats = pd.DataFrame(
        {
            "t": text.astype(pd.CategoricalDtype([*text.dropna().unique(), *unused])),
            "x": number.astype(pd.CategoricalDtype([*number.dropna().unique(), 9.0][:4])),
        }
    )

    def table(frame: pd.DataFrame) -> pd.DataFrame:
        fn = FrequencyTable(["t", "x"], categorical=True)
        acc = fn.create_accumulator()
        for i in range(0, len(frame), step):
            acc = fn.add_input(acc, frame.iloc[i : i + step])
        return fn.extract_output(acc)

    def counts(t: pd.DataFrame) -> list[tuple[str, str, int]]:
        def col(c: str) -> pd.Series:
            return t[c].astype(object).where(t[c].notna(), "<NA>").astype(str)

        return sorted(zip(col("t"), col("x"), t[COUNT].astype(int), strict=True))

    got = table(cats)
    assert counts(got) == counts(table(plain))
    # batches of one table over two dtype objects (its strings kept per dtype object)
    flipped = cats.assign(t=cats["t"].cat.reorder_categories(cats["t"].cat.categories[::-1]))
    before, after = list(cats["t"].cat.categories), list(flipped["t"].cat.categories)
    assert len(before) < 2 or after == before[::-1] != before
    fn = FrequencyTable(["t", "x"], categorical=True)
    acc = fn.create_accumulator()
    for i in range(0, len(cats), step):
        part = (cats if (i // step) % 2 else flipped).iloc[i : i + step]
        acc = fn.add_input(acc, part)
    assert counts(fn.extract_output(acc)) == counts(got)
    assert set(got["t"].cat.categories) == set(text.dropna())
    assert "-0.0" not in set(got["x"].cat.categories)


def test_empty_input_gives_empty_table() -> None:
    fn = FrequencyTable(["a"])
    out = fn.extract_output(fn.create_accumulator())
    assert list(out.columns) == ["a", "count"] and len(out) == 0


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), step=st.integers(1, 150))
def test_hashed_person_ids_count_persons_as_the_strings_do(seed: int, n: int, step: int) -> None:
    """Person ids carried as 64-bit hashes (``hashed=``) give the same summary, the same
    person-counted classes and the same verifier verdict as the id strings."""
    from privpipe.anonymity.hierarchy import build_grouping
    from privpipe.anonymity.spec import AnonymizationSpec
    from privpipe.anonymity.summary import Summary
    from privpipe.anonymity.transformation import Evaluator
    from privpipe.anonymity.verify import verify_counts

    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "q": pd.array(rng.choice(["q0", "q1", "q2"], n), dtype="str"),
            "s": pd.array(rng.choice(["s0", "s1"], n), dtype="str"),
            "p": pd.array(rng.integers(0, max(n // 3, 1), n)),  # ints: canonical strings
        }
    )
    tables = {}
    for hashed in ([], ["p"]):
        fn = FrequencyTable(["q", "s", "p"], True, hashed)
        accs = []
        for i in range(0, n, step):
            acc = fn.add_input(fn.create_accumulator(), df.iloc[i : i + step])
            accs.append(fn.compact(acc))
        tables[bool(hashed)] = fn.extract_output(fn.merge_accumulators(accs))
    plain, hashed_table = tables[False], tables[True]
    assert hashed_table["p"].dtype == np.uint64 and len(hashed_table) == len(plain)
    assert _value_counts(hashed_table["p"], hashed_table[COUNT]).shape == (df["p"].nunique(),)
    hier = {"q": build_grouping("q", [{"q0": "a", "q1": "a", "q2": "b"}, {"a": "*", "b": "*"}])}
    views = []
    for table in (plain, hashed_table):
        summary = Summary.from_frame(table, ["q"], "s", hier, weights=COUNT, unit="p")
        ev = Evaluator(summary, hier)
        for node in ((0,), (1,), (2,)):
            views.append(ev.in_units(ev.classes(node)))
    for a, b in zip(views[:3], views[3:], strict=True):
        np.testing.assert_array_equal(a.sizes, b.sizes)
        np.testing.assert_array_equal(a.cell_count, b.cell_count)
    persons = df.groupby("q")["p"].nunique().to_numpy()
    np.testing.assert_array_equal(views[3].sizes, persons)
    k = int(persons.min()) + int(rng.integers(0, 2))  # sometimes passes, sometimes fails
    spec = AnonymizationSpec("l_diversity", ("q",), "s", k=k, l=2, unit="person", unit_column="p")
    verdicts = [
        verify_counts(table, spec, input_records=n, suppressed_records=0).ok
        for table in (plain, hashed_table)
    ]
    assert verdicts[0] == verdicts[1]


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-50, 50), max_size=200),
        max_size=40,
    )
)
def test_hash_dictionary_codes_follow_first_appearance(batches: list[list[int]]) -> None:
    """The person-hash dictionary (pandas' int64 hash table) gives each value the code a
    plain dict in order of first appearance would, repeats within a batch included, and
    keeps doing so after a pickle round trip (the table is rebuilt from the values)."""
    import pickle

    from privpipe.transforms.anonymize import _HashDictionary

    d, reference = _HashDictionary(), {}
    for i, batch in enumerate(batches):
        codes = d.encode(np.array(batch, dtype=np.int64))
        for value in batch:
            reference.setdefault(value, len(reference))
        assert codes.dtype == np.int32
        assert codes.tolist() == [reference[v] for v in batch]
        if i % 3 == 2:
            d = pickle.loads(pickle.dumps(d))
    assert len(d) == len(reference)
    assert d.to_numpy().tolist() == list(reference)


def test_unit_hashes_are_the_canonical_strings_hashes() -> None:
    """Vectorised for strings and integers, per value otherwise: the same hash as the
    canonical string's, so a person's hash never depends on the column's dtype path."""
    from privpipe.anonymity.hierarchy import canonical_scalar
    from privpipe.anonymity.summary import unit_hashes
    from privpipe.hashing import string_hashes

    columns = [
        pd.Series(["p1", "p2", "p1"], dtype="str"),
        pd.Series(["p1", "p2", "p1"], dtype=object),
        pd.Series([7, 12, 7]),
        pd.Series([7.0, 12.5, 1e300]),
        pd.Series(["7", 7, 7.0], dtype=object),
        pd.Series(["a", "b"], dtype="category"),
    ]
    for column in columns:
        strings = np.array([canonical_scalar(v) for v in column], dtype=object)
        expected = string_hashes(strings).view(np.int64)
        np.testing.assert_array_equal(unit_hashes(column, "pid"), expected)
    assert unit_hashes(columns[4], "pid").tolist().count(unit_hashes(columns[2], "pid")[0]) == 3


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), step=st.integers(50, 900), cut=st.integers(0, 3000))
def test_rows_too_wide_for_a_key_are_counted_as_narrow_ones(seed: int, step: int, cut: int) -> None:
    """A table whose codes outgrow a 64-bit key mid-stream (seven columns of up to 1,000
    values: 70 bits) gives pandas' counts too, merged with one that never did, with and
    without a hashed person column."""
    rng = np.random.default_rng(seed)
    n = 3000
    # the first rows use few values, later ones many: the layout widens, then gives up
    spread = np.where(np.arange(n) < n // 3, 4, 1000)
    df = pd.DataFrame(
        {f"c{j}": pd.array((rng.random(n) * spread).astype(int).astype(str)) for j in range(7)}
    )
    df["p"] = pd.array(rng.integers(0, 400, n))
    for hashed in ([], ["p"]):
        fn = FrequencyTable([*df.columns[:7], "p"], False, hashed)
        accs = []
        for part in (df.iloc[: cut // 4], df.iloc[cut // 4 :]):  # one part stays narrow
            acc = fn.create_accumulator()
            for i in range(0, len(part), step):
                acc = fn.add_input(acc, part.iloc[i : i + step])
            accs.append(acc)
        assert accs[1].layout is None  # the wide path was taken
        out = fn.extract_output(fn.merge_accumulators(accs))
        assert int(out[COUNT].sum()) == n and len(out) == len(df.drop_duplicates())
        if not hashed:
            want = df.astype("str").value_counts().rename(COUNT).reset_index()
            got = out.astype({c: "str" for c in df.columns})
            merged = got.merge(want, on=list(df.columns), suffixes=("", "_want"))
            assert len(merged) == len(want)
            assert (merged[COUNT] == merged[f"{COUNT}_want"]).all()
