"""transforms.driver_read: the driver-side read gives the rows, types and rejections (with
file-global line numbers) of the Beam read, on several splits, CSV and Parquet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from privpipe.transforms.driver_read import DriverRead
from privpipe.transforms.io import InputSpec
from tests.test_io import read, sorted_rows, write


def test_same_rows_types_and_rejections_as_the_beam_read(tmp_path: Path) -> None:
    lines = ["id,age,city"]
    for i in range(60):
        age = "x" if i in (7, 41) else str(20 + i)  # two rows rejected, in different splits
        lines.append(f"p{i},{age},c{i % 3}")
    lines.insert(30, "p99,1")  # a short row
    spec = InputSpec(
        paths=(write(tmp_path / "a.csv", "\n".join(lines) + "\n"),),
        split_bytes=120,
        batch_rows=7,
        column_types={"age": "integer"},
    )
    beam_read = read(tmp_path, spec)
    driver = DriverRead(spec)
    batches = list(driver.batches())
    assert max(len(b) for b in batches) <= 7 and len(batches) > 3
    got = sorted_rows(pd.concat(batches, ignore_index=True), "id")
    pd.testing.assert_frame_equal(got, sorted_rows(beam_read.rows, "id"))
    assert str(got["age"].dtype) == "Int64"
    assert driver.rows == len(got) == 58 and driver.rejected == 3
    mine = driver.rejected_rows().sort_values("line", ignore_index=True)
    theirs = beam_read.rejected.sort_values("line", ignore_index=True)
    pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
    assert mine["line"].tolist() == [9, 31, 44]  # file lines, not lines of a split


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    table = pa.table({"id": [f"p{i}" for i in range(50)], "age": [str(i) for i in range(50)]})
    pq.write_table(table, path, row_group_size=20)
    spec = InputSpec(paths=(str(path),), format="parquet", column_types={"age": "integer"})
    rows = pd.concat(list(DriverRead(spec).batches()), ignore_index=True)
    assert rows["age"].tolist() == list(range(50)) and str(rows["age"].dtype) == "Int64"
