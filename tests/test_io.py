"""transforms.io: inspect_input errors and ReadMicrodata on the DirectRunner."""

from __future__ import annotations

import gzip
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.errors import ConfigError, InputDataError
from privpipe.transforms.io import InputSpec, ReadMicrodata, inspect_input
from tests.beamtest import local_pipeline

# --------------------------------------------------------------------------- helpers


class _Dump(beam.DoFn):
    """Pickle every DataFrame into a folder (the test reads them back after the run)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def process(self, frame: pd.DataFrame) -> Iterator[int]:
        frame.to_pickle(f"{self.folder}/{uuid.uuid4().hex}.pkl")
        yield 1


class Result:
    def __init__(self, batches: list[pd.DataFrame], rejected: list[pd.DataFrame]) -> None:
        self.batches = batches
        self.rejected_parts = rejected

    @property
    def rows(self) -> pd.DataFrame:
        return pd.concat(self.batches, ignore_index=True) if self.batches else pd.DataFrame()

    @property
    def rejected(self) -> pd.DataFrame:
        if not self.rejected_parts:
            return pd.DataFrame(columns=["file", "line", "reason", "text"])
        frame = pd.concat(self.rejected_parts, ignore_index=True)
        return frame.sort_values(["file", "line"], ignore_index=True)


def read(tmp_path: Path, spec: InputSpec) -> Result:
    out = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
    (out / "b").mkdir(parents=True)
    (out / "r").mkdir()
    with local_pipeline() as p:
        result = p | "Read" >> ReadMicrodata(spec)
        result["batches"] | "DumpBatches" >> beam.ParDo(_Dump(str(out / "b")))
        result["rejected"] | "DumpRejected" >> beam.ParDo(_Dump(str(out / "r")))
    load = lambda d: [pd.read_pickle(f) for f in sorted((out / d).glob("*.pkl"))]  # noqa: E731
    return Result(load("b"), load("r"))


def write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def sorted_rows(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    return frame.sort_values(by, ignore_index=True)


# --------------------------------------------------------------------------- CSV reading


@pytest.mark.parametrize("delim", [",", ";", "\t"])
def test_delimiters_and_quoted_delimiter(tmp_path: Path, delim: str) -> None:
    d = delim
    text = f'id{d}name{d}age\n1{d}"Smith{d} J."{d}30\n2{d}Doe{d}41\n3{d}"say ""hi"""{d}\n'
    spec = InputSpec(
        paths=(write(tmp_path / "a.csv", text),), delimiter=d, column_types={"age": "integer"}
    )
    assert inspect_input(spec) == ("id", "name", "age")
    res = read(tmp_path, spec)
    rows = sorted_rows(res.rows, "id")
    assert list(rows.columns) == ["id", "name", "age"]
    assert rows["name"].tolist() == [f"Smith{d} J.", "Doe", 'say "hi"']
    assert rows["age"].tolist()[:2] == [30, 41] and rows["age"].isna().tolist()[2]
    assert str(rows["age"].dtype) == "Int64"
    assert isinstance(rows["name"].dtype, pd.StringDtype) and rows["name"].dtype.na_value is pd.NA
    assert res.rejected.empty


def test_crlf_bom_empty_fields_and_na_text(tmp_path: Path) -> None:
    text = "\ufeffsex,city,score\r\nM,NA,1.5\r\n\r\nF,,null\r\n,null,2\r\n"
    spec = InputSpec(paths=(write(tmp_path / "a.csv", text),), column_types={"score": "float"})
    assert inspect_input(spec) == ("sex", "city", "score")
    res = read(tmp_path, spec)
    rows = res.rows
    # "null" is not a float -> rejected; the other rows keep "NA"/"null" text as values.
    assert res.rejected[["line", "reason"]].values.tolist() == [
        [4, "column 'score': 'null' is not a number"]
    ]
    rows = sorted_rows(rows, "score")
    assert rows["city"].tolist() == ["NA", "null"]
    assert rows["sex"].isna().tolist() == [False, True]
    assert rows["score"].tolist() == [1.5, 2.0]
    assert rows["score"].dtype == np.float64
    assert not any("\r" in str(v) for v in rows.astype(str).to_numpy().ravel())


def test_many_splits_rows_exactly_once_and_true_line_numbers(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    lines = ["id,group,value"]
    expected_rejects: dict[int, str] = {}
    good_ids: list[int] = []
    for i in range(400):
        kind = rng.integers(0, 12)
        line_no = len(lines) + 1
        if kind == 0:
            lines.append(f"{i},a,{i},extra")
            expected_rejects[line_no] = "expected 3 fields, saw 4"
        elif kind == 1:
            lines.append(f"{i},b,x{i}")
            expected_rejects[line_no] = f"column 'value': 'x{i}' is not an integer"
        elif kind == 2:
            lines.append("")  # blank: neither a row nor a rejection
            continue
        elif kind == 3:
            lines.append(f'{i},"quoted, with comma",{i}')
            good_ids.append(i)
        else:
            lines.append(f"{i},g{i % 5},{i}")
            good_ids.append(i)
    text = "\r\n".join(lines) + "\r\n"
    path = write(tmp_path / "big.csv", text)
    spec = InputSpec(
        paths=(path,),
        split_bytes=200,
        batch_rows=7,
        column_types={"id": "integer", "value": "integer"},
    )
    res = read(tmp_path, spec)
    assert len(text) > 20 * 200  # many splits
    ids = res.rows["id"].tolist()
    assert sorted(ids) == sorted(good_ids) and len(ids) == len(set(ids))
    assert all(len(b) <= 7 for b in res.batches)
    rejected = res.rejected
    assert dict(zip(rejected["line"], rejected["reason"], strict=True)) == expected_rejects
    for line, raw in zip(rejected["line"], rejected["text"], strict=True):
        assert lines[line - 1] == raw  # the physical line, without CRLF


def test_line_numbers_when_split_starts_exactly_at_a_line(tmp_path: Path) -> None:
    # Every line is 10 bytes: split boundaries fall on line starts and inside lines.
    lines = ["aaaa,bbbb"] + [f"{i:04d},{i:04d}" for i in range(60)]
    lines[17] = "0016,zzzz,1"  # line 18 is ragged
    spec = InputSpec(paths=(write(tmp_path / "a.csv", "\n".join(lines) + "\n"),), split_bytes=50)
    res = read(tmp_path, spec)
    assert res.rejected["line"].tolist() == [18]
    assert len(res.rows) == 59 and res.rows["aaaa"].is_unique


def test_ragged_bad_numbers_and_empty_quasi_identifiers(tmp_path: Path) -> None:
    text = (
        "age,sex,zip,income\n"
        "30,M,1000,1.5\n"
        "31,F\n"
        "abc,M,1001,2\n"
        "32,,1002,3\n"
        "33,M,1003,4,5,6\n"
        "34,M,,oops\n"
        "99999999999999999999,M,1,1\n"
        " +35 ,F,1,1e3\n"
        "36,F,1,inf\n"
        "3.0,F,1,1\n"
    )
    spec = InputSpec(
        paths=(write(tmp_path / "a.csv", text),),
        column_types={"age": "integer", "income": "float"},
        nonempty_columns=("sex", "zip"),
    )
    res = read(tmp_path, spec)
    got = res.rejected[["line", "reason", "text"]].values.tolist()
    assert got == [
        [3, "expected 4 fields, saw 2", "31,F"],
        [4, "column 'age': 'abc' is not an integer", "abc,M,1001,2"],
        [5, "column 'sex': empty value (the column is declared non-empty)", "32,,1002,3"],
        [6, "expected 4 fields, saw 6", "33,M,1003,4,5,6"],
        [
            7,
            "column 'zip': empty value (the column is declared non-empty); "
            "column 'income': 'oops' is not a number",
            "34,M,,oops",
        ],
        [
            8,
            "column 'age': '99999999999999999999' is out of the 64-bit integer range",
            "99999999999999999999,M,1,1",
        ],
        [10, "column 'income': 'inf' is not a finite number", "36,F,1,inf"],
        [11, "column 'age': '3.0' is not an integer", "3.0,F,1,1"],
    ]
    rows = sorted_rows(res.rows, "age")
    assert rows["age"].tolist() == [30, 35] and rows["income"].tolist() == [1.5, 1000.0]
    assert set(res.rejected["file"]) == {spec.paths[0]}


def test_non_utf8_rows_are_rejected_and_latin1_reads_them(tmp_path: Path) -> None:
    raw = b"name,city\nAnna,Berlin\nJos\xe9,Z\xfcrich\nBob,Paris\n"
    path = write(tmp_path / "a.csv", raw)
    res = read(tmp_path, InputSpec(paths=(path,)))
    assert sorted(res.rows["name"]) == ["Anna", "Bob"]
    [[line, reason, text]] = res.rejected[["line", "reason", "text"]].values.tolist()
    assert line == 3 and text == "Jos\\xe9,Z\\xfcrich"
    offset = raw.index(b"\xe9")
    assert reason.startswith(f"invalid UTF-8 at byte offset {offset} ")
    assert "input.encoding" in reason
    res = read(tmp_path, InputSpec(paths=(path,), encoding="latin-1"))
    assert sorted(res.rows["city"]) == ["Berlin", "Paris", "Zürich"]
    assert res.rejected.empty


def test_invalid_utf8_in_a_later_split_has_the_right_line(tmp_path: Path) -> None:
    body = b"".join(b"%d,v%d\n" % (i, i) for i in range(100))
    raw = b"k,v\n" + body + b"100,\xff\xfe\n101,ok\n"
    spec = InputSpec(paths=(write(tmp_path / "a.csv", raw),), split_bytes=64)
    res = read(tmp_path, spec)
    assert res.rejected["line"].tolist() == [102]
    offset = raw.index(b"\xff")
    assert res.rejected["reason"][0].startswith(f"invalid UTF-8 at byte offset {offset} ")
    assert len(res.rows) == 101


def test_unbalanced_quote_rejects_only_its_line(tmp_path: Path) -> None:
    text = 'a,b,c\n1,2,3\n4,"five,6\n7,8,9\n10,11,"12\n'
    res = read(tmp_path, InputSpec(paths=(write(tmp_path / "a.csv", text),)))
    assert sorted(res.rows["a"]) == ["1", "7"]
    assert res.rejected["line"].tolist() == [3, 5]
    assert all("unbalanced quote" in r for r in res.rejected["reason"])


def test_bare_carriage_return_is_rejected(tmp_path: Path) -> None:
    text = "a,b\n1,2\n3\r,4\n5,6\n"
    res = read(tmp_path, InputSpec(paths=(write(tmp_path / "a.csv", text),)))
    assert sorted(res.rows["a"]) == ["1", "5"]
    assert res.rejected["line"].tolist() == [3]
    assert "carriage return" in res.rejected["reason"][0]


def test_multiline_records(tmp_path: Path) -> None:
    text = 'id,note,n\n1,"line one\nline two",5\n2,plain,x\n3,"a\r\nb\r\nc",7\n4,x\n5,"",8\n'
    spec = InputSpec(
        paths=(write(tmp_path / "a.csv", text),),
        multiline_records=True,
        column_types={"n": "integer"},
        split_bytes=16,
    )
    res = read(tmp_path, spec)
    rows = sorted_rows(res.rows, "id")
    assert rows["id"].tolist() == ["1", "3", "5"]
    assert rows["note"].tolist()[:2] == ["line one\nline two", "a\r\nb\r\nc"]
    assert rows["note"].isna().tolist()[2]
    assert res.rejected[["line", "reason"]].values.tolist() == [
        [4, "column 'n': 'x' is not an integer"],
        [8, "expected 3 fields, saw 2"],
    ]


def test_header_false_with_column_names(tmp_path: Path) -> None:
    spec = InputSpec(
        paths=(write(tmp_path / "a.csv", "1;x\n2;y\n3\n"),),
        delimiter=";",
        header=False,
        column_names=("n", "s"),
        column_types={"n": "integer"},
    )
    assert inspect_input(spec) == ("n", "s")
    res = read(tmp_path, spec)
    assert sorted(res.rows["n"].tolist()) == [1, 2]
    assert res.rejected["line"].tolist() == [3]


def test_multiple_files_and_batch_rows(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", "k,v\n" + "".join(f"a{i},{i}\n" for i in range(23)))
    b = write(tmp_path / "b.csv", "k,v\n" + "".join(f"b{i},{i}\n" for i in range(5)) + "bad\n")
    c = write(tmp_path / "c.csv", "k,v\n")  # header only is fine when another file has rows
    res = read(tmp_path, InputSpec(paths=(a, b, c), batch_rows=4))
    assert len(res.rows) == 28 and res.rows["k"].is_unique
    assert max(len(x) for x in res.batches) == 4
    assert all(list(x.columns) == ["k", "v"] for x in res.batches)
    assert all(isinstance(x.index, pd.RangeIndex) and x.index.start == 0 for x in res.batches)
    assert res.rejected[["file", "line"]].values.tolist() == [[b, 7]]


# --------------------------------------------------------------------------- Parquet, JSONL


def test_parquet_row_groups(tmp_path: Path) -> None:
    table = pa.table(
        {
            "age": pa.array(["1", "2", "x", "4", "5", "6", "7"], pa.string()),
            "w": pa.array([1.0, 2.5, 3.0, None, 5.0, 6.0, 7.0]),
            "n": pa.array([1, 2, 3, 4, 5, 6, None], pa.int64()),
            "sex": pa.array(["M", "F", "M", "", "F", "M", None]),
        }
    )
    path = str(tmp_path / "a.parquet")
    pq.write_table(table, path, row_group_size=2)
    assert pq.ParquetFile(path).num_row_groups == 4
    spec = InputSpec(
        paths=(path,),
        format="parquet",
        batch_rows=1,
        column_types={"age": "integer", "w": "integer", "n": "float"},
        nonempty_columns=("sex",),
    )
    assert inspect_input(spec) == ("age", "w", "n", "sex")
    res = read(tmp_path, spec)
    rows = sorted_rows(res.rows, "age")
    assert rows["age"].tolist() == [1, 5, 6]
    assert str(rows["w"].dtype) == "Int64" and rows["n"].dtype == np.float64
    assert all(len(b) == 1 for b in res.batches)
    assert res.rejected[["line", "reason"]].values.tolist() == [
        [2, "column 'w': '2.5' is not an integer"],
        [3, "column 'age': 'x' is not an integer"],
        [4, "column 'sex': empty value (the column is declared non-empty)"],
        [7, "column 'sex': empty value (the column is declared non-empty)"],
    ]


def test_jsonl_with_bad_lines(tmp_path: Path) -> None:
    lines = [
        '{"id": 1, "name": "a", "tags": "x"}',
        '{"id": 2, "name": "b"}',
        '{"id": 3, "name": ',
        "",
        '{"id": "4", "name": true, "tags": null, "other": 1}',
        "[1, 2]",
        '{"id": 5.5, "name": "c"}',
        '{"id": 6, "name": {"nested": 1}}',
        '{"id": 7, "name": "d"} {"id": 8}',
        '{"id": 9, "name": "e", "tags": NaN}',
    ]
    path = write(tmp_path / "a.jsonl", "\n".join(lines) + "\n")
    spec = InputSpec(paths=(path,), format="jsonl", column_types={"id": "integer"}, split_bytes=60)
    assert inspect_input(spec) == ("id", "name", "tags")
    res = read(tmp_path, spec)
    rows = sorted_rows(res.rows, "id")
    assert rows["id"].tolist() == [1, 2, 4]
    assert rows["name"].tolist() == ["a", "b", "true"]
    assert rows["tags"].isna().tolist() == [False, True, True]
    rejected = res.rejected
    assert rejected["line"].tolist() == [3, 6, 7, 8, 9, 10]
    reasons = rejected["reason"].tolist()
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "not a JSON object (a list)"
    assert reasons[2] == "column 'id': '5.5' is not an integer"
    assert reasons[3] == "column 'name': nested JSON value (object or array)"
    assert reasons[4].startswith("invalid JSON") and reasons[5].startswith("invalid JSON")


# --------------------------------------------------------------------------- inspect_input


def expect_error(spec: InputSpec, *fragments: str) -> str:
    with pytest.raises(InputDataError) as info:
        inspect_input(spec)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_inspect_missing_unreadable_empty(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.csv")
    expect_error(InputSpec(paths=(missing,)), missing, "not found", "input.path")
    (tmp_path / "dir.csv").mkdir()
    expect_error(InputSpec(paths=(str(tmp_path / "dir.csv"),)), "cannot read")
    empty = write(tmp_path / "e.csv", "")
    expect_error(InputSpec(paths=(empty,)), empty, "empty (0 bytes)")
    blank = write(tmp_path / "b.csv", " \n\r\n\t\n")
    expect_error(InputSpec(paths=(blank,)), blank, "empty (only whitespace)")
    gz = tmp_path / "g.csv"
    gz.write_bytes(gzip.compress(b"a,b\n1,2\n"))
    expect_error(InputSpec(paths=(str(gz),)), "gzip")
    utf16 = write(tmp_path / "u.csv", "a,b\n1,2\n".encode("utf-16"))
    expect_error(InputSpec(paths=(utf16,)), "UTF-16", "iconv")
    expect_error(InputSpec(paths=(empty,), format="parquet"), "empty")
    notpq = write(tmp_path / "x.parquet", "a,b\n1,2\n")
    expect_error(InputSpec(paths=(notpq,), format="parquet"), "Parquet", "input.format")


def test_inspect_header_only(tmp_path: Path) -> None:
    one = write(tmp_path / "h.csv", "a,b\r\n  \r\n")
    expect_error(InputSpec(paths=(one,)), one, "header but no data rows")
    two = write(tmp_path / "h2.csv", "a,b")
    expect_error(InputSpec(paths=(one, two)), "no data rows in any input file", two)


def test_inspect_wrong_delimiter_message(tmp_path: Path) -> None:
    path = write(tmp_path / "adult.csv", "sex;age;race;education\nM;30;W;HS\n")
    message = expect_error(InputSpec(paths=(path,), required_columns=("age",)))
    assert message == (
        f"{path}: column 'age' not found; the header has 1 column 'sex;age;race;education' "
        "— the file looks ';'-delimited but input.delimiter is ','"
    )
    tabbed = write(tmp_path / "t.csv", "sex\tage\nM\t3\n")
    expect_error(
        InputSpec(paths=(tabbed,), delimiter=";", column_types={"age": "integer"}),
        "looks '\\t'-delimited but input.delimiter is ';'",
    )


def test_inspect_missing_column_suggests_close_name(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "Age,sex\n1,M\n")
    expect_error(
        InputSpec(paths=(path,), nonempty_columns=("age", "zip")),
        "columns 'age', 'zip' not found",
        "did you mean 'Age' for 'age'",
    )


def test_inspect_headers_differ_and_bom(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", "\ufeffx,y\n1,2\n")
    b = write(tmp_path / "b.csv", "x,z\n1,2\n")
    c = write(tmp_path / "c.csv", "y,x\n1,2\n")
    assert inspect_input(InputSpec(paths=(a,))) == ("x", "y")
    expect_error(InputSpec(paths=(a, b)), b, "differ from", "missing 'y'", "extra 'z'")
    expect_error(InputSpec(paths=(a, c)), "different order")


def test_inspect_header_not_utf8_and_other_header_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", b"na\xefve,b\n1,2\n")
    expect_error(InputSpec(paths=(path,)), "line 1", "UTF-8", "input.encoding, e.g. latin-1")
    assert inspect_input(InputSpec(paths=(path,), encoding="latin-1")) == ("naïve", "b")
    dup = write(tmp_path / "d.csv", "a,b,a\n1,2,3\n")
    expect_error(InputSpec(paths=(dup,)), "duplicate column name(s) 'a'")
    trailing = write(tmp_path / "t.csv", "a,b,\n1,2,\n")
    expect_error(InputSpec(paths=(trailing,)), "column 3 has an empty name")
    mac = write(tmp_path / "m.csv", "a,b\r1,2\r")
    expect_error(InputSpec(paths=(mac,)), "carriage return")


def test_inspect_jsonl_and_parquet(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", '{"b": 1, "a": 2}\n')
    b = write(tmp_path / "b.jsonl", '{"a": 1, "b": 2}\n')
    assert inspect_input(InputSpec(paths=(a, b), format="jsonl")) == ("b", "a")
    bad = write(tmp_path / "c.jsonl", "a,b\n")
    expect_error(InputSpec(paths=(bad,), format="jsonl"), "line 1 is not valid JSON")
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    expect_error(InputSpec(paths=(str(tmp_path / "e.parquet"),), format="parquet"), "no data rows")
    expect_error(
        InputSpec(paths=(str(tmp_path / "e.parquet"),), format="parquet", required_columns=("y",)),
        "column 'y' not found",
        "'x'",
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"batch_rows": 0}, "batch_rows"),
        ({"split_bytes": -1}, "split_bytes"),
        ({"header": False}, "column_names is required"),
        ({"column_names": ("a",)}, "column_names only applies"),
        ({"delimiter": ";;"}, "single ASCII character"),
        ({"delimiter": '"'}, "must differ"),
        ({"encoding": "utf-16"}, "not ASCII-compatible"),
        ({"encoding": "klingon"}, "unknown encoding"),
        ({"format": "xlsx"}, "not supported"),
        ({"column_types": {"a": "date"}}, "use string, integer or float"),
        ({"paths": ()}, "at least one input file"),
        ({"format": "jsonl", "multiline_records": True}, "only applies to CSV"),
    ],
)
def test_spec_config_errors(kwargs: dict[str, Any], fragment: str) -> None:
    args: dict[str, Any] = {"paths": ("x.csv",), **kwargs}
    with pytest.raises(ConfigError, match=None) as info:
        InputSpec(**args)
    assert fragment in str(info.value)


def test_spec_is_normalised_and_picklable() -> None:
    lists: dict[str, Any] = {"paths": ["a.csv"], "required_columns": ["x"]}  # YAML gives lists
    types: dict[str, Any] = {"x": "integer"}
    spec = InputSpec(**lists, column_types=types)
    types["x"] = "float"  # the spec keeps its own copy
    assert spec.paths == ("a.csv",) and spec.required_columns == ("x",)
    assert spec.column_types == {"x": "integer"}
    assert pickle.loads(pickle.dumps(spec)) == spec


# --------------------------------------------------------------------------- parallel pieces


def _mixed_csv(n: int) -> bytes:
    """Good rows among every kind of rejection the reader knows, CRLF and blank lines."""
    lines = [b"id,group,value"]
    for i in range(n):
        kind = i % 11
        if kind == 0:
            lines.append(f"{i},a,{i},extra".encode())  # ragged
        elif kind == 1:
            lines.append(f"{i},b,x{i}".encode())  # not an integer
        elif kind == 2:
            lines.append(b"")  # blank
        elif kind == 3:
            lines.append(f'{i},"quoted, with comma",{i}'.encode())
        elif kind == 4:
            lines.append(f"{i},caf\xe9,{i}".encode("latin-1"))  # invalid UTF-8
        elif kind == 5:
            lines.append(f"{i},c\rr,{i}".encode())  # bare carriage return
        elif kind == 6:
            lines.append(f'{i},"open,{i}'.encode())  # unbalanced quote
        elif kind == 7:
            lines.append(f"{i},,{i}".encode())  # empty non-empty column
        else:
            lines.append(f"{i},g{i % 5},{i}".encode())
    return b"\r\n".join(lines) + b"\r\n"


def _same_read(tmp_path: Path, serial: InputSpec, parallel: InputSpec) -> Result:
    one, many = read(tmp_path, serial), read(tmp_path, parallel)
    pd.testing.assert_frame_equal(sorted_rows(one.rows, "id"), sorted_rows(many.rows, "id"))
    key = ["line", "reason", "text"]
    pd.testing.assert_frame_equal(
        one.rejected.sort_values(key, ignore_index=True),
        many.rejected.sort_values(key, ignore_index=True),
    )
    return many


def test_parallel_pieces_give_the_serial_rows_and_rejections(tmp_path: Path) -> None:
    path = write(tmp_path / "mixed.csv", _mixed_csv(600))
    common: dict[str, Any] = {
        "paths": (path,),
        "column_types": {"id": "integer", "value": "integer"},
        "nonempty_columns": ("group",),
        "split_bytes": 2000,
    }
    serial = InputSpec(**common, parse_threads=1, piece_bytes=1 << 30)
    res = _same_read(tmp_path, serial, InputSpec(**common, parse_threads=3, piece_bytes=100))
    assert len(res.rows) > 200 and len(res.rejected) > 300
    assert len(res.batches) > 3 * (Path(path).stat().st_size // 2000)  # several pieces a split
    reasons = " ".join(res.rejected["reason"])
    for what in ("expected 3 fields", "not an integer", "invalid UTF-8", "carriage return"):
        assert what in reasons
    text = Path(path).read_bytes().split(b"\r\n")
    rej = res.rejected
    for line, why, raw in zip(rej["line"], rej["reason"], rej["text"], strict=True):
        if "UTF-8" not in why and "\r" not in raw:
            assert text[line - 1].decode("utf-8") == raw  # true physical line numbers


def test_parallel_multiline_chunks_and_jsonl_match_serial(tmp_path: Path) -> None:
    rows = [f'{i},"two\nlines {i}",{i}' if i % 3 else f"{i},x,{i}" for i in range(300)]
    rows[50] = '50,"unbalanced,50'
    path = write(tmp_path / "ml.csv", "id,text,value\n" + "\n".join(rows) + "\n")
    common: dict[str, Any] = {
        "paths": (path,),
        "multiline_records": True,
        "column_types": {"id": "integer"},
        "split_bytes": 300,
    }
    _same_read(tmp_path, InputSpec(**common, parse_threads=1), InputSpec(**common, parse_threads=4))
    lines = [
        f'{{"id": {i}, "v": "{i}"}}' if i % 7 != 3 else f'{{"id": {i}, "v": ' for i in range(400)
    ]
    jpath = write(tmp_path / "a.jsonl", "\n".join(lines) + "\n")
    jcommon: dict[str, Any] = {"paths": (jpath,), "format": "jsonl", "split_bytes": 1500}
    res = _same_read(
        tmp_path,
        InputSpec(**jcommon, parse_threads=1, piece_bytes=1 << 30),
        InputSpec(**jcommon, parse_threads=2, piece_bytes=64),
    )
    assert len(res.rejected) == len(range(3, 400, 7))


def test_pieces_cut_at_line_ends_with_their_line_numbers() -> None:
    from privpipe.transforms.io import _pieces

    buf = b"".join(f"line {i}\n".encode() for i in range(1, 200))
    pieces = _pieces(buf, 1000, 5, 64)
    assert len(pieces) > 10 and b"".join(p for p, _, _ in pieces) == buf
    for view, offset, line in pieces:
        piece = bytes(view)  # views of the buffer, not copies
        assert piece.endswith(b"\n") and buf[offset - 1000 :].startswith(piece)
        assert piece.startswith(f"line {line - 4}\n".encode())
    assert _pieces(b"a\nb", 0, 1, 1) == [(b"a\n", 0, 1), (b"b", 2, 2)]
    with pytest.raises(ConfigError, match="parse_threads"):
        InputSpec(paths=("x.csv",), parse_threads=-1)


def _leaf_labels(spec: InputSpec) -> list[str]:
    from apache_beam.pipeline import PipelineVisitor

    p = beam.Pipeline()
    _ = p | "Read" >> ReadMicrodata(spec)
    labels: list[str] = []

    class Leaves(PipelineVisitor):  # type: ignore[misc]
        def visit_transform(self, node: Any) -> None:
            labels.append(node.full_label)

    p.visit(Leaves())
    return labels


def test_a_single_split_read_has_no_shuffle_or_newline_count(tmp_path: Path) -> None:
    """One split: no Reshuffle and no newline-count side input (a fixed cost of every small
    run); several splits keep both (rows spread over workers, global line numbers)."""
    text = "id,score\n" + "".join(f"{i},{i / 2}\n" for i in range(40))
    path = write(tmp_path / "a.csv", text)
    one = _leaf_labels(InputSpec(paths=(path,)))
    assert not [x for x in one if "Distribute" in x or "CountNewlines" in x]
    many = _leaf_labels(InputSpec(paths=(path,), split_bytes=64))
    assert [x for x in many if "Distribute" in x] and [x for x in many if "CountNewlines" in x]
    assert len(one) < len(many) - 5


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab,\r", max_size=12), min_size=1, max_size=30),
    final_newline=st.booleans(),
    split_bytes=st.integers(1, 40),
)
def test_each_split_holds_the_lines_starting_in_it_once_with_their_line_numbers(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[str],
    final_newline: bool,
    split_bytes: int,
) -> None:
    """``_aligned`` of every byte range of a file: the bytes of the lines that start in
    it (the header skipped), whole, in order, from the offset it reports, and the first
    line's number; together they are the file after its header, each line once."""
    from privpipe.transforms.io import _ReadTextSplitFn, _text_splits

    raw = ("h\n" + "\n".join(lines) + ("\n" if final_newline else "")).encode()
    path = tmp_path_factory.mktemp("splits") / "a.csv"
    path.write_bytes(raw)
    spec = InputSpec(paths=(str(path),), split_bytes=split_bytes)
    fn = _ReadTextSplitFn(spec, ("h",))
    pieces = []
    with open(path, "rb") as f:
        for _, _, start, end, _ in _text_splits(str(path), len(raw), spec):
            got = fn._aligned(f, start, end, raw[:start].count(b"\n"))
            if got is None:
                assert b"\n" not in raw[max(start - 1, 0) : end - 1]
                continue
            data, first, line = got
            assert raw[first : first + len(data)] == data
            assert first == 0 or raw[first - 1 : first] == b"\n"
            assert not data or data.endswith(b"\n") or first + len(data) == len(raw)
            assert line == 1 + raw[:first].count(b"\n") or (start == 0 and first == 2)
            pieces.append(data)
    assert b"".join(pieces) == raw[2:]
