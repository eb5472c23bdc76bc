"""transforms.sink: WriteTable (CSV/Parquet, sharded then merged) and write_json."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

from privpipe.transforms.io import InputSpec, ReadMicrodata
from privpipe.transforms.sink import WriteTable, concat_local, write_json
from tests.beamtest import local_pipeline

COLUMNS = ("id", "name", "age", "score")


def batches() -> list[pd.DataFrame]:
    """Three batches with awkward values; the last has its columns in another order."""
    string = pd.StringDtype("pyarrow")
    first = pd.DataFrame(
        {
            "id": pd.array(["1", "2", "3"], dtype=string),
            "name": pd.array(['Smith, "J."', None, "multi\nline"], dtype=string),
            "age": pd.array([30, None, 41], dtype="Int64"),
            "score": [1.5, np.nan, 0.1],
        }
    )
    second = pd.DataFrame(
        {
            "id": pd.array(["4"], dtype=string),
            "name": pd.array(["NA"], dtype=string),
            "age": pd.array([7], dtype="Int64"),
            "score": [2.0],
        }
    )
    third = pd.DataFrame(
        {
            "score": [3.25, 4.0],
            "age": pd.array([None, 8], dtype="Int64"),
            "name": pd.array(["Zoë", "x;y"], dtype=string),
            "id": pd.array(["5", "6"], dtype=string),
        }
    )
    return [first, second, pd.DataFrame({c: first[c].iloc[:0] for c in COLUMNS}), third]


def expected() -> pd.DataFrame:
    frame = pd.concat([b[list(COLUMNS)] for b in batches()], ignore_index=True)
    return frame.sort_values("id", ignore_index=True)


def run_write(
    frames: list[pd.DataFrame],
    directory: Path,
    fmt: Literal["csv", "parquet"],
    delimiter: str = ",",
) -> None:
    final = str(directory / f"table.{fmt}")
    with local_pipeline() as p:
        paths = (
            p
            | beam.Create(frames, reshuffle=False)
            | WriteTable(str(directory), "table", COLUMNS, format=fmt, delimiter=delimiter)
        )
        assert_that(paths, equal_to([final]))


def test_csv_round_trip(tmp_path: Path) -> None:
    run_write(batches(), tmp_path, "csv", delimiter=";")
    text = (tmp_path / "table.csv").read_text(encoding="utf-8")
    assert text.startswith("id;name;age;score\n")
    assert '"Smith, ""J."""' in text and '"x;y"' in text
    back = pd.read_csv(tmp_path / "table.csv", sep=";", dtype=str, keep_default_na=False)
    back = back.sort_values("id", ignore_index=True)
    want = expected()
    assert back["name"].tolist() == [
        "" if pd.isna(v) else v for v in want["name"]
    ]  # missing -> empty field; "NA" stays "NA"
    assert back["age"].tolist() == ["30", "", "41", "7", "", "8"]
    assert [float(v) if v else math.nan for v in back["score"]] == pytest.approx(
        want["score"].tolist(), nan_ok=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv"]  # shards + temp gone


def test_parquet_round_trip(tmp_path: Path) -> None:
    run_write(batches(), tmp_path, "parquet")
    back = pd.read_parquet(tmp_path / "table.parquet").sort_values("id", ignore_index=True)
    assert list(back.columns) == list(COLUMNS)
    want = expected()
    assert back["name"].isna().tolist() == want["name"].isna().tolist()
    assert back["name"].dropna().tolist() == want["name"].dropna().tolist()
    assert back["age"].astype("Int64").tolist() == want["age"].tolist()
    assert np.allclose(back["score"], want["score"], equal_nan=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.parquet"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_empty_input_writes_header_only(tmp_path: Path, fmt: Literal["csv", "parquet"]) -> None:
    run_write([], tmp_path, fmt)
    path = tmp_path / f"table.{fmt}"
    if fmt == "csv":
        assert path.read_text() == "id,name,age,score\n"
    else:
        table = pq.read_table(path)
        assert table.num_rows == 0 and table.column_names == list(COLUMNS)
        assert all(str(t) == "string" for t in table.schema.types)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_batch_with_wrong_columns_raises(tmp_path: Path) -> None:
    bad = batches()[0].drop(columns=["age"]).assign(extra=1)
    with pytest.raises(Exception, match=r"missing \['age'\], extra \['extra'\]"):
        run_write([bad], tmp_path, "csv")


def test_read_then_write_end_to_end(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    lines = ["k,v"] + [f"k{i},{i}" for i in range(50)] + ["bad"]
    source.write_text("\r\n".join(lines) + "\r\n")
    spec = InputSpec(
        paths=(str(source),), split_bytes=64, batch_rows=8, column_types={"v": "integer"}
    )
    out = tmp_path / "out"
    with local_pipeline() as p:
        read = p | ReadMicrodata(spec)
        read["batches"] | "Rows" >> WriteTable(str(out), "rows", ("k", "v"))
        read["rejected"] | "Rejected" >> WriteTable(
            str(out), "rejected", ("file", "line", "reason", "text")
        )
    rows = pd.read_csv(out / "rows.csv")
    assert sorted(rows["v"]) == list(range(50))
    rejected = pd.read_csv(out / "rejected.csv")
    assert rejected[["line", "reason"]].values.tolist() == [[52, "expected 2 fields, saw 1"]]
    assert sorted(p.name for p in out.iterdir()) == ["rejected.csv", "rows.csv"]


def shard_files(folder: Path) -> tuple[list[str], bytes]:
    """Four shards (one empty, one of 3 MB: several kernel copies) and their bytes in turn."""
    folder.mkdir()
    contents = [b"a,1\n" * 1000, b"", bytes(range(256)) * 12_288, b'"x, y",2\n']
    paths = []
    for i, data in enumerate(contents):
        (folder / f"{i:06d}.csv").write_bytes(data)
        paths.append(str(folder / f"{i:06d}.csv"))
    return paths, b"".join(contents)


def test_local_shards_are_concatenated_by_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header, then every shard in order, byte for byte, into a folder made if missing;
    the shards' bytes go through os.copy_file_range (several calls for the 3 MB shard)."""
    paths, body = shard_files(tmp_path / "shards")
    calls: list[int] = []
    copy = os.copy_file_range

    def counted(*args: Any) -> int:
        calls.append(copy(*args))
        return calls[-1]

    monkeypatch.setattr(os, "copy_file_range", counted)
    out = tmp_path / "new" / "table.csv"
    concat_local(str(out), b"h1,h2\n", paths)
    assert out.read_bytes() == b"h1,h2\n" + body
    assert sum(calls) == len(body) and len([c for c in calls if c]) >= 3


@pytest.mark.parametrize("fails_after", [0, 1])
def test_local_concatenation_falls_back_where_the_kernel_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_after: int
) -> None:
    """os.copy_file_range refused at once, or after a first piece: the rest of that shard
    and the next ones are copied by reading them, with the same bytes."""
    paths, body = shard_files(tmp_path / "shards")
    copy = os.copy_file_range
    done: list[int] = []

    def refusing(src: int, dst: int, count: int) -> int:
        if len(done) >= fails_after:
            raise OSError(errno.EXDEV, "not here")
        done.append(copy(src, dst, min(count, 100)))
        return done[-1]

    monkeypatch.setattr(os, "copy_file_range", refusing)
    out = tmp_path / "table.csv"
    concat_local(str(out), b"head\n", paths)
    assert out.read_bytes() == b"head\n" + body


def test_local_concatenation_keeps_the_order_when_the_kernel_refuses_one_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first shard copied by reading, the next ones by the kernel again: what was read
    is in the file before the kernel writes behind it (nothing left in a buffer)."""
    paths, body = shard_files(tmp_path / "shards")
    copy = os.copy_file_range
    refused = os.open(paths[0], os.O_RDONLY)  # the inode the kernel refuses
    inode = os.fstat(refused).st_ino
    os.close(refused)

    def refusing_one(src: int, dst: int, count: int) -> int:
        if os.fstat(src).st_ino == inode:
            raise OSError(errno.EXDEV, "not this one")
        return copy(src, dst, count)

    monkeypatch.setattr(os, "copy_file_range", refusing_one)
    out = tmp_path / "table.csv"
    concat_local(str(out), b"head\n", paths)
    assert out.read_bytes() == b"head\n" + body


def test_write_json(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "release.json"
    doc = {"name": "k5", "b": 1, "a": [np.int64(3), np.float64(0.5)], "ok": np.bool_(True)}
    write_json(str(path), doc)
    text = path.read_text()
    assert text.endswith("\n") and text.index('"b"') < text.index('"a"')  # insertion order
    assert json.loads(text) == {"name": "k5", "b": 1, "a": [3, 0.5], "ok": True}
    assert text.startswith('{\n  "name"')  # indent=2
    with pytest.raises(ValueError):
        write_json(str(path), {"eps": float("nan")})
    with pytest.raises(TypeError):
        write_json(str(path), {"x": object()})
    assert json.loads(path.read_text())["name"] == "k5"  # the old file is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["release.json"]  # no temp left
