"""The recoding's rows from the frequency table (``transforms.expand``) instead of a second
read: the same rows, as categoricals over values typed as the read types them, and the same
published tables."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.transforms.anonymize import FrequencyTable, hash_units
from privpipe.transforms.expand import _ExpandFn
from privpipe.transforms.io import read_dtype
from tests.layout import internal_file, release_dir
from tests.test_runners import demo_plan, without_holdout, without_report

TYPES: dict[str, Any] = {"s": "string", "i": "integer", "f": "float"}


def _read_like(s: list[str | None], i: list[int | None], f: list[float | None]) -> pd.DataFrame:
    """A batch as the read emits it: string, Int64 and float64 columns, and a person id."""
    n = len(s)
    return pd.DataFrame(
        {
            "s": pd.array(s, dtype=read_dtype("string")),
            "i": pd.array(i, dtype=read_dtype("integer")),
            "f": np.array([np.nan if v is None else v for v in f], dtype=read_dtype("float")),
            "pid": pd.array([f"p{j % 7}" for j in range(n)], dtype=read_dtype("string")),
        }
    )


def _table(batches: list[pd.DataFrame]) -> pd.DataFrame:
    fn = FrequencyTable(["s", "i", "f", "pid"], categorical=True, hashed=["pid"])
    acc = fn.create_accumulator()
    for b in batches:
        acc = fn.add_input(acc, b)
    return fn.extract_output(acc)


def _sorted(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    return sorted(tuple(str(v) for v in row) for row in frame.astype(object).itertuples(False))


rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from(["a", "b", "é", "1", ""])),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, 37])),
        st.one_of(
            st.none(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from([0.1, 2.5, 1e-7]),
        ),
    ),
    min_size=0,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(rows=rows, batch_rows=st.integers(1, 9), repeat=st.integers(1, 4))
def test_the_rows_of_a_table_are_the_rows_it_counted(
    rows: list[tuple[Any, Any, Any]], batch_rows: int, repeat: int
) -> None:
    rows = rows * repeat  # counts above one, and above the batch size
    s, i, f = ([r[k] for r in rows] for k in range(3))
    read = _read_like(s, i, f)
    table = _table([read.iloc[:5], read.iloc[5:]])
    batches = list(_ExpandFn(["s", "i", "f", "pid"], TYPES, batch_rows).process(table))
    sizes = [len(b) for b in batches]
    assert sum(sizes) == len(read)
    assert all(n == batch_rows for n in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= batch_rows)
    expected = hash_units(read, "pid")  # the table carries the person id's hash
    if not batches:
        assert read.empty
        return
    out = pd.concat(batches, ignore_index=True)
    assert out["pid"].dtype == expected["pid"].dtype
    for c in ["s", "i", "f"]:  # categoricals over values typed as read
        assert isinstance(out[c].dtype, pd.CategoricalDtype), c
        assert out[c].cat.categories.dtype == expected[c].dtype, c
        # the values by code: pandas' Categorical.astype("Int64") with a missing value
        # goes through float64 (-9007199254740993 came back ...992), not the expansion
        values = out[c].cat.categories.array.take(out[c].cat.codes.to_numpy(), allow_fill=True)
        out[c] = pd.Series(values, index=out.index, name=c)
        assert out[c].dtype == expected[c].dtype, c
    # -0.0 and 0.0 are one value to the frequency table (as to every verifier)
    expected["f"] = expected["f"].where(expected["f"] != 0, 0.0)
    out["f"] = out["f"].where(out["f"] != 0, 0.0)
    assert _sorted(out) == _sorted(expected)


def test_a_count_far_above_the_batch_size_is_cut_into_batches() -> None:
    read = _read_like(["a"] * 10, [1] * 10, [0.5] * 10)
    read["pid"] = "p"
    table = _table([read])
    assert len(table) == 1 and int(table["count"].iloc[0]) == 10
    sizes = [len(b) for b in _ExpandFn(["s", "i", "f", "pid"], TYPES, 4).process(table)]
    assert sizes == [4, 4, 2]


def test_an_empty_table_gives_no_batch() -> None:
    table = _table([])
    assert list(_ExpandFn(["s", "i", "f", "pid"], TYPES, 4).process(table)) == []


# --------------------------------------------------------------------------- whole runs

ROWS = 3_000


def _labels(plan: Any, out: Path, recode_from_tables: bool) -> set[str]:
    from privpipe.pipelines.continual_release import continual_jobs
    from privpipe.pipelines.dp_release import dp_jobs
    from privpipe.pipelines.local_release import local_jobs
    from privpipe.pipelines.output import RunOutput, new_run_id
    from privpipe.pipelines.run import build_graph, pipeline_options
    from privpipe.transforms.io import inspect_input

    spec = plan.input_spec()
    p = beam.Pipeline(options=pipeline_options([], None))
    build_graph(
        p, spec, inspect_input(spec), plan, RunOutput(out, new_run_id()),
        dp_jobs(plan), None, local_jobs(plan), continual_jobs(plan), "0" * 64, None, True,
        recode_from_tables,
    )  # fmt: skip
    proto = p.to_runner_api()
    return {t.unique_name for t in proto.components.transforms.values()}


ANONYMISED = ("k5", "l3", "t03", "mondrian5")  # the releases whose rows are recoded


def _plan(
    out: Path, data: Path, output_format: str = "csv", only: tuple[str, ...] | None = None
) -> Any:
    plan = demo_plan(out, data, only)
    output = plan.config.output.model_copy(update={"format": output_format})
    return dataclasses.replace(plan, config=plan.config.model_copy(update={"output": output}))


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from privpipe.pipelines.demo_data import write_csv

    return write_csv(tmp_path_factory.mktemp("demo") / "demo.csv", ROWS)


def test_a_runner_in_this_process_reads_the_file_once(tmp_path: Path, demo_data: Path) -> None:
    plan = _plan(tmp_path / "out", demo_data)
    from_tables = _labels(plan, tmp_path / "a", True)
    again = _labels(plan, tmp_path / "b", False)
    assert not any("ReadAgain" in t for t in from_tables)
    assert any(t.startswith("Rows[") for t in from_tables)
    # t=0.3, planned ahead: its search's worker expands the table and publishes it there
    assert not any(t.startswith(("RowsAhead[", "Release[t03]")) for t in from_tables)
    assert "AwaitPlan[t03]" in from_tables
    assert any("ReadAgain/" in t for t in again) and any("ReadAgainAhead/" in t for t in again)
    assert not any(t.startswith("Rows[") for t in again)
    assert "Release[t03]" in again  # read again: published by this graph


def _published(out: Path, name: str, output_format: str) -> tuple[list[str], list[tuple]]:
    folder = release_dir(out, name)
    if output_format == "parquet":
        table = pq.read_table(folder / "data.parquet")
        schema = [f"{f.name}:{f.type}" for f in table.schema]
        return schema, sorted(tuple(r.values()) for r in table.to_pylist())
    lines = (folder / "data.csv").read_text().splitlines()
    return lines[:1], sorted(lines[1:])


@pytest.mark.slow
@pytest.mark.parametrize("output_format", ["csv", "parquet"])
def test_tables_recoded_from_the_frequency_table_equal_those_of_a_second_read(
    tmp_path: Path, demo_data: Path, monkeypatch: pytest.MonkeyPatch, output_format: str
) -> None:
    """The same rows, columns, types and figures as when the rows are read again (the
    demo without its holdout, whose fresh key per run holds out other persons)."""
    import privpipe.pipelines.run as run_module

    build = run_module.build_graph
    outs = {}
    for from_tables in (True, False):

        def build_graph(*args: Any, _flag: bool = from_tables, **kwargs: Any) -> Any:
            return build(*args, **kwargs, recode_from_tables=_flag)

        monkeypatch.setattr(run_module, "build_graph", build_graph)
        out = tmp_path / str(from_tables)
        plan = without_report(without_holdout(_plan(out, demo_data, output_format, ANONYMISED)))
        run_module.run(plan, log=lambda _m: None)
        outs[from_tables] = out
    manifests = [
        json.loads(internal_file(outs[flag], "manifest.json").read_text()) for flag in (True, False)
    ]
    assert manifests[0]["releases"] == manifests[1]["releases"]
    for name in ANONYMISED:
        ours = _published(outs[True], name, output_format)
        assert ours == _published(outs[False], name, output_format), name
        assert len(ours[1]) > ROWS // 2
