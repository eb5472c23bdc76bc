"""The staged output folder: a run is published whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.output import STAGING_PREFIX, RunOutput
from privpipe.errors import OutputError


def test_commit_replaces_entries_and_keeps_others(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("old")
    (tmp_path / "releases" / "stale").mkdir(parents=True)
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "demo.csv").write_text("keep me")
    out = RunOutput(tmp_path, "r1")
    (out.staging / "manifest.json").write_text("new")
    (out.staging / "releases" / "k5").mkdir(parents=True)
    (out.work / "internal.json").write_text("secret counts")
    names = out.commit()
    assert names == ["manifest.json", "releases"]
    assert (tmp_path / "manifest.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path / "releases")) == ["k5"]  # replaced whole, no stale mix
    assert (tmp_path / "input" / "demo.csv").read_text() == "keep me"
    assert not any(n.startswith(".privpipe") for n in os.listdir(tmp_path))


def test_abort_leaves_earlier_output_untouched(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("old")
    before = sorted(os.listdir(tmp_path))
    out = RunOutput(tmp_path, "r2")
    (out.staging / "manifest.json").write_text("half-written")
    out.abort()
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "manifest.json").read_text() == "old"


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
