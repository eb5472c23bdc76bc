"""Several DP releases aggregated in one Beam step give each release the cells it gets alone."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pandas as pd
import pytest

from privpipe.pipelines.dp_release import dp_jobs
from privpipe.pipelines.hierarchies import HierarchyLabeler
from privpipe.pipelines.plan import load_plan
from privpipe.transforms.dp_aggregate import AggregateDPCells, DPCellsJob, load_cells
from tests.beamtest import local_pipeline
from tests.test_dp_pipeline import DPProject


def _aggregate(
    project: DPProject,
    names: list[str],
    folder: Path,
    seed: int,
    spill: str | None = None,
    spill_after: int = 0,
) -> dict[str, dict]:
    plan = load_plan(project.config)
    jobs = {j.name: j for j in dp_jobs(plan)}
    labeler = HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)
    cells = [
        DPCellsJob(jobs[n].spec, tuple(jobs[n].plans), str(folder / f"{n}.pickle")) for n in names
    ]
    frame = project.frame.astype({"salary": "Int64"})
    batches = [frame.iloc[i : i + 200].reset_index(drop=True) for i in range(0, len(frame), 200)]
    with local_pipeline() as p:
        _ = (
            p
            | beam.Create(batches)
            | AggregateDPCells(cells, labeler, seed, shards=4, spill=spill, spill_after=spill_after)
        )
    return {n: load_cells(folder / f"{n}.pickle") for n in names}


@pytest.mark.slow
def test_releases_in_one_step_equal_each_release_alone(tmp_path: Path) -> None:
    project = DPProject(tmp_path, persons=400, visits=4)
    project.cfg["releases"].append(
        {"name": "zips", "kind": "dp_count", "epsilon": 0.5, "delta": 1e-6, "group_by": ["zip"],
         "max_partitions": 1, "max_contributions_per_partition": 2}  # binds: rows are dropped
    )  # fmt: skip
    project.cfg["releases"].append(
        {"name": "pay", "kind": "dp_sum", "epsilon": 0.5, "value": "salary",
         "bounds": [0, 100000], "group_by": ["disease"], "max_partitions": 1}
    )  # fmt: skip
    project.save()
    names = ["hist", "zips", "pay"]
    (tmp_path / "together").mkdir()
    together = _aggregate(project, names, tmp_path / "together", seed=11)
    for name in names:
        (tmp_path / name).mkdir()
        alone = _aggregate(project, [name], tmp_path / name, seed=11)[name]
        mine = together[name]
        assert len(mine["partials"]) == len(alone["partials"]) >= 1
        for a, b in zip(mine["partials"], alone["partials"], strict=True):
            assert (a.query, a.rows_in, a.rows_kept) == (b.query, b.rows_in, b.rows_kept)
            assert a.rows_in > 0
            pd.testing.assert_frame_equal(a.cells.sort_index(), b.cells.sort_index())
        for a, b in zip(mine["dictionaries"], alone["dictionaries"], strict=True):
            pd.testing.assert_frame_equal(a.sort_index(), b.sort_index())
    # the bounds bind differently per release: the step did not mix them up
    zips, hist = together["zips"]["partials"][0], together["hist"]["partials"][0]
    assert zips.rows_kept <= 2 * 400 < hist.rows_kept


@pytest.mark.slow
def test_spilled_shards_give_the_cells_grouped_in_memory_give(tmp_path: Path) -> None:
    """``spill``: the shards travel as files in a private folder, only their paths are
    grouped; the bounded cells are those of the in-memory grouping (same seed)."""
    project = DPProject(tmp_path, persons=300, visits=4)
    names = [j.name for j in dp_jobs(load_plan(project.config))]
    (tmp_path / "memory").mkdir()
    (tmp_path / "spilled").mkdir()
    spill = tmp_path / "work" / "dp"
    memory = _aggregate(project, names, tmp_path / "memory", seed=5)
    spilled = _aggregate(project, names, tmp_path / "spilled", seed=5, spill=str(spill))
    every = sum(f.stat().st_size for f in spill.iterdir())  # bytes spilled
    assert every > 0 and oct(spill.stat().st_mode & 0o777) == "0o700"
    # past spill_after bytes only: the first pieces travel in memory, the rest as files
    (tmp_path / "mixed").mkdir()
    some = tmp_path / "work" / "some"
    mixed = _aggregate(
        project, names, tmp_path / "mixed", seed=5, spill=str(some), spill_after=20_000
    )
    assert 0 < sum(f.stat().st_size for f in some.iterdir()) < every
    for name in names:
        for other in (spilled, mixed):
            for a, b in zip(memory[name]["partials"], other[name]["partials"], strict=True):
                assert (a.query, a.rows_in, a.rows_kept) == (b.query, b.rows_in, b.rows_kept)
                pd.testing.assert_frame_equal(a.cells.sort_index(), b.cells.sort_index())


def test_shards_follow_the_input_size() -> None:
    from privpipe.transforms.dp_aggregate import MIN_SHARDS, SHARDS, shards_for

    mb = 1 << 20
    assert shards_for(None) == SHARDS  # unknown (remote input): the most
    assert shards_for(0) == shards_for(4 * mb) == shards_for(20 * mb) == MIN_SHARDS == 4
    assert shards_for(85 * mb) == 11  # the demo's 1M rows
    assert shards_for(851 * mb) == SHARDS == 16  # its 10M rows


def test_the_input_size_is_known_only_when_every_input_is_local(tmp_path: Path) -> None:
    from privpipe.pipelines.plan import input_size, input_stamps

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x\n1\n")
    b.write_text("x\n22\n")
    local = (str(a), str(b))
    assert input_size(input_stamps(local), local) == 4 + 5
    remote = (str(a), "gs://bucket/c.csv")  # not stat-able here: size unknown
    assert input_size(input_stamps(remote), remote) is None
