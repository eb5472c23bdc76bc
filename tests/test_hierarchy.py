"""Tests of anonymity.hierarchy: ARX files, builders, validation, lookups."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import (
    Hierarchy,
    build_dates,
    build_grouping,
    build_intervals,
    build_mask,
    build_prefix,
    hierarchy_to_arx_csv,
    load_arx_csv,
    load_code_lists,
)
from privpipe.errors import ConfigError, InputDataError

ARX = Path(__file__).resolve().parents[2] / "shared" / "data" / "arx"
if not ARX.is_dir():  # the repo lives in /work/main, the shared data beside it
    ARX = Path("/work/shared/data/arx")
needs_arx = pytest.mark.skipif(
    not ARX.is_dir(), reason=f"ARX Adult hierarchies not found at {ARX} (shared data folder)"
)

ADULT = {  # attribute: (raw values, levels), as documented in the data's SOURCE.md
    "age": (100, 5),
    "education": (16, 4),
    "marital-status": (7, 3),
    "native-country": (41, 3),
    "occupation": (14, 3),
    "race": (5, 2),
    "salary-class": (2, 2),
    "sex": (2, 2),
    "workclass": (8, 3),
}


def write(tmp_path: Path, text: str | bytes, name: str = "h.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def small() -> Hierarchy:
    table = [
        ["a1", "A", "AB", "*"],
        ["a2", "A", "AB", "*"],
        ["b1", "B", "AB", "*"],
        ["c1", "C", "CD", "*"],
        ["d1", "D", "CD", "*"],
    ]
    return Hierarchy("x", np.array(table, dtype=object), source="small")


# --------------------------------------------------------------------------- ARX Adult files


@needs_arx
@pytest.mark.parametrize("attribute", sorted(ADULT))
def test_adult_hierarchies_load_with_documented_shape(attribute: str) -> None:
    h = load_arx_csv(ARX / f"adult_hierarchy_{attribute}.csv", attribute)
    n_values, n_levels = ADULT[attribute]
    assert (h.domain_size, h.levels, h.height) == (n_values, n_levels, n_levels - 1)
    assert set(h.labels(h.height)) == {"*"}
    assert h.leaves_under(h.height).tolist() == [n_values] * n_values
    assert h.leaves_under(0).tolist() == [1] * n_values
    assert h.encode(h.values).tolist() == list(range(n_values))


@needs_arx
def test_adult_age_lookups() -> None:
    h = load_arx_csv(ARX / "adult_hierarchy_age.csv", "age")
    codes = h.encode(pd.Series(["39", "17", "91", "150"]))
    assert codes.dtype == np.int64
    assert codes[3] == -1
    assert h.values[codes[:3]].tolist() == ["39", "17", "91"]
    assert h.generalize(codes[:3], 1).tolist() == ["35-39", "15-19", "90-94"]
    assert h.generalize(codes[:3], 2).tolist() == ["30-39", "10-19", "90-99"]
    # the file is used as written, even where ARX's labels are off by one ('20' -> '15-19')
    assert h.generalize(h.encode(["20", "90"]), 1).tolist() == ["15-19", "85-89"]
    # numbers in the data match the string raw values
    assert h.encode(np.array([39, 17])).tolist() == codes[:2].tolist()
    assert h.encode(pd.Series([39.0, 17.0])).tolist() == codes[:2].tolist()
    assert h.leaves_under(1)[codes[0]] == 5
    assert h.leaves_under(2)[codes[0]] == 10


@needs_arx
def test_adult_data_is_covered_by_adult_hierarchies() -> None:
    data = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str)
    for attribute in ADULT:
        h = load_arx_csv(ARX / f"adult_hierarchy_{attribute}.csv", attribute)
        h.check_covers(data[attribute].value_counts())
        assert (h.encode(data[attribute]) >= 0).all()


@needs_arx
def test_adult_education_ids_and_parents() -> None:
    h = load_arx_csv(ARX / "adult_hierarchy_education.csv", "education")
    code = int(h.encode(["Bachelors"])[0])
    assert h.labels(1)[code] == "Undergraduate"
    assert h.labels(2)[code] == "Higher education"
    ids = h.label_ids(2)
    assert h.label_names(2)[ids[code]] == "Higher education"
    assert sorted(set(h.label_names(2))) == sorted(set(h.labels(2)))
    parent = h.parent_ids(1)
    assert (parent[h.label_ids(1)] == h.label_ids(2)).all()


# --------------------------------------------------------------------------- Hierarchy basics


def test_lookups_on_a_small_table() -> None:
    h = small()
    assert (h.levels, h.height, h.domain_size) == (4, 3, 5)
    assert h.values.tolist() == ["a1", "a2", "b1", "c1", "d1"]
    assert h.labels(1).tolist() == ["A", "A", "B", "C", "D"]
    assert h.leaves_under(1).tolist() == [2, 2, 1, 1, 1]
    assert h.leaves_under(2).tolist() == [3, 3, 3, 2, 2]
    assert h.label_ids(2).tolist() == [0, 0, 0, 1, 1]
    assert h.label_names(2).tolist() == ["AB", "CD"]
    assert h.parent_ids(1).tolist() == [0, 0, 1, 1]
    assert h.generalize(np.array([[0, 3], [4, 2]]), 2).tolist() == [["AB", "CD"], ["CD", "AB"]]
    codes = h.encode(pd.Series(["d1", "a1", None, "zz", "a1"]))
    assert codes.tolist() == [4, 0, -1, -1, 0]


def test_caches_are_read_only_and_repr_is_short() -> None:
    h = small()
    with pytest.raises(ValueError):
        h.labels(1)[0] = "changed"
    with pytest.raises(ValueError):
        h.table[0, 0] = "changed"
    assert repr(h) == "Hierarchy(attribute='x', values=5, levels=4, source='small')"


def test_table_is_copied_from_caller() -> None:
    table = np.array([["a", "*"], ["b", "*"]], dtype=object)
    h = Hierarchy("x", table)
    table[0, 0] = "z"
    assert h.values.tolist() == ["a", "b"]


def test_bad_level_and_codes_raise() -> None:
    h = small()
    with pytest.raises(ValueError, match=r"level 4 is out of range 0\.\.3"):
        h.labels(4)
    with pytest.raises(ValueError, match="raw code -1 is out of range"):
        h.generalize(np.array([0, -1]), 1)
    with pytest.raises(ValueError, match="top level has no parent"):
        h.parent_ids(3)


def test_lowest_common_ancestor() -> None:
    h = small()
    assert h.lowest_common_ancestor(np.array([0])) == (0, "a1")
    assert h.lowest_common_ancestor(np.array([0, 1])) == (1, "A")
    assert h.lowest_common_ancestor(np.array([0, 1, 2])) == (2, "AB")
    assert h.lowest_common_ancestor([3, 4, 4]) == (2, "CD")
    assert h.lowest_common_ancestor(np.array([0, 4])) == (3, "*")
    with pytest.raises(ValueError, match="at least one"):
        h.lowest_common_ancestor(np.array([], dtype=np.int64))


def test_pickle_round_trip_keeps_aliases() -> None:
    h = Hierarchy("x", small().table, source="s", aliases={"A-1": "a1"})
    h2 = pickle.loads(pickle.dumps(h))
    assert (h2.table == h.table).all()
    assert h2.encode(["A-1", "b1"]).tolist() == [0, 2]
    assert h2.leaves_under(2).tolist() == h.leaves_under(2).tolist()


def test_one_definition_is_analysed_once_per_process_and_another_apart() -> None:
    h = Hierarchy("x", small().table, source="s", aliases={"A-1": "a1"})
    first, again = pickle.loads(pickle.dumps(h)), pickle.loads(pickle.dumps(h))
    assert again is first  # the side input of every stage: one analysis
    other = [
        Hierarchy("x", small().table, source="s", aliases={"A-1": "b1"}),  # another target
        Hierarchy("x", small().table, source="s", aliases={"A-2": "a1"}),
        Hierarchy("y", small().table, source="s", aliases={"A-1": "a1"}),
        Hierarchy("x", small().table, source="t", aliases={"A-1": "a1"}),
        Hierarchy("x", small().table[:, [0, 2, 3]], source="s", aliases={"A-1": "a1"}),
    ]
    table = small().table.copy()
    table[-1, 0] = "z9"  # one cell differs
    other.append(Hierarchy("x", table, source="s", aliases={"A-1": "a1"}))
    for o in other:
        restored = pickle.loads(pickle.dumps(o))
        assert restored is not first
        assert restored.attribute == o.attribute and restored.source == o.source
        assert restored.table.tolist() == o.table.tolist()
        assert dict(restored.aliases) == dict(o.aliases)
    assert first.encode(["A-1"]).tolist() == [0]
    assert pickle.loads(pickle.dumps(other[0])).encode(["A-1"]).tolist() == [2]
    assert not first.labels(1).flags.writeable  # shared, so read-only


def test_non_str_cells_are_refused() -> None:
    with pytest.raises(TypeError, match=r"row 2, level 0 is int 7"):
        Hierarchy("x", np.array([["a", "*"], [7, "*"]], dtype=object))


def test_last_level_may_be_one_value_other_than_star() -> None:
    h = Hierarchy("x", np.array([["a", "any"], ["b", "any"]], dtype=object))
    assert h.labels(1).tolist() == ["any", "any"]


# --------------------------------------------------------------------------- encode details


def test_encode_normalises_numbers_and_input_kinds() -> None:
    h = Hierarchy(
        "n", np.array([["39", "*"], ["39.5", "*"], ["-3", "*"], ["True", "*"]], dtype=object)
    )
    assert h.encode(np.array([39.0, 39.5, -3.0])).tolist() == [0, 1, 2]
    assert h.encode(pd.Series([39, -3], dtype="Int64")).tolist() == [0, 2]
    assert h.encode(pd.Series(["39", "-3"], dtype="category")).tolist() == [0, 2]
    assert h.encode(np.array(["39", "39.5"])).tolist() == [0, 1]  # numpy unicode
    assert h.encode([39, "39", 39.0, True, None, float("nan")]).tolist() == [0, 0, 0, 3, -1, -1]
    assert h.encode(pd.Index(["39.5"])).tolist() == [1]
    assert h.encode(x for x in ["39"]).tolist() == [0]  # any iterable
    assert h.encode([]).tolist() == []
    # strings are matched exactly: no stripping, no reformatting
    assert h.encode(["39.0", " 39"]).tolist() == [-1, -1]


def test_encode_is_vectorised_on_a_large_batch() -> None:
    zips = np.char.zfill(np.arange(20_000).astype(str), 5).astype(object)
    h = build_mask("zip", zips, digits=5)
    rng = np.random.default_rng(0)
    batch = pd.Series(rng.choice(zips, 65_536))
    codes = h.encode(batch)
    assert (h.values[codes] == batch.to_numpy(dtype=object)).all()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.integers(-3, 12), st.sampled_from(["7", "x", ""])), max_size=40
    ),
    st.sampled_from(["str", "Int64", "float"]),
)
def test_encode_of_a_categorical_is_the_encode_of_its_values(values: list, kind: str) -> None:
    """Codes into categories (unused and missing ones too) give the raw codes the values
    give, for every batch sharing the dtype and after a switch to another dtype."""
    h = Hierarchy(
        "n",
        np.array([[str(i), "low" if i < 5 else "high", "*"] for i in range(10)], dtype=object),
        aliases={"": "0", "x": "9"},
    )
    if kind == "str":
        plain = pd.Series([None if v is None else str(v) for v in values], dtype="str")
    elif kind == "Int64":
        plain = pd.Series([v if isinstance(v, int) else None for v in values], dtype="Int64")
    else:
        plain = pd.Series([float(v) if isinstance(v, int) else np.nan for v in values])
    present = plain.dropna().unique().tolist()
    dtype = pd.CategoricalDtype(pd.Index([*present, *([] if kind == "str" else [11])]).unique())
    categorical = plain.astype(dtype)
    expected = h.encode(plain.astype(object)).tolist()
    assert h.encode(categorical).tolist() == expected
    assert h.encode(categorical.array).tolist() == expected  # a Categorical
    assert h.encode(categorical[::-1]).tolist() == expected[::-1]  # same dtype, cached
    other = plain.astype("category")  # another dtype object: looked up afresh
    assert h.encode(other).tolist() == expected


# --------------------------------------------------------------------------- aliases


def test_aliases_map_data_values_to_raw_values() -> None:
    config_map = {"A-1": "a1", None: "d1", 7: "b1"}  # YAML may give null or int keys
    h = Hierarchy("x", small().table, source="small", aliases=config_map)  # type: ignore[arg-type]
    assert h.encode(["A-1", "a1", None, "", 7, "7"]).tolist() == [0, 0, 4, 4, 2, 2]
    assert h.aliases == {"A-1": "a1", "": "d1", "7": "b1"}
    h.check_covers(pd.Series({"A-1": 3, "c1": 1}))


def test_alias_errors_name_the_map_key() -> None:
    with pytest.raises(ConfigError, match=r"hierarchies\.x\.map: 'q' -> 'nope'.*not a raw value"):
        Hierarchy("x", small().table, aliases={"q": "nope"})
    with pytest.raises(ConfigError, match=r"'a2' is already a raw value of small; remove it"):
        Hierarchy("x", small().table, source="small", aliases={"a2": "a1"})
    with pytest.raises(ConfigError, match="mapped twice"):
        Hierarchy("x", small().table, aliases={7: "a1", "7": "a2"})  # type: ignore[dict-item]
    # mapping a raw value to itself is harmless
    assert Hierarchy("x", small().table, aliases={"a1": "a1"}).aliases == {}


# --------------------------------------------------------------------------- coverage


def test_missing_from_raw_values_or_counts() -> None:
    h = small()
    raw = pd.Series(["a1", "zz", "zz", "yy", None, "b1"])
    m = h.missing(raw)
    assert m.name == "count"
    assert m.tolist() == [2, 1, 1]
    assert m.index[:2].tolist() == ["zz", "yy"] and pd.isna(m.index[2])  # missing cell
    counts = raw.value_counts()  # named "count": detected as counts
    assert h.missing(counts).to_dict() == {"zz": 2, "yy": 1}
    unnamed = pd.Series({"a1": 5, "zz": 4, "qq": 0})
    assert h.missing(unnamed, counts=True).to_dict() == {"zz": 4}
    assert h.missing(pd.Series(["a1"])).empty


def test_check_covers_message_counts_and_examples() -> None:
    h = small()
    counts = pd.Series({"a1": 10, "x1": 7, "x2": 1, "x3": 3, "x4": 2, "x5": 2, "x6": 1})
    with pytest.raises(InputDataError) as info:
        h.check_covers(counts)
    msg = str(info.value)
    assert info.value.exit_code == 3
    assert msg.startswith("column 'x': 6 distinct values in 16 rows not in the hierarchy (small)")
    assert "'x1' (7 rows), 'x3' (3 rows), 'x4' (2 rows), 'x5' (2 rows), 'x2' (1 row)" in msg
    assert "and 1 more" in msg
    assert msg.endswith("add them to small or map them with hierarchies.x.map")
    h.check_covers(pd.Series({"a1": 10, "d1": 2}))
    h.check_covers(pd.Series(dtype="int64"))


def test_check_covers_reports_missing_cells() -> None:
    h = small()
    counts = pd.Series([4, 2], index=pd.Index(["a1", None], dtype=object))
    with pytest.raises(InputDataError, match=r"1 distinct value in 2 rows .*<empty> \(2 rows\)"):
        h.check_covers(counts)


def test_check_covers_accepts_float_counts_after_combining() -> None:
    a = pd.Series({"a1": 2, "zz": 1})
    b = pd.Series({"zz": 2})
    combined = a.add(b, fill_value=0)  # float64 after alignment
    with pytest.raises(InputDataError, match=r"1 distinct value in 3 rows.*'zz' \(3 rows\)"):
        small().check_covers(combined)


# --------------------------------------------------------------------------- ARX file errors


def test_loader_tolerates_crlf_blank_lines_and_bom(tmp_path: Path) -> None:
    path = write(tmp_path, "\ufeffa;A;*\r\n\r\nb;A;*\r\n   \nc;C;*")
    h = load_arx_csv(path, "x")
    assert h.values.tolist() == ["a", "b", "c"]
    assert h.labels(1).tolist() == ["A", "A", "C"]
    assert h.source == str(path)


def test_loader_other_delimiter_and_encoding(tmp_path: Path) -> None:
    path = write(tmp_path, "München,Bayern,*\nKöln,NRW,*\n".encode("latin-1"))
    h = load_arx_csv(path, "city", delimiter=",", encoding="latin-1")
    assert h.values.tolist() == ["München", "Köln"]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(InputDataError, match=r"nope\.csv: hierarchy file for 'age' not found; fix"):
        load_arx_csv(path, "age")
    with pytest.raises(InputDataError, match="is a directory"):
        load_arx_csv(tmp_path, "age")


def test_empty_file(tmp_path: Path) -> None:
    for text in ("", "\n\n  \r\n"):
        with pytest.raises(InputDataError, match=r"h\.csv: the hierarchy file for 'x' is empty"):
            load_arx_csv(write(tmp_path, text), "x")


def test_ragged_rows_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a;A;*\nb;B;*\n\nc;*\nd;D;*\n")
    with pytest.raises(InputDataError) as info:
        load_arx_csv(path, "x")
    assert str(info.value).startswith(
        f"{path}: line 4 has 2 columns but line 1 (like most lines) has 3"
    )


def test_duplicate_raw_value_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "a;A;*\nb;B;*\nc;C;*\nb;C;*\n")
    with pytest.raises(InputDataError, match=r"line 4: raw value 'b' also appears on line 2"):
        load_arx_csv(path, "x")


def test_level_not_a_function_of_previous(tmp_path: Path) -> None:
    lines = [f"{v};15-19;10-19;*" for v in range(15, 20)]
    lines += ["20;20-24;20-29;*", "21;20-24;20-24;*", "22;20-24;20-29;*", "23;20-24;20-29;*"]
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(InputDataError) as info:
        load_arx_csv(path, "age")
    msg = str(info.value)
    assert msg.startswith(
        f"{path}: line 7: value '21' maps to '20-24' at level 1 but '20-24' at level 2, "
        "while '20' (line 6) maps to '20-24' then '20-29'"
    )
    assert "each level must be a function of the previous one" in msg
    assert msg.endswith("fix the file")


def test_two_top_values(tmp_path: Path) -> None:
    path = write(tmp_path, "a;A;*\nb;B;*\nc;C;all\n")
    with pytest.raises(InputDataError) as info:
        load_arx_csv(path, "x")
    msg = str(info.value)
    assert "the last level (level 2) must be one value ('*'), found 2" in msg
    assert "'*' (line 1), 'all' (line 3)" in msg


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, b"a;A;*\nb;B;*\nM\xfcnchen;C;*\n")
    with pytest.raises(InputDataError, match=r"line 3: not valid utf-8 \(byte 0xfc\)"):
        load_arx_csv(path, "x")


def test_empty_cells_and_single_column(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match=r"line 2: empty label at level 1"):
        load_arx_csv(write(tmp_path, "a;A;*\nb; ;*\n"), "x")
    with pytest.raises(InputDataError, match=r"line 2: empty raw value"):
        load_arx_csv(write(tmp_path, "a;A;*\n;B;*\n"), "x")
    with pytest.raises(InputDataError, match=r"only one column.*check the delimiter"):
        load_arx_csv(write(tmp_path, "a,A,*\nb,B,*\n"), "x")


def test_direct_table_errors_use_row_numbers() -> None:
    table = np.array([["a", "A", "*"], ["a", "B", "*"]], dtype=object)
    with pytest.raises(
        InputDataError, match=r"hierarchy of 'x': row 2: raw value 'a' also .*row 1"
    ):
        Hierarchy("x", table)
    with pytest.raises(InputDataError, match="no values"):
        Hierarchy("x", np.empty((0, 2), dtype=object))


def test_writer_round_trip_and_refuses_delimiter_in_values(tmp_path: Path) -> None:
    h = small()
    path = hierarchy_to_arx_csv(h, tmp_path / "sub" / "x.csv")
    assert path.read_text(encoding="utf-8").splitlines()[0] == "a1;A;AB;*"
    back = load_arx_csv(path, "x")
    assert (back.table == h.table).all()
    bad = Hierarchy("x", np.array([["a;b", "*"]], dtype=object))
    with pytest.raises(InputDataError, match=r"row 1, level 0: 'a;b' contains ';'"):
        hierarchy_to_arx_csv(bad, tmp_path / "bad.csv")
    assert hierarchy_to_arx_csv(bad, tmp_path / "ok.csv", delimiter="|").exists()


# --------------------------------------------------------------------------- builders


def test_build_intervals_labels() -> None:
    h = build_intervals("age", ["39", "23", 24.0, 17, "17"], [5, 10, 20])
    assert h.levels == 5
    assert h.values.tolist() == ["17", "23", "24", "39"]  # canonical, deduplicated, sorted
    assert h.labels(1).tolist() == ["[15, 20)", "[20, 25)", "[20, 25)", "[35, 40)"]
    assert h.labels(2).tolist() == ["[10, 20)", "[20, 30)", "[20, 30)", "[30, 40)"]
    assert h.labels(3).tolist() == ["[0, 20)", "[20, 40)", "[20, 40)", "[20, 40)"]
    assert h.labels(4).tolist() == ["*"] * 4
    assert h.encode(pd.Series([39, 24.0, "23"])).tolist() == [3, 2, 1]
    assert h.source == "hierarchies.age.intervals"


def test_build_intervals_start_boundaries_and_floats() -> None:
    h = build_intervals("v", ["0.3", "0.1", "-0.05", "2.5"], [0.2, 0.4], start=0.1)
    assert dict(zip(h.values, h.labels(1), strict=True)) == {
        "-0.05": "[-0.1, 0.1)",
        "0.1": "[0.1, 0.3)",
        "0.3": "[0.3, 0.5)",
        "2.5": "[2.5, 2.7)",
    }
    assert dict(zip(h.values, h.labels(2), strict=True))["0.3"] == "[0.1, 0.5)"
    assert build_intervals("v", ["20"], [5]).labels(1).tolist() == ["[20, 25)"]
    assert build_intervals("v", ["7"], []).levels == 2


def test_build_intervals_errors() -> None:
    with pytest.raises(ConfigError, match=r"hierarchies\.age\.intervals\.widths: 15 is not a"):
        build_intervals("age", ["1"], [10, 15])
    with pytest.raises(ConfigError, match=r"widths: 5 is not a larger multiple of 10"):
        build_intervals("age", ["1"], [10, 5])
    with pytest.raises(ConfigError, match=r"widths: width 0 must be positive"):
        build_intervals("age", ["1"], [0, 5])
    with pytest.raises(ConfigError, match=r"my\.key\.widths: expected a finite number"):
        build_intervals("age", ["1"], ["5"], key="my.key")  # type: ignore[list-item]
    with pytest.raises(InputDataError, match=r"2 values not numeric: 'abc', 'n/a'"):
        build_intervals("age", ["1", "abc", None, "n/a"], [5])
    with pytest.raises(InputDataError) as info:
        build_intervals("age", ["150", "1", "-1"], [5], lower=0, upper=120)
    assert "column 'age': 2 values outside [0, 120]" in str(info.value)
    assert "'150', '-1'" in str(info.value)
    with pytest.raises(InputDataError, match="no values to build"):
        build_intervals("age", [None, ""], [5])


def test_build_mask_labels() -> None:
    h = build_mask("zip", ["47677", "47602", "10115"])
    assert h.levels == 6
    row = h.table[h.encode(["47677"])[0]].tolist()
    assert row == ["47677", "4767*", "476**", "47***", "4****", "*"]
    assert h.leaves_under(2)[h.encode(["47677"])[0]] == 2
    assert build_mask("c", ["ab", "cd"], char="#").table.tolist() == [
        ["ab", "a#", "*"],
        ["cd", "c#", "*"],
    ]
    assert build_mask("c", ["7", "8"]).levels == 2


def test_build_mask_errors() -> None:
    with pytest.raises(InputDataError) as info:
        build_mask("zip", ["47677", 2138, "123456"], digits=5)
    msg = str(info.value)
    assert "2 values without exactly 5 letters/digits (hierarchies.zip.mask.digits;" in msg
    assert "'2138' (4 characters), '123456' (6 characters)" in msg
    assert "leading zeros" in msg
    with pytest.raises(InputDataError, match=r"values differ in length \(most have 5 .*'123'"):
        build_mask("zip", ["47677", "47602", "123"])
    with pytest.raises(ConfigError, match=r"mask\.digits: expected a positive integer"):
        build_mask("zip", ["1"], digits=0)
    with pytest.raises(ConfigError, match=r"mask\.char: expected one character"):
        build_mask("zip", ["1"], char="**")


def test_build_dates_month_year() -> None:
    h = build_dates("d", ["2024-03-01", "2023-12-31", "2024-03-15"])
    assert h.table.tolist() == [
        ["2023-12-31", "2023-12", "2023", "*"],
        ["2024-03-01", "2024-03", "2024", "*"],
        ["2024-03-15", "2024-03", "2024", "*"],
    ]


def test_build_dates_week_decade_and_format() -> None:
    h = build_dates(
        "d", ["01/03/2024", "30/12/2024", "05/01/2019"], ["week", "year", "decade"], "%d/%m/%Y"
    )
    rows = {r[0]: r[1:] for r in h.table.tolist()}
    assert rows["01/03/2024"] == ["2024-W09", "2024", "2020s", "*"]
    assert rows["30/12/2024"] == ["2025-W01", "2025", "2020s", "*"]  # ISO week-based year
    assert rows["05/01/2019"] == ["2019-W01", "2019", "2010s", "*"]
    assert build_dates("d", ["2019-06-01"], ["decade"]).table.tolist() == [
        ["2019-06-01", "2010s", "*"]
    ]


def test_build_dates_errors() -> None:
    with pytest.raises(ConfigError, match=r"dates\.levels: 'month' after 'year'"):
        build_dates("d", ["2024-01-01"], ["year", "month"])
    with pytest.raises(ConfigError, match=r"'month' cannot follow 'week'"):
        build_dates("d", ["2024-01-01"], ["week", "month"])
    with pytest.raises(ConfigError, match=r"levels\[1\]: unknown unit 'quarter'"):
        build_dates("d", ["2024-01-01"], ["month", "quarter"])
    with pytest.raises(ConfigError, match="expected a list"):
        build_dates("d", ["2024-01-01"], "month")
    with pytest.raises(InputDataError) as info:
        build_dates("d", ["2024-01-01", "2024-13-01", "yesterday"])
    assert "column 'd': 2 values not dates in the format '%Y-%m-%d'" in str(info.value)
    assert "'2024-13-01', 'yesterday'" in str(info.value)


def test_build_grouping_levels_and_top() -> None:
    h = build_grouping(
        "country",
        [
            {"France": "Europe", "Spain": "Europe", "Japan": "Asia"},
            {"Europe": "Old world", "Asia": "Old world"},
        ],
    )
    assert h.table.tolist() == [
        ["France", "Europe", "Old world"],
        ["Spain", "Europe", "Old world"],
        ["Japan", "Asia", "Old world"],
    ]
    h2 = build_grouping("c", [{"a": "X", "b": "Y"}])
    assert h2.levels == 3
    assert h2.labels(2).tolist() == ["*", "*"]
    assert build_grouping("n", [{1: "low", 2: "low"}]).values.tolist() == ["1", "2"]  # type: ignore[dict-item]


def test_build_grouping_errors_name_the_level() -> None:
    with pytest.raises(ConfigError) as info:
        build_grouping("c", [{"a": "X", "b": "Y", "c": "Z"}, {"X": "all"}])
    msg = str(info.value)
    assert msg.startswith("hierarchies.c.grouping.levels[1]: 2 groups of levels[0] not mapped")
    assert "'Y', 'Z'" in msg
    with pytest.raises(ConfigError, match=r"levels\[1\]: 'Q' not a group of levels\[0\]"):
        build_grouping("c", [{"a": "X"}, {"X": "all", "Q": "all"}])
    with pytest.raises(ConfigError, match=r"levels\[0\]: 'a' -> <empty>: empty value or group"):
        build_grouping("c", [{"a": ""}])
    with pytest.raises(ConfigError, match=r"grouping\.levels: expected a non-empty list"):
        build_grouping("c", [])
    with pytest.raises(ConfigError, match=r"levels\[0\]: expected a non-empty mapping"):
        build_grouping("c", [{}])


def test_builders_pass_aliases_and_key() -> None:
    h = build_mask("zip", ["47677"], key="hierarchies.zip.mask", aliases={"4767": "47677"})
    assert h.encode(["4767", 47677]).tolist() == [0, 0]


# --------------------------------------------------------------------------- properties


@st.composite
def groupings(draw: st.DrawFn) -> list[dict[str, str]]:
    n_raw = draw(st.integers(1, 30))
    current = [f"v{i}" for i in range(n_raw)]
    levels: list[dict[str, str]] = []
    for depth in range(draw(st.integers(1, 4))):
        n_groups = draw(st.integers(1, max(1, len(current))))
        targets = draw(
            st.lists(st.integers(0, n_groups - 1), min_size=len(current), max_size=len(current))
        )
        mapping = {value: f"g{depth}_{t}" for value, t in zip(current, targets, strict=True)}
        levels.append(mapping)
        current = list(dict.fromkeys(mapping.values()))
    return levels


@settings(max_examples=60, deadline=None)
@given(groupings())
def test_grouping_property_function_and_leaf_counts(levels: list[dict[str, str]]) -> None:
    h = build_grouping("g", levels)
    assert h.domain_size == len(levels[0])
    assert len(set(h.labels(h.height))) == 1
    for level in range(h.levels):
        labels = h.labels(level)
        if level < h.height:  # each level a function of the previous one
            pairs = pd.DataFrame({"here": labels, "up": h.labels(level + 1)}).drop_duplicates()
            assert pairs["here"].is_unique
            assert (h.parent_ids(level)[h.label_ids(level)] == h.label_ids(level + 1)).all()
        leaves = h.leaves_under(level)
        firsts = pd.Series(labels).drop_duplicates().index.to_numpy()
        assert leaves[firsts].sum() == h.domain_size  # one count per distinct label
        assert (leaves == pd.Series(labels).map(pd.Series(labels).value_counts())).all()
    codes = np.arange(h.domain_size)
    level, label = h.lowest_common_ancestor(codes)
    assert len(set(h.labels(level))) == 1 and h.labels(level)[0] == label
    assert level == 0 or len(set(h.labels(level - 1))) > 1
    with tempfile.TemporaryDirectory() as tmp:  # round trip through the ARX format
        back = load_arx_csv(hierarchy_to_arx_csv(h, Path(tmp) / "g.csv"), "g")
    assert (back.table == h.table).all()


# ---------------------------------------------------------------- codes with separators


PUMAS = ["01-01301", "01-01302", "02-00100"]


def test_mask_keeps_separators_and_never_counts_them() -> None:
    """The dash of 01-01301 used to count as a digit: 0******* grouped states by the
    first digit of their code."""
    h = build_mask("PUMA", PUMAS)
    assert h.height == 7  # 7 code characters masked one by one, then *
    row = list(h.table[0])
    assert row == [
        "01-01301", "01-0130*", "01-013**", "01-01***", "01-0****", "01-*****", "0*-*****", "*"
    ]  # fmt: skip
    assert build_mask("PUMA", PUMAS, digits=7).height == 7
    with pytest.raises(InputDataError, match="separators do not count"):
        build_mask("PUMA", PUMAS, digits=8)
    with pytest.raises(InputDataError, match="most have 7 letters/digits"):
        build_mask("PUMA", [*PUMAS, "01-0130"])
    assert list(build_mask("zip", ["47677"]).table[0]) == [
        "47677", "4767*", "476**", "47***", "4****", "*"
    ]  # fmt: skip


def test_prefix_builder_keeps_leading_code_characters() -> None:
    h = build_prefix("PUMA", PUMAS, [4, 2])
    assert [list(r) for r in h.table] == [
        ["01-01301", "01-01", "01", "*"],
        ["01-01302", "01-01", "01", "*"],
        ["02-00100", "02-00", "02", "*"],
    ]
    assert h.generalize(h.encode(pd.Series(["01-01302", "02-00100"])), 2).tolist() == ["01", "02"]
    with pytest.raises(ConfigError, match="strictly decreasing"):
        build_prefix("PUMA", PUMAS, [2, 4])
    with pytest.raises(ConfigError, match="positive integers"):
        build_prefix("PUMA", PUMAS, [0])
    with pytest.raises(InputDataError, match="no longer than the first prefix"):
        build_prefix("PUMA", ["01", *PUMAS], [2])


def test_code_lists(tmp_path: Path) -> None:
    (tmp_path / "puma.csv").write_text("puma,state\n01-01301,01\n01-01302,01\n02-00100,02\n")
    (tmp_path / "state.csv").write_text("state,region\n01,south\n02,west\n")
    h = load_code_lists("PUMA", [tmp_path / "puma.csv", tmp_path / "state.csv"])
    assert [list(r) for r in h.table] == [
        ["01-01301", "01", "south", "*"],
        ["01-01302", "01", "south", "*"],
        ["02-00100", "02", "west", "*"],
    ]  # leading zeros kept: codes are read as text
    (tmp_path / "short.csv").write_text("state,region\n01,south\n")
    with pytest.raises(ConfigError, match="not mapped"):
        load_code_lists("PUMA", [tmp_path / "puma.csv", tmp_path / "short.csv"])
    (tmp_path / "dup.csv").write_text("puma,state\n01-01301,01\n01-01301,02\n")
    with pytest.raises(ConfigError, match="more than one parent"):
        load_code_lists("PUMA", [tmp_path / "dup.csv"])
    (tmp_path / "three.csv").write_text("a;b;c\n1;2;3\n")
    with pytest.raises(ConfigError, match="expected 2 columns"):
        load_code_lists("PUMA", [tmp_path / "three.csv"])
    with pytest.raises(ConfigError, match="file not found"):
        load_code_lists("PUMA", [tmp_path / "missing.csv"])


def test_numeric_yaml_keys_are_codes(tmp_path: Path) -> None:
    """`{1: male, 2: female}` used to give 'must be a string, got 1' per key."""
    import yaml

    from privpipe.pipelines.config import validate_config

    def config(groups: str) -> dict[str, object]:
        return {  # the groups as YAML reads them
            "name": "t",
            "input": {"path": "data.csv"},
            "schema": {"quasi_identifiers": ["sex"]},
            "hierarchies": {"sex": {"groups": [yaml.safe_load(groups)]}},
            "releases": [],
            "output": {"dir": "out"},
        }

    cfg = validate_config(config("{1: male, 2: female}"), "t.yaml")
    assert cfg.hierarchies["sex"].groups == [{"1": "male", "2": "female"}]
    with pytest.raises(ConfigError, match="quote it in the YAML"):
        validate_config(config("{1.5: male}"), "t.yaml")
    with pytest.raises(ConfigError, match="quote it in the YAML"):
        validate_config(config("{yes: male}"), "t.yaml")
