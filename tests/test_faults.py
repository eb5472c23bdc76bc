"""The fault corpus (issue 17 item 7): every bad input or fault the sweep found, each with
the exit code, a message naming the file/key/line and the fix, earlier output untouched
and the ledger consistent.

Most cases run in-process (``privpipe validate``, the loaders, RunOutput); the few that
need another process (kill -9 during a commit, two runs racing) start a small child
(tests/faults/commit_child.py), never a Beam pipeline.
"""

from __future__ import annotations

import csv
import errno
import gzip
import io
import json
import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from privpipe.errors import ConfigError, InputDataError, OutputBusy
from privpipe.formulas import escape, escape_table, needs_escape, unescape
from privpipe.pipelines.cli import main
from privpipe.pipelines.hierarchies import label_collisions
from privpipe.pipelines.output import RunOutput
from privpipe.pipelines.plan import check_unchanged, input_stamps
from privpipe.reports import load_release
from privpipe.transforms.sink import write_table
from tests.conftest import ROWS, Project
from tests.faults import FILES, forked, stage_and_commit
from tests.layout import internal_file, release_dir
from tests.ledgers import open_config_ledger, provision_ledger

# ------------------------------------------------------------------ publishing (commit)


def _publish(out: Path, run_id: str, kill_at: str | None = None) -> int:
    return forked(lambda: stage_and_commit(out, run_id), kill_at)


def _which_run(out: Path) -> str:
    """The one run DIR's public/ and internal/ come from; fails on a mix or a gap."""
    public = sorted(os.listdir(out / "public"))
    seen = {(out / "internal" / f).read_text() for f in FILES}
    assert len(public) == 1 and seen == {public[0]}, f"a mix: public {public}, internal {seen}"
    assert (out / "public" / public[0] / "data.csv").read_text() == public[0]
    return public[0]


POINTS = [  # (where the commit is killed, which run DIR shows after the next run's recovery)
    ("commit:start", "old"),
    ("commit:ready", "new"),
    ("commit:public-aside", "new"),
    ("commit:public-in", "new"),
    ("commit:internal-aside", "new"),
    ("commit:internal-in", "new"),
    ("commit:swapped", "new"),
]


@pytest.mark.parametrize(("point", "after"), POINTS)
def test_commit_killed_at_each_step_recovers_whole(tmp_path: Path, point: str, after: str) -> None:
    """kill -9 anywhere in the commit: the next run finds DIR as one run left it (the old
    one before the commit was marked ready, the new one after), says what it did, and no
    ``.privpipe-*`` folder outlives it."""
    out = tmp_path / "out"
    assert _publish(out, "old") == 0
    assert _publish(out, "new", kill_at=point) == -signal.SIGKILL
    nxt = RunOutput(out, "next")
    assert nxt.notes, "recovery must say what it did"
    joined = "\n".join(nxt.notes)
    assert str(out) in joined
    if after == "new":
        assert "finished the publication of run new" in joined or "removed" in joined
    nxt.abort()
    assert sorted(os.listdir(out)) == ["internal", "public"]
    assert _which_run(out) == after


def test_two_runs_into_one_output_folder_one_fails_cleanly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two processes: the one that comes second fails at once (exit 1, names the folder
    and what to do) and touches nothing; the first publishes all its files."""
    out = tmp_path / "out"
    assert _publish(out, "old") == 0
    staged_r, staged_w = os.pipe()
    go_r, go_w = os.pipe()

    def first() -> int:  # stages, says so, waits for the second run to have failed
        def hold() -> None:
            os.write(staged_w, b"s")
            os.read(go_r, 1)

        return stage_and_commit(out, "first", hold)

    pid = os.fork()
    if pid == 0:
        os._exit(forked(first))
    try:
        assert os.read(staged_r, 1) == b"s"
        capfd.readouterr()
        assert _publish(out, "second") == OutputBusy.exit_code == 1
        err = capfd.readouterr().err
        assert str(out) in err and "another privpipe run is writing" in err
        assert "choose another folder with --output" in err
        assert _which_run(out) == "old"  # the loser touched nothing
    finally:  # the first run always finishes (a failed assertion leaves no child behind)
        os.write(go_w, b"g")
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert sorted(os.listdir(out)) == ["internal", "public"]
    assert _which_run(out) == "first"
    assert _publish(out, "third") == 0  # the lock went with the first run


def test_empty_publication_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """``releases: []``: no old release, audit or report stays beside the new manifest."""
    out = tmp_path / "out"
    assert _publish(out, "old") == 0
    run = RunOutput(out, "empty")
    (run.internal / "manifest.json").write_text('{"releases": []}')
    run.commit()
    assert os.listdir(out / "public") == []
    assert os.listdir(out / "internal") == ["manifest.json"]


# ------------------------------------------------------------- the corpus: one table
#
# Each case breaks one thing in a small valid project (tests/conftest.py Project: a CSV, a
# config, hierarchies; an earlier run's output in out/), runs `privpipe validate` or
# `privpipe run` in-process and expects the exit code and message fragments (the file,
# key or line, and the fix). Every case also checks that nothing was written: every
# regular file under the project (earlier output and inputs included) is byte for byte
# what it was, and no staging, lock or previous folder is left.


def _yaml(p: Project, text: str) -> list[str]:
    p.config.write_text(text)
    return ["validate", str(p.config)]


def _cfg(p: Project, cmd: str = "validate", *extra: str, **changes: Any) -> list[str]:
    for key, value in changes.items():
        parent, _, leaf = key.rpartition("__")
        node = p.cfg
        for part in parent.split("__") if parent else []:
            node = node[part]
        node[leaf] = value
    p.save()
    return [cmd, str(p.config), *extra]


def _data(p: Project, content: bytes, name: str = "data.csv", **changes: Any) -> list[str]:
    (p.root / name).write_bytes(content)
    return _cfg(p, "run", **({"input__path": name} | changes))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _bomb(p: Project) -> list[str]:
    return _yaml(p, p.config.read_text() + BOMB.replace("a:", "x_a:", 1))


def _aliases_in_an_error(p: Project) -> list[str]:
    """250,000 values (under the limit) where a string is expected: the message shows a
    few, never the expanded whole."""
    big = "[&a [" + ", ".join(["v"] * 500) + "], " + ", ".join(["*a"] * 499) + "]"
    return _yaml(p, p.config.read_text().replace("name: tiny", f"name: {big}"))


def _fifo(p: Project) -> list[str]:
    os.mkfifo(p.root / "pipe.csv")
    return _cfg(p, "run", input__path="pipe.csv")


def _swapped_labels(p: Project) -> list[str]:
    (p.root / "h" / "sex.csv").write_text("Male;Female;*\nFemale;Male;*\n")
    return _cfg(p)


def _inside_internal(p: Project) -> list[str]:
    (p.out / "internal" / "data.csv").write_bytes(p.data.read_bytes())
    return _cfg(p, input__path="out/internal/data.csv")


def _deep_glob(p: Project) -> list[str]:
    (p.root / "in" / "x" / "y").mkdir(parents=True)
    (p.root / "in" / "x" / "y" / "data.csv").write_bytes(p.data.read_bytes())
    return _cfg(p, input__path="*/*/*/data.csv")


def _glob_matches_output(p: Project) -> list[str]:
    (p.root / "in").mkdir()
    (p.root / "in" / "data.csv").write_bytes(p.data.read_bytes())
    return _cfg(p, input__path="in/*", output__dir="in/out")


def _many_columns(p: Project) -> list[str]:
    header = ";".join(f"c{i}" for i in range(10_000))
    return _data(p, (header + "\n" + ";".join("1" * 10_000) + "\n").encode())


def _parquet_garbage(p: Project) -> list[str]:
    return _data(p, b"PAR1 this is not parquet", name="data.parquet")


def _output_is_a_file(p: Project) -> list[str]:
    (p.root / "afile").write_text("x")
    return _cfg(p, "run", output__dir="afile")


def _ledger_not_sqlite(p: Project) -> list[str]:
    (p.root / "ledger.sqlite").write_text("name,epsilon\nnot,a ledger\n")
    return _cfg(
        p, "run", releases=[DP_SEX], budget={"ledger": "ledger.sqlite", "lifetime_epsilon": 10}
    )


DP_SEX = {"name": "by_sex", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["sex"]}
HEADER = b"id;zip;age;sex;disease\n"
ROW = b"1;47677;29;Female;Flu\n"


class Case(NamedTuple):
    id: str
    setup: Callable[[Project], list[str]]
    code: int
    fragments: tuple[str, ...]


CASES = [
    # hostile or broken YAML (validate; the same loader serves run)
    Case("yaml-alias-bomb", _bomb, 2, ("config.yaml", "aliases", "expand to more than")),
    Case("yaml-aliases-in-an-error", _aliases_in_an_error, 2, ("name: must be a string, got [[",)),
    Case("yaml-recursive-anchor", lambda p: _yaml(p, "name: &a [*a]\n"), 2, ("recursive",)),
    Case(
        "yaml-python-tag",
        lambda p: _yaml(p, "name: !!python/object/apply:os.system [echo hi]\n"),
        2,
        ("config.yaml", "line 1"),
    ),
    Case("yaml-syntax", lambda p: _yaml(p, "name: a\n  b: [\n"), 2, ("config.yaml", "line")),
    Case("yaml-not-a-mapping", lambda p: _yaml(p, "- a\n- b\n"), 2, ("must be a mapping",)),
    Case(
        "yaml-deep-nesting",
        lambda p: _yaml(p, "a: " + "[" * 20_000),
        2,
        ("config.yaml", "levels deep"),
    ),
    Case(
        "config-not-utf8",
        lambda p: (p.config.write_bytes(b"name: caf\xe9\n"), ["validate", str(p.config)])[1],
        2,
        ("not UTF-8", "save it as UTF-8"),
    ),
    Case(
        "config-missing",
        lambda p: ["validate", str(p.root / "nope.yaml")],
        2,
        ("nope.yaml", "not found"),
    ),
    Case("unknown-key", lambda p: _cfg(p, outptu={"dir": "o"}), 2, ("outptu", "output")),
    Case("split-mb-tiny", lambda p: _cfg(p, input__split_mb=1e-9), 2, ("input.split_mb", ">=")),
    Case(
        "release-name-traversal",
        lambda p: _cfg(p, releases=[{"name": "../x", "kind": "k_anonymity", "k": 2}]),
        2,
        ("releases[0].name",),
    ),
    Case(
        "hierarchy-labels-swapped",
        _swapped_labels,
        2,
        ("hierarchies.sex", "level 1", "'Male' → 'Female'", "'Female' → 'Male'", "not raw"),
    ),
    Case(
        "hierarchy-group-label-is-a-value",
        lambda p: _cfg(p, hierarchies__sex={"groups": [{"Male": "Female", "Female": "Female"}]}),
        2,
        ("hierarchies.sex", "level 1", "'Male' → 'Female'"),
    ),
    # the output never replaces or reads the input
    Case(
        "output-is-input-folder",
        lambda p: _cfg(p, output__dir="."),
        2,
        ("output.dir", "input.path", "folder of the input file"),
    ),
    Case(
        "output-flag-is-input-folder",
        lambda p: ["run", str(p.config), "--output", str(p.root)],
        2,
        ("--output", "input.path"),
    ),
    Case("input-inside-internal", _inside_internal, 2, ("input.path", "internal/", "output.dir")),
    Case("glob-reaches-public", _deep_glob, 2, ("input.path", "public/", "output.dir")),
    Case("glob-matches-output", _glob_matches_output, 2, ("input.path", "reaches the output")),
    Case(
        "work-dir-inside-output",
        lambda p: _cfg(p, output__work_dir="out/tmp"),
        2,
        ("output.work_dir", "row-level"),
    ),
    Case("output-is-a-file", _output_is_a_file, 2, ("afile", "not a folder", "choose another")),
    # arguments
    Case(
        "runner-unknown",
        lambda p: ["run", str(p.config), "--runner", "NoSuchRunner"],
        2,
        ("--runner NoSuchRunner", "DirectRunner", "known runners"),
    ),
    Case(
        "runner-typo",
        lambda p: ["run", str(p.config), "--runner", "DirectRuner"],
        2,
        ("did you mean DirectRunner",),
    ),
    Case(
        "validate-extra-flag",
        lambda p: ["validate", str(p.config), "--bogus"],
        2,
        ("--bogus",),
    ),
    # inputs that cannot be read at all (found before any Beam work)
    Case(
        "glob-matches-nothing",
        lambda p: _cfg(p, "run", input__path="nothing-*.csv"),
        3,
        ("input.path", "no file matches"),
    ),
    Case(
        "input-is-a-directory",
        lambda p: _cfg(p, "run", input__path="h"),
        3,
        ("is a directory", "not a regular file", "glob"),
    ),
    Case("input-is-a-fifo", _fifo, 3, ("pipe.csv", "FIFO", "not a regular file")),
    Case("input-empty", lambda p: _data(p, b""), 3, ("data.csv", "empty")),
    Case(
        "input-gzip-named-csv",
        lambda p: _data(p, gzip.compress(HEADER + ROW)),
        3,
        ("data.csv", "gzip", "decompress"),
    ),
    Case(
        "header-invalid-utf8",
        lambda p: _data(p, b"id;zip;\xff\xfeage;sex;disease\n" + ROW),
        3,
        ("data.csv", "line 1"),
    ),
    Case(
        "header-latin1",
        lambda p: _data(p, b"id;zip;\xe2ge;sex;disease\n" + ROW),
        3,
        ("data.csv", "encoding"),
    ),
    Case(
        "header-nul-byte",
        lambda p: _data(p, b"id;zip;a\x00ge;sex;disease\n" + ROW),
        3,
        ("data.csv", "'age' not found", "'a\\x00ge'"),
    ),
    Case(
        "header-duplicate-columns",
        lambda p: _data(p, b"id;zip;age;sex;sex;disease\n" + b"1;47677;29;F;F;Flu\n"),
        3,
        ("data.csv", "sex"),
    ),
    Case(
        "header-odd-column-names",
        lambda p: _data(p, b"id;zip; age ;sex;disease\n" + ROW),
        3,
        ("data.csv", "age"),
    ),
    Case(
        "header-missing-qi",
        lambda p: _data(p, b"id;age;sex;disease\n1;29;Female;Flu\n"),
        3,
        ("data.csv", "zip"),
    ),
    Case("header-only", lambda p: _data(p, HEADER), 3, ("data.csv", "no data rows")),
    Case(
        "wrong-delimiter", lambda p: _data(p, HEADER.replace(b";", b",") + ROW), 3, ("delimiter",)
    ),
    Case("ten-thousand-columns", _many_columns, 3, ("data.csv", "zip")),
    Case("parquet-not-parquet", _parquet_garbage, 3, ("data.parquet",)),
    Case(
        "parquet-empty", lambda p: _data(p, b"", name="data.parquet"), 3, ("data.parquet", "empty")
    ),
    Case(
        "jsonl-not-json",
        lambda p: _data(p, b"id;zip\n", name="data.jsonl"),
        3,
        ("data.jsonl", "line 1"),
    ),
    Case(
        "jsonl-array-line",
        lambda p: _data(p, b'[1, "47677", 29, "Female", "Flu"]\n', name="data.jsonl"),
        3,
        ("data.jsonl", "line 1"),
    ),
    Case(
        "format-says-parquet",
        lambda p: _cfg(p, "run", input__format="parquet"),
        3,
        ("data.csv",),
    ),
    # budget
    Case("ledger-not-sqlite", _ledger_not_sqlite, 3, ("ledger.sqlite", "not a privacy ledger")),
    Case(
        "ledger-missing",
        lambda p: _cfg(
            p, "run", releases=[DP_SEX], budget={"ledger": "none.sqlite", "lifetime_epsilon": 10}
        ),
        2,
        ("none.sqlite", "budget init"),
    ),
]


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (FIFOs and the ledger's sqlite journal aside)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and "state" not in path.parts:
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _earlier_output(p: Project) -> None:
    """An earlier run's published output in out/ (as a commit leaves it)."""
    (p.out / "public" / "old").mkdir(parents=True)
    (p.out / "public" / "old" / "data.csv").write_text("zip,sex,disease\n4767*,*,Flu\n")
    (p.out / "internal").mkdir()
    (p.out / "internal" / "manifest.json").write_text('{"run_id": "old"}')


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault_corpus(case: Case, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    _earlier_output(project)
    argv = case.setup(project)
    before = _files(project.root)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == case.code, err
    assert err.startswith("privpipe: error: ") and "unexpected" not in err, err
    for fragment in case.fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert len(err) < 4000, "a message stays readable (no expanded value, no 10k names)"
    assert _files(project.root) == before  # earlier output, inputs, config: untouched
    assert not [n for n in os.listdir(project.out) if n.startswith(".privpipe")]


# ------------------------------------------------------------- faults around a run


def test_second_run_into_a_busy_output_folder_charges_nothing(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run finding its output folder held by a live run: exit 1 before reading data or
    charging the ledger; the earlier output is untouched."""
    _earlier_output(project)
    _cfg(project, releases=[DP_SEX], budget={"ledger": "ledger.sqlite", "lifetime_epsilon": 10})
    provision_ledger(project.config)
    before = _files(project.out)
    live = RunOutput(project.out, "live")
    try:
        code = main(["run", str(project.config)])
    finally:
        live.abort()
    err = capsys.readouterr().err
    assert code == 1, err
    assert "another privpipe run is writing to this output folder" in err and "out" in err
    assert _files(project.out) == before
    assert open_config_ledger(project.config).history() == []


def test_a_full_ledger_disk_is_an_io_error_naming_the_ledger(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: Any, **__: Any) -> Any:
        raise sqlite3.OperationalError("database or disk is full")

    _cfg(project, releases=[DP_SEX], budget={"ledger": "ledger.sqlite", "lifetime_epsilon": 10})
    provision_ledger(project.config)
    monkeypatch.setattr("privpipe.pipelines.run.open_ledger", full)
    code = main(["run", str(project.config)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert str(project.root / "ledger.sqlite") in err and "disk is full" in err
    assert "unexpected" not in err and "free disk space" in err


def test_a_full_disk_is_an_io_error_naming_the_path(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    where = project.out / "internal" / "manifest.json"

    def full(*_: Any, **__: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))

    monkeypatch.setattr("privpipe.pipelines.run.RunOutput", full)
    code = main(["run", str(project.config)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{where}: I/O error: No space left on device; free disk space" in err


def test_an_input_changed_during_the_run_says_so(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file grows while the run reads it: whatever step trips over the difference, the
    error says the file changed (exit 3) and nothing is published."""
    _earlier_output(project)
    before = _files(project.out)

    def grow_then_fail(*_: Any, **__: Any) -> None:
        with open(project.data, "a") as f:
            f.write("10;47677;31;Male;Flu\n")
        raise InputDataError("column 'zip': value '47677' is not in hierarchies.zip")

    monkeypatch.setattr("privpipe.pipelines.run.build_graph", grow_then_fail)
    code = main(["run", str(project.config)])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "data.csv: the input file changed" in err and "Run again once the file" in err
    assert _files(project.out) == before


def test_check_unchanged_sees_a_rewrite_of_the_same_size(tmp_path: Path) -> None:
    f = tmp_path / "in.csv"
    f.write_text("a\n1\n")
    stamps = input_stamps((str(f),))
    check_unchanged(stamps)  # nothing changed: no error
    tmp = tmp_path / "new.csv"
    tmp.write_text("a\n2\n")
    os.replace(tmp, f)  # same size, a new inode
    with pytest.raises(InputDataError, match="changed"):
        check_unchanged(stamps)


@pytest.mark.slow
def test_every_row_rejected_says_all_n_and_the_reasons(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _earlier_output(project)
    project.write_rows([f"{i};47677;x{i};Male;Flu" for i in range(9)])
    before = _files(project.root)
    code = main(_cfg(project, "run", releases=[{"name": "k2", "kind": "k_anonymity", "k": 2}]))
    err = capsys.readouterr().err
    assert code == 3, err
    assert "all 9 rows were rejected" in err and "hierarchy" not in err
    assert "data.csv line 2: column 'age': 'x0' is not an integer" in err
    assert "internal/rejected.csv" in err
    assert _files(project.root) == {**before, "config.yaml": project.config.read_bytes()}


def test_a_data_built_hierarchy_whose_labels_are_raw_values_is_refused() -> None:
    from privpipe.anonymity.hierarchy import Hierarchy
    from privpipe.pipelines.config import HierarchyConfig
    from privpipe.pipelines.hierarchies import HierarchyResolver

    swapped = Hierarchy(
        "sex", np.array([["Male", "Female", "*"], ["Female", "Male", "*"]], dtype=object)
    )
    resolver = HierarchyResolver({"sex": HierarchyConfig(file="h.csv")}, {"sex": swapped})
    with pytest.raises(ConfigError, match=r"hierarchies\.sex.*level 1.*'Male' → 'Female'"):
        resolver({"sex": pd.Series([3, 4], index=["Male", "Female"])})
    kept = Hierarchy("sex", np.array([["Male", "Male", "*"], ["Female", "F", "*"]], dtype=object))
    assert label_collisions(kept, "k") == []  # a value kept as itself is no collision


def test_a_symlinked_output_folder_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert _publish(link, "one") == 0
    assert link.is_symlink() and _which_run(real) == "one"


# ------------------------------------------------------------- formula injection


def test_formula_cells_are_escaped_and_read_back_as_computed(tmp_path: Path) -> None:
    """OWASP CSV injection: text cells starting with = + - @ tab CR get a leading ',
    numbers (a numeric column, or a text cell that is a plain number) do not; the
    published file reads back (reports.load_release: the audit, the attacks) as computed."""
    frame = pd.DataFrame(
        {
            "zip": ['=HYPERLINK("x")', "+1+1", "@SUM(A1)", "\tx", "-3", "'=x", "4767*"],
            "=cmd": ["-", "-1.5e3", "a", "b", "c", "d", "e"],
            "n": [-3, -2, -1, 0, 1, 2, 3],
        }
    )
    folder = tmp_path / "k2"
    folder.mkdir()
    write_table(frame, str(folder / "data.csv"), "csv")
    text = (folder / "data.csv").read_text()
    lines = text.splitlines()
    assert lines[0] == "zip,'=cmd,n"
    rows = list(csv.reader(io.StringIO(text)))[1:]
    assert [r[0] for r in rows] == [
        "'=HYPERLINK(\"x\")", "'+1+1", "'@SUM(A1)", "'\tx", "-3", "''=x", "4767*"
    ]  # fmt: skip
    assert [r[1] for r in rows] == ["'-", "-1.5e3", "a", "b", "c", "d", "e"]
    assert [r[2] for r in rows] == ["-3", "-2", "-1", "0", "1", "2", "3"]
    back = load_release(folder).data
    assert list(back.columns) == list(frame.columns)
    assert back["zip"].tolist() == frame["zip"].tolist()
    assert back["=cmd"].tolist() == frame["=cmd"].tolist()


def test_formula_escape_round_trips_and_needs_no_escape_for_numbers() -> None:
    values = ["=1", "+", "-", "@", "\t", "\r", "-3", "+2.5", "-1e-3", "'", "''=a", "x", ""]
    for v in values:
        assert unescape(escape(v)) == v
    table = pa.table(
        {
            "v": values,
            "large": pa.array(values, type=pa.large_string()),
            "d": pa.array(values).dictionary_encode(),
            "n": range(len(values)),
        }
    )
    out = escape_table(table)
    for column in ("v", "large", "d"):
        assert out.column(column).to_pylist() == [escape(v) for v in values]
    assert out.column("n") == table.column("n")
    assert [v for v in values if needs_escape(v)] == ["=1", "+", "-", "@", "\t", "\r", "''=a"]


@pytest.mark.slow
def test_a_run_publishes_formula_cells_escaped_and_its_audit_reads_them(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sensitive values starting with = and - go through the anonymisation, the verifier,
    the attacks and the audit: the run succeeds, data.csv holds them escaped, and the
    homogeneity attack (it reads the published file) still finds the sensitive values."""
    rows = [r.replace("Heart Disease", "=1+1").replace("Cancer", "-") for r in ROWS]
    project.write_rows(rows)
    argv = _cfg(
        project,
        "run",
        releases=[{"name": "k2", "kind": "k_anonymity", "k": 2}],
        attacks=["homogeneity"],
    )
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    text = (release_dir(project.out, "k2") / "data.csv").read_text()
    assert "'=1+1" in text and "'-" in text
    assert "\n=" not in text and ",=" not in text and ",-\n" not in text
    published = load_release(release_dir(project.out, "k2")).data
    assert set(published["disease"]) <= {"=1+1", "-", "Flu", "*"}
    audit = json.loads(internal_file(project.out, "audit.json").read_text())
    assert "k2" in audit["releases"]
