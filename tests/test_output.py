"""The staged output folder: public/ and internal/ are published whole or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from privpipe.errors import OutputBusy, OutputError
from privpipe.pipelines.output import STAGING_PREFIX, WORK_PREFIX, RunOutput, recover


def _stage(out: RunOutput, manifest: str, releases: tuple[str, ...]) -> None:
    (out.internal / "manifest.json").write_text(manifest)
    for name in releases:
        (out.releases / name).mkdir(parents=True)
        (out.releases / name / "data.csv").write_text(name)


def test_commit_replaces_public_and_internal_and_keeps_others(tmp_path: Path) -> None:
    (tmp_path / "public" / "stale").mkdir(parents=True)
    (tmp_path / "internal").mkdir()
    (tmp_path / "internal" / "manifest.json").write_text("old")
    (tmp_path / "ledger.sqlite").write_text("keep me")  # a ledger beside the run's output
    (tmp_path / "input").mkdir()
    out = RunOutput(tmp_path, "r1", work_dir=tmp_path.parent / "scratch")
    _stage(out, "new", ("k5", "dp"))
    (out.work / "attack_targets.parquet").write_text("row-level")
    work = out.work
    out.arrange(["k5"])
    names = out.commit()
    assert names == ["public", "internal"]
    assert sorted(os.listdir(tmp_path / "public")) == ["k5"]  # replaced whole, no stale mix
    assert sorted(os.listdir(tmp_path / "internal" / "candidates")) == ["dp"]
    assert (tmp_path / "internal" / "manifest.json").read_text() == "new"
    assert (tmp_path / "ledger.sqlite").read_text() == "keep me"
    assert not any(n.startswith(".privpipe") for n in os.listdir(tmp_path))
    assert not work.exists()  # the scratch folder is gone


def test_empty_publication_leaves_no_stale_release(tmp_path: Path) -> None:
    (tmp_path / "public" / "old").mkdir(parents=True)
    out = RunOutput(tmp_path, "r1")
    _stage(out, "m", ())
    out.commit()
    assert os.listdir(tmp_path / "public") == []


def test_scratch_folder_is_private_and_outside_the_output(tmp_path: Path) -> None:
    out = RunOutput(tmp_path / "o", "r2", work_dir=tmp_path / "w")
    assert out.work.parent == tmp_path / "w" and out.work.name.startswith(WORK_PREFIX)
    assert stat.S_IMODE(out.work.stat().st_mode) == 0o700
    assert stat.S_IMODE(out.staging.stat().st_mode) == 0o700
    out.abort()
    assert not out.work.exists() and not out.staging.exists()


def test_abort_leaves_earlier_output_untouched(tmp_path: Path) -> None:
    (tmp_path / "internal").mkdir()
    (tmp_path / "internal" / "manifest.json").write_text("old")
    before = sorted(os.listdir(tmp_path))
    out = RunOutput(tmp_path, "r2")
    (out.internal / "manifest.json").write_text("half-written")
    out.abort()
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "internal" / "manifest.json").read_text() == "old"


def test_dead_runs_are_cleaned_and_a_live_one_holds_the_folder(tmp_path: Path) -> None:
    """A killed run's staging (row-level files included) goes; while a run lives, a second
    run into the same folder is refused (OutputBusy) and touches nothing."""
    dead = tmp_path / f"{STAGING_PREFIX}dead"
    (dead / "internal").mkdir(parents=True)
    (dead / "internal" / "rejected.csv").write_text("raw row")
    (tmp_path / ".privpipe-previous-gone").mkdir()
    live = RunOutput(tmp_path, "live")
    names = os.listdir(tmp_path)
    assert f"{STAGING_PREFIX}dead" not in names and ".privpipe-previous-gone" not in names
    assert any("stopped before publishing" in n for n in live.notes)
    with pytest.raises(OutputBusy, match="another privpipe run is writing"):
        RunOutput(tmp_path, "other")
    assert live.staging.is_dir() and not (tmp_path / f"{STAGING_PREFIX}other").exists()
    live.abort()
    RunOutput(tmp_path, "other").abort()  # the lock went with the live run


def test_commit_killed_between_renames_is_rolled_forward(tmp_path: Path) -> None:
    """kill -9 after the old public/ moved aside but before the new one moved in: the next
    run finishes the swap, so public/ and internal/ come from one run."""
    (tmp_path / "public" / "old").mkdir(parents=True)
    (tmp_path / "internal").mkdir()
    (tmp_path / "internal" / "manifest.json").write_text("old")
    staging = tmp_path / f"{STAGING_PREFIX}k"
    (staging / "public" / "new").mkdir(parents=True)
    (staging / "internal").mkdir()
    (staging / "internal" / "manifest.json").write_text("new")
    (staging / ".ready").write_text("k")
    previous = tmp_path / ".privpipe-previous-k"
    previous.mkdir()
    os.replace(tmp_path / "public", previous / "public")  # the kill came here
    recover(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["internal", "public"]
    assert os.listdir(tmp_path / "public") == ["new"]
    assert (tmp_path / "internal" / "manifest.json").read_text() == "new"


def test_unready_staging_of_a_dead_run_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "public" / "old").mkdir(parents=True)
    staging = tmp_path / f"{STAGING_PREFIX}x"
    (staging / "public" / "new").mkdir(parents=True)
    recover(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["public"]
    assert os.listdir(tmp_path / "public") == ["old"]


def test_staging_is_inside_output_dir(tmp_path: Path) -> None:
    out = RunOutput(tmp_path / "new" / "nested", "r3")
    assert out.staging.parent == tmp_path / "new" / "nested"
    assert out.staging.name == f"{STAGING_PREFIX}r3"
    out.abort()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; see the file test")
def test_unwritable_dir_is_an_output_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(OutputError, match="not writable"):
        RunOutput(ro, "r4")


def test_output_path_that_is_a_file_is_an_output_error(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputError) as e:
        RunOutput(f, "r5")
    assert e.value.exit_code == 2
    assert "choose another folder with --output or output.dir" in str(e.value)


def test_a_pre_boundary_run_output_is_removed(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"privpipe_version": "0.1"}')
    (tmp_path / "releases" / "k5").mkdir(parents=True)
    (tmp_path / "rejected.csv").write_text("file,line,reason")
    (tmp_path / "notes.txt").write_text("mine")
    out = RunOutput(tmp_path, "r6")
    out.commit()
    assert sorted(os.listdir(tmp_path)) == ["internal", "notes.txt", "public"]
