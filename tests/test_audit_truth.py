"""The audit's truth without every row (transforms.audit_truth, pipelines.audit.load_truth):
the keyed target sample, and the attacks on a frequency table equal to those on its rows
(and still able to find a leak)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.common import public_prior
from privpipe.attacks.composition import compose_tables
from privpipe.attacks.control import keyed_hashes, new_holdout_key
from privpipe.attacks.matching import (
    WEIGHT,
    expand_rows,
    frequency_table,
    records_of,
    suppressed_rows,
)
from privpipe.attacks.publication import reproduced_cells, row_order_alignment
from privpipe.reports.run import Release, count_rows, head_rows, load_release
from privpipe.reports.utility import own_utility
from privpipe.transforms.anonymize import COUNT
from privpipe.transforms.audit_truth import RECORDS, SmallestHashRows, published_table
from tests.layout import internal_file, release_dir

KEY = "0123456789abcdef"


def _rows(n: int = 60) -> pd.DataFrame:
    person = [f"P{i // 3:03d}" for i in range(n)]  # three rows per person
    return pd.DataFrame(
        {
            "person_id": person,
            "age": [str(20 + i % 4) for i in range(n)],
            "dx": ["flu", "cold", "gout", "acne", "flu"][:5] * (n // 5),
        }
    )


def _sample(frame: pd.DataFrame, sizes: list[int], n: int, key: str = KEY) -> pd.DataFrame:
    fn = SmallestHashRows(["age", "dx"], n, key, "person_id")
    accs, start = [], 0
    for size in sizes:  # each batch its own accumulator, merged as Beam would
        acc = fn.create_accumulator()
        acc = fn.add_input(acc, frame.iloc[start : start + size])
        accs.append(acc)
        start += size
    return fn.extract_output(fn.merge_accumulators(accs))  # type: ignore[no-any-return]


def test_the_sample_is_the_same_whatever_the_batches_and_takes_whole_persons() -> None:
    rows = _rows()
    one = _sample(rows, [60], 9)
    other = _sample(rows, [7, 20, 33], 9)
    pd.testing.assert_frame_equal(one, other)
    assert len(one) == 9 and (one[RECORDS] == 60).all()
    # the persons with the smallest keyed hashes, every row of each (3 rows per person)
    first = keyed_hashes(rows["person_id"], KEY)
    chosen = rows.assign(h=first).sort_values("h", kind="stable")["person_id"].unique()[:3]
    want = rows[rows["person_id"].isin(chosen)][["age", "dx"]]
    got = one[["age", "dx"]]
    assert sorted(map(tuple, got.to_numpy())) == sorted(map(tuple, want.to_numpy()))
    # another run's key draws other persons (who is a target is not predictable)
    assert not _sample(rows, [60], 9, new_holdout_key())[["age", "dx"]].equals(got)
    small = _sample(rows.head(4), [4], 9)  # fewer rows than asked: all of them
    assert len(small) == 4 and (small[RECORDS] == 4).all()


QIS = ["age", "sex"]
RAW = pd.DataFrame(
    {
        "age": ["20", "21", "20", "21", "20", "20"],
        "sex": ["F", "F", "M", "M", "F", "M"],
        "dx": ["flu", "cold", "gout", "acne", "flu", "gout"],
    }
)
HIER = {
    "age": Hierarchy("age", np.array([["20", "20-21", "*"], ["21", "20-21", "*"]])),
    "sex": Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object)),
}
L2 = {"k": 3, "l": 2, "variant": "distinct"}


def test_composition_on_the_frequency_table_is_the_rows_and_still_finds_the_leak() -> None:
    a, b = RAW.assign(age="20-21"), RAW.assign(sex="*")  # each 2-diverse, together not
    table = frequency_table(RAW, ["age", "sex", "dx"])
    assert len(table) < len(RAW) and records_of(table) == len(RAW)
    guarantees = {"a": L2, "b": L2}
    rows = compose_tables({"a": a, "b": b}, RAW, QIS, "dx", HIER, guarantees=guarantees)
    summed = compose_tables({"a": a, "b": b}, table, QIS, "dx", HIER, guarantees=guarantees)
    assert summed.as_dict() == rows.as_dict()
    assert summed.breach and summed.targets == len(RAW) and summed.below_claim == len(RAW)


def test_reproduced_cells_count_the_frequency_table_like_the_rows() -> None:
    table = RAW.assign(age="20-21")  # sex kept: grouping it by sex gives the exact counts
    cells = pd.DataFrame({"sex": ["F", "M"]})
    none = np.zeros(len(table), dtype=bool)
    truth = frequency_table(RAW, ["sex"])
    for keys in (["sex"], []):
        rows = reproduced_cells(table, cells, RAW, keys, {}, HIER, none)
        summed = reproduced_cells(table, cells, truth, keys, {}, HIER, none)
        assert summed.as_dict() == rows.as_dict()
    found = reproduced_cells(table, cells, truth, ["sex"], {}, HIER, none)
    assert found.linked and found.exact_cells == 2  # the leak is still found
    other = frequency_table(RAW.assign(sex=["F", "F", "M", "M", "M", "M"]), ["sex"])
    assert reproduced_cells(table, cells, other, ["sex"], {}, HIER, none).exact_cells == 0


def test_prior_own_utility_and_expansion_weigh_each_distinct_row() -> None:
    table = frequency_table(RAW, ["age", "sex", "dx"])
    rows_prior = public_prior(RAW["dx"].to_numpy(dtype=object))
    table_prior = public_prior(table["dx"].to_numpy(dtype=object), weights=table[WEIGHT])
    assert np.array_equal(rows_prior[0], table_prior[0])
    assert np.allclose(rows_prior[1], table_prior[1])
    back = expand_rows(table)
    assert sorted(map(tuple, back.to_numpy())) == sorted(map(tuple, RAW.to_numpy()))
    cells = pd.DataFrame({"sex": ["F", "M"], "count": ["4", "2"]})
    dp = Release(
        name="d", kind="dp_count", data=cells,
        document={"parameters": {"queries": {"q": {"group_by": ["sex"]}}}},
    )  # fmt: skip
    assert own_utility(dp, table, HIER, None, 1.0) == own_utility(dp, RAW, HIER, None, 1.0)
    assert own_utility(dp, table, HIER, None, 1.0)  # scored (not an empty entry)


# --------------------------------------------------------------------------- published rows


def _published(folder: Path, rows: pd.DataFrame, name: str = "t") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / "data.csv", index=False)
    (folder / "release.json").write_text(json.dumps({"name": name, "kind": "k_anonymity"}))
    return folder


def _as_rows(table: pd.DataFrame) -> list[tuple[Any, ...]]:
    """The rows (a frequency table's expanded), as strings, missing as "", sorted."""
    rows = expand_rows(table).astype(object)
    return sorted(map(tuple, rows.where(rows.notna(), "").astype(str).to_numpy()))


def test_the_verifiers_class_counts_give_the_published_rows_frequency_table() -> None:
    """Class counts with the person's hash (persons counted) sum to one row per distinct
    published row; without it they are the table; missing values stay a row of their own."""
    rows = RAW.assign(dx=RAW["dx"].where(RAW.index != 5))  # one missing sensitive value
    classes = (
        rows.assign(unit=np.arange(len(rows)) % 2)
        .groupby(["age", "sex", "dx", "unit"], dropna=False)
        .size()
        .rename(COUNT)
        .reset_index()
    )
    table = published_table(classes, ["age", "sex", "dx"])
    assert list(table.columns) == ["age", "sex", "dx", WEIGHT]
    assert records_of(table) == len(rows) and len(table) == 5
    assert _as_rows(table) == _as_rows(rows)
    direct = classes.groupby(["age", "sex", "dx"], dropna=False)[COUNT].sum().reset_index()
    assert records_of(published_table(direct, ["age", "sex", "dx"])) == len(rows)


def test_a_published_table_is_loaded_as_its_counts_and_its_head_keeps_the_order(
    tmp_path: Path,
) -> None:
    """``load_release``: an anonymised table's data is the frequency table of its rows
    (counted in chunks the same as at once, or the staged counts when given); ``head_rows``
    reads the first rows in their published order, so the row-order attack still finds
    two tables of the same records in the same order, and not after a shuffle."""
    rows = pd.concat([RAW] * 50, ignore_index=True).assign(
        age=lambda f: [f"{20 + i % 40}" for i in range(len(f))]
    )
    folder = _published(tmp_path / "t", rows)
    whole = load_release(folder)
    assert WEIGHT in whole.data.columns and len(whole.data) < len(rows)
    assert _as_rows(whole.data) == _as_rows(rows)
    chunked = count_rows(folder / "data.csv", rows=7)
    assert _as_rows(chunked) == _as_rows(whole.data)
    staged = tmp_path / "staged.parquet"
    frequency_table(rows.head(10), list(rows.columns)).to_parquet(staged)
    assert records_of(load_release(folder, staged).data) == 10  # the staged table wins
    assert records_of(load_release(folder, tmp_path / "absent.parquet").data) == len(rows)
    head = head_rows(whole, 120)
    pd.testing.assert_frame_equal(head, rows.head(120).astype(object), check_dtype=False)
    coarse = _published(tmp_path / "c", rows.assign(age="*"), "c")
    shuffled = _published(
        tmp_path / "s", rows.assign(age="*").iloc[::-1].reset_index(drop=True), "s"
    )
    same = row_order_alignment(
        head_rows(whole, 200), head_rows(load_release(coarse), 200), {}, names=("t", "c")
    )
    assert same.aligned and same.rows == 200
    other = row_order_alignment(
        head_rows(whole, 200), head_rows(load_release(shuffled), 200), {}, names=("t", "s")
    )
    assert not other.aligned


def test_reproduced_cells_on_a_published_frequency_table_is_the_table() -> None:
    """A DP count beside a table given as the frequency table of its published rows:
    the same figures as the rows (rows, suppressed, coarse, exact cells), and the leak
    still found."""
    table = RAW.assign(age=["20-21", "20-21", "*", "20-21", "20-21", "*"])
    table.loc[[2, 5], "sex"] = "*"  # two suppressed rows
    counts = frequency_table(table, ["age", "sex", "dx"])
    cells = pd.DataFrame({"sex": ["F", "M"], "age": ["20", "21"]})
    truth = frequency_table(RAW, ["age", "sex", "dx"])
    for keys, levels in ((["sex"], {}), (["age"], {"age": 0}), ([], {})):
        rows = reproduced_cells(
            table, cells, truth, keys, levels, HIER, suppressed_rows(table, QIS)
        )
        summed = reproduced_cells(
            counts, cells, truth, keys, levels, HIER, suppressed_rows(counts, QIS)
        )
        assert summed.as_dict() == rows.as_dict()
    found = reproduced_cells(counts, cells, truth, ["sex"], {}, HIER, suppressed_rows(counts, QIS))
    assert found.rows == 6 and found.suppressed == 2 and found.exact_cells == 1 and found.linked


@pytest.mark.slow
def test_a_run_stages_each_tables_published_counts_and_the_audit_reads_only_those(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`privpipe run`: beside each anonymised table the pipeline stages the frequency table
    of its published rows in the private work folder (never in public/), equal to the
    table's rows; the attacks, the publication check and the audit read those (counting a
    published file instead fails the run here)."""
    from privpipe.pipelines.cli import main
    from privpipe.pipelines.output import RunOutput
    from tests.test_attacks_pipeline import adult_config

    kept = tmp_path / "work"

    def keep(self: RunOutput) -> None:
        if self._work is not None:
            shutil.copytree(self._work, kept, dirs_exist_ok=True)
            shutil.rmtree(self._work, ignore_errors=True)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a published table was read whole: its counts were not staged")

    monkeypatch.setattr(RunOutput, "_drop_work", keep)
    monkeypatch.setattr("privpipe.reports.run.count_rows", refuse)
    releases = [
        {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05},
        {"name": "l2", "kind": "l_diversity", "k": 2, "l": 2, "suppression_limit": 0.05},
    ]
    attacks = {"targets": 500, "seed": 3, "run": ["homogeneity", "linkage"]}
    assert main(["run", str(adult_config(tmp_path, attacks, releases))]) == 0
    out = tmp_path / "out"
    audit = json.loads(internal_file(out, "audit.json").read_text())
    assert set(audit["releases"]) == {"k5", "l2"} and audit["publication_attacks"]["row_linking"]
    for name in ("k5", "l2"):
        staged = pd.read_parquet(kept / f"published_{name}_counts.parquet")
        assert _as_rows(staged) == _as_rows(count_rows(release_dir(out, name) / "data.csv"))
        assert not list(out.rglob(f"published_{name}_counts*"))  # never in the output


def test_a_parquet_tables_head_spans_its_row_groups(tmp_path: Path) -> None:
    """``head_rows`` of a Parquet table gathers rows across row groups up to the number
    asked (the row-order attack compares as many rows as before), and counting it in
    chunks gives its frequency table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pd.concat([RAW] * 40, ignore_index=True).astype(str)
    folder = tmp_path / "p"
    folder.mkdir()
    pq.write_table(pa.Table.from_pandas(rows), folder / "data.parquet", row_group_size=50)
    (folder / "release.json").write_text(json.dumps({"name": "p", "kind": "k_anonymity"}))
    release = load_release(folder)
    assert _as_rows(release.data) == _as_rows(rows)
    head = head_rows(release, 175)
    assert len(head) == 175
    assert head.astype(str).equals(rows.head(175).astype(str))


_CELL = st.one_of(st.none(), st.sampled_from(["", "a", "b", "B", "ä", "10", "9", "*"]))


def _reference_strings(table: pd.DataFrame) -> pd.DataFrame:
    """What ``reports.run._strings`` must give, the slow way: every cell as a Python
    string (missing -> ""), equal rows merged, rows sorted by their strings (stable)."""
    labels = [c for c in table.columns if c != WEIGHT]
    rows: dict[tuple[str, ...], int] = {}
    for i in range(len(table)):
        key = tuple("" if pd.isna(table[c].iloc[i]) else str(table[c].iloc[i]) for c in labels)
        rows[key] = rows.get(key, 0) + int(table[WEIGHT].iloc[i])
    ordered = sorted(rows.items(), key=lambda kv: kv[0])
    return pd.DataFrame(
        {**{c: pd.Series([k[j] for k, _ in ordered], dtype=object) for j, c in enumerate(labels)},
         WEIGHT: np.asarray([w for _, w in ordered], dtype=np.int64)}
    )  # fmt: skip


def _as_objects(table: pd.DataFrame) -> pd.DataFrame:
    """A loaded table's label columns (categoricals over their plain strings) as the
    Python strings they stand for."""
    return table.astype({c: object for c in table.columns if c != WEIGHT})


@settings(max_examples=80, deadline=None)
@given(
    cells=st.lists(st.tuples(_CELL, _CELL), min_size=1, max_size=30, unique=True),
    kind=st.sampled_from(["category", "str", "object"]),
)
def test_a_loaded_tables_strings_are_plain_merged_and_sorted(
    cells: list[tuple[str | None, str | None]], kind: str
) -> None:
    """A staged table (distinct rows, categorical, Arrow or object strings, with missing
    cells and real ``""``) loads as the slow reference does: plain strings, rows equal
    once missing is ``""`` merged, sorted by their strings; and it is marked distinct
    (a ``frequency_table`` of it over all its columns is the table itself)."""
    from privpipe.reports.run import _strings

    table = pd.DataFrame(
        {
            "a": pd.Series([a for a, _ in cells], dtype=kind),
            "b": pd.Series([b for _, b in cells], dtype=kind),
            WEIGHT: np.arange(1, len(cells) + 1, dtype=np.int64),
        }
    )
    got = _strings(table)
    for c in ("a", "b"):  # categoricals over the strings that occur, and only those
        assert isinstance(got[c].dtype, pd.CategoricalDtype)
        assert sorted(got[c].cat.categories) == sorted(set(got[c].astype(object)))
    pd.testing.assert_frame_equal(_as_objects(got), _reference_strings(table))
    assert frequency_table(got, ["b", "a"]) is not got  # another column order: a view
    assert frequency_table(got, ["a", "b"]) is got  # all its columns: the table itself
    assert not got.duplicated(["a", "b"]).any()


@settings(max_examples=60, deadline=None)
@given(
    radices=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_label_order_is_the_stable_lexsort_of_the_ranks(
    radices: list[int], n: int, seed: int
) -> None:
    """``_label_order`` (ranks packed into one key, one stable argsort) orders rows as a
    lexsort of the columns' ranks (first column most significant, ties in place); so does
    its fallback when the packed key would not fit in 63 bits (64 two-value columns)."""
    from privpipe.reports.run import _label_order, _Plain

    rng = np.random.default_rng(seed)

    def plain(radix: int, rows: int) -> _Plain:
        values = np.array([f"v{i}" for i in rng.permutation(radix)] + [""], dtype=object)
        codes = rng.integers(-1, radix, size=rows).astype(np.intp)
        return _Plain(codes, values, bool((codes < 0).any()))

    for columns in ([plain(r, n) for r in radices], [plain(2, n) for _ in range(64)]):
        ranks = [p.ranks()[0] for p in columns]
        expected = np.lexsort(ranks[::-1]) if ranks else np.arange(n)
        np.testing.assert_array_equal(_label_order(columns, n), expected)


def test_a_staged_table_with_missing_cells_loads_as_the_reference(tmp_path: Path) -> None:
    """The staged counts are read with their labels as categoricals (from the Parquet
    dictionary): the same plain, merged and sorted strings as the slow reference,
    missing cells and real ``""`` merged, weights summed."""
    cells = [("b", None), ("a", "x"), (None, "x"), ("", "x"), ("a", ""), ("b", "y")]
    table = pd.DataFrame(
        {
            "a": pd.Series([a for a, _ in cells], dtype="str"),
            "b": pd.Series([b for _, b in cells], dtype="str"),
            WEIGHT: np.arange(1, len(cells) + 1, dtype=np.int64),
        }
    )
    staged = tmp_path / "published_t_counts.parquet"
    table.to_parquet(staged)
    folder = _published(tmp_path / "t", RAW)
    got = load_release(folder, staged).data
    pd.testing.assert_frame_equal(_as_objects(got), _reference_strings(table))
    assert got[WEIGHT].tolist() == [7, 5, 2, 1, 6]  # ("", x) twice: 3 + 4


def test_only_the_marked_table_itself_is_taken_as_distinct() -> None:
    """A frame derived from a marked table (rows added, a column dropped, the same
    columns under a new object) is grouped again: its rows may repeat."""
    from privpipe.attacks.matching import mark_distinct

    table = mark_distinct(
        pd.DataFrame({"a": ["x", "y"], "b": ["1", "1"], WEIGHT: np.array([2, 3], np.int64)})
    )
    assert frequency_table(table, ["a", "b"]) is table
    doubled = pd.concat([table, table], ignore_index=True)
    assert frequency_table(doubled, ["a", "b"])[WEIGHT].tolist() == [4, 6]
    assert frequency_table(table, ["b"])[WEIGHT].tolist() == [5]
    table.loc[len(table)] = ["x", "1", 1]  # grown in place: no longer as it was marked
    assert frequency_table(table, ["a", "b"])[WEIGHT].tolist() == [3, 3]
    with pytest.raises(ValueError, match="frequency table"):
        mark_distinct(pd.DataFrame({"a": ["x"]}))


class _Typed:
    """The part of a Plan ``typed`` reads: the schema's column types."""

    def column_types(self) -> dict[str, str]:
        return {"age": "integer", "score": "float"}


@example(rows=[(None, -0.0, None), (None, 0.0, None)])  # two batches, one value
@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-3, 3), st.just(2**60 + 1)),
            st.one_of(st.none(), st.sampled_from([0.0, -0.0, 39.0, 39.5, 1e20, 1e-7])),
            st.one_of(st.none(), st.sampled_from(["", "a", "b"])),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_the_staged_truth_is_taken_as_its_own_frequency_table_only_when_it_is_one(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[Any, Any, Any]]
) -> None:
    """``load_truth`` reads the staged FrequencyTable of the rows (as the reader types
    them) back in their types; it is marked distinct (a frequency table of all its
    columns is the table itself) and is: ``-0.0`` and ``0.0``, two strings but one number,
    are one value in the staged table however the batches fell."""
    from privpipe.pipelines.audit import RAW_TABLE, load_truth
    from privpipe.transforms.anonymize import FrequencyTable

    frame = pd.DataFrame(
        {
            "age": pd.array([r[0] for r in rows], dtype="Int64"),
            "score": np.asarray([np.nan if r[1] is None else r[1] for r in rows], np.float64),
            "dx": pd.Series([r[2] for r in rows], dtype="str"),
        }
    )
    fn = FrequencyTable(["age", "score", "dx"])
    half = len(frame) // 2  # two batches: a batch merges -0.0 and 0.0, two need not
    acc = fn.add_input(fn.add_input(fn.create_accumulator(), frame.iloc[:half]), frame[half:])
    table = fn.extract_output(acc)
    work = tmp_path_factory.mktemp("work")
    table.rename(columns={COUNT: WEIGHT}).to_parquet(work / f"{RAW_TABLE}_counts.parquet")
    raw, _ = load_truth(_Typed(), work)  # type: ignore[arg-type]
    cols = ["age", "score", "dx"]
    regrouped = raw.groupby(cols, sort=False, dropna=False)[WEIGHT].sum().reset_index()
    marked = frequency_table(raw, cols) is raw
    assert not marked or len(regrouped) == len(raw)  # taken as is only when distinct
    got = frequency_table(raw, cols)
    assert int(got[WEIGHT].sum()) == len(frame) and len(got) == len(regrouped)
    if not (frame["score"].eq(0) & np.signbit(frame["score"])).any():
        assert marked  # no negative zero: the staged strings parse to distinct rows


@settings(max_examples=60, deadline=None)
@given(
    ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20),
    floats=st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=20),
)
def test_staged_numbers_parse_back_once_per_distinct_string_to_the_same_values(
    ints: list[int | None], floats: list[float | None]
) -> None:
    """``typed`` parses each distinct string of a staged column once: the values are the
    ones each string names (integers exactly, even beside missing cells; floats to the
    bit, -0.0 included), missing stays missing."""
    from privpipe.pipelines.audit import _parsed

    for kind in ("str", "category"):  # as read_parquet gives them, and ``read_coded``
        strings = pd.Series([None if v is None else str(v) for v in ints], dtype=kind)
        got = _parsed(strings, "Int64")
        assert got.dtype == "Int64" and [None if v is pd.NA else int(v) for v in got] == ints
        text = pd.Series([None if v is None else repr(v) for v in floats], dtype=kind)
        parsed = _parsed(text, "float64").to_numpy()
        want = np.asarray([np.nan if v is None else v for v in floats], dtype=np.float64)
        assert parsed.tobytes() == want.tobytes() or np.array_equal(parsed, want, equal_nan=True)
        assert np.array_equal(np.signbit(parsed), np.signbit(want))


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["a", "b", "", "1"])),
            st.one_of(st.none(), st.integers(-3, 3)),
            st.one_of(st.none(), st.sampled_from([0.5, 39.0, 1e-7])),
        ),
        max_size=30,
    )
)
def test_categorical_class_counts_give_the_same_published_rows(
    values: list[tuple[Any, Any, Any]],
) -> None:
    """The verifier's class counts come as categoricals (strings, or numbers typed as read):
    the published rows' strings are those of the plain columns, missing kept missing."""
    plain = pd.DataFrame(
        {
            "s": pd.array([v[0] for v in values], dtype="str"),
            "i": pd.array([v[1] for v in values], dtype="Int64"),
            "f": np.array([np.nan if v[2] is None else v[2] for v in values], dtype=float),
            COUNT: np.arange(1, len(values) + 1, dtype=np.int64),
        }
    )
    coded = plain.astype({"s": "category", "i": "category", "f": "category"})
    got = published_table(coded, ["s", "i", "f"])
    want = published_table(plain, ["s", "i", "f"])
    for c in ["s", "i", "f"]:
        assert got[c].dtype == want[c].dtype, c
        assert got[c].isna().tolist() == want[c].isna().tolist(), c
        assert got[c].fillna("<NA>").tolist() == want[c].fillna("<NA>").tolist(), c
    assert got[WEIGHT].tolist() == want[WEIGHT].tolist()


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(-1, 3), st.integers(-1, 40), st.integers(0, 5), st.integers(1, 4)),
        max_size=40,
    ),
    wide=st.booleans(),
)
def test_persons_summed_out_by_codes_are_the_pandas_groupby(
    rows: list[tuple[int, int, int, int]], wide: bool
) -> None:
    """Summing the person's hash out of categorical class counts by packed codes (few or
    many categories: ``wide``) gives pandas' groupby exactly: the same groups (a missing
    value, code -1, a group of its own), in order of first appearance, with the same sums
    and the same strings."""
    n_b = 5000 if wide else 41  # a key space far larger than the rows, or not
    codes_a = np.array([r[0] for r in rows], dtype=np.int8)
    codes_b = np.array([r[1] for r in rows], dtype=np.int16)
    classes = pd.DataFrame(
        {
            "a": pd.Categorical.from_codes(codes_a, categories=pd.Index(["x", "y", "z", "w"])),
            "b": pd.Categorical.from_codes(codes_b, categories=pd.RangeIndex(n_b)),
            "unit": np.array([r[2] for r in rows], dtype=np.uint64),
            COUNT: np.array([r[3] for r in rows], dtype=np.int64),
        }
    )
    got = published_table(classes, ["a", "b"])
    summed = classes.groupby(["a", "b"], sort=False, dropna=False, observed=True)[COUNT].sum()
    want = published_table(summed.reset_index(), ["a", "b"])
    pd.testing.assert_frame_equal(got, want)
    assert int(got[WEIGHT].sum()) == sum(r[3] for r in rows)


@pytest.mark.parametrize("persons", [True, False])
def test_the_staged_truth_from_a_summary_equals_the_truth_counted_again(
    tmp_path: Path, persons: bool
) -> None:
    """``StageAuditTruth`` given an anonymised release's summary (the same batches'
    frequency table, with the person's hash or without) stages the same frequency table as
    counting the batches again: the same rows with the same weights, missing values and a
    float column included."""
    import apache_beam as beam

    from privpipe.transforms.anonymize import FrequencyTable, hash_units
    from privpipe.transforms.audit_truth import StageAuditTruth

    frame = _rows(90).assign(
        dx=lambda f: f["dx"].where(f.index % 7 != 3),
        score=lambda f: (f.index % 4).astype(float) - 0.0,
    )
    cols = ["age", "dx", "score"]
    counted = [*cols, "person_id"] if persons else cols
    batches = [frame.iloc[i : i + 25].reset_index(drop=True) for i in range(0, 90, 25)]
    staged = {}
    for way in ("again", "summary"):
        folder = tmp_path / way
        with beam.Pipeline() as p:
            rows = p | beam.Create(batches, reshuffle=False)
            if persons:
                rows = rows | beam.Map(hash_units, "person_id")
            summary = None
            if way == "summary":
                table = FrequencyTable(counted, True, ["person_id"] if persons else [])
                summary = rows | beam.CombineGlobally(table)
            _ = rows | StageAuditTruth(str(folder), "t", cols, None, KEY, "person_id", summary)
        staged[way] = pd.read_parquet(folder / "t_counts.parquet")
    assert list(staged["summary"].columns) == [*cols, WEIGHT]
    assert records_of(staged["summary"]) == len(frame)
    assert not staged["summary"][cols].duplicated().any()  # a frequency table: rows distinct
    assert _as_rows(staged["summary"]) == _as_rows(staged["again"])


@pytest.mark.parametrize("kind", ["object", "str", "category"])
def test_suppressed_rows_are_the_same_whatever_the_labels_dtype(kind: str) -> None:
    """The suppressed block (every QI ``*``) is found the same in a loaded table's
    categoricals, pandas' strings and Python strings: with ``*`` among the labels of a
    column, absent from one, and beside a missing cell."""
    from privpipe.attacks.matching import suppressed_rows

    table = pd.DataFrame(
        {
            "a": pd.Series(["*", "x", "*", None, "*"], dtype=kind),
            "b": pd.Series(["*", "*", "y", "*", "*"], dtype=kind),
            "c": pd.Series([None, "2", "1", "2", "3"], dtype=kind),
        }
    )
    assert suppressed_rows(table, ["a", "b"]).tolist() == [True, False, False, False, True]
    assert not suppressed_rows(table, ["a", "c"]).any()  # no "*" in c, a missing cell
