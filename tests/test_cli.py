"""End-to-end: the privpipe command on small projects, good and bad (exit codes, messages,
nothing half-written, earlier output kept)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from privpipe.errors import ConfigError
from privpipe.pipelines import cli
from privpipe.pipelines.cli import HUGEPAGE_SETTING, main
from tests.conftest import ROWS, Project
from tests.layout import internal_file
from tests.ledgers import open_config_ledger, provision_ledger


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_nothing_published(out: Path, before: dict[str, bytes] | None = None) -> None:
    if not out.exists():
        return
    leftovers = [n for n in os.listdir(out) if n.startswith(".privpipe")]
    assert not leftovers, leftovers
    if before is not None:
        assert snapshot(out) == before
    else:
        assert not (internal_file(out, "manifest.json")).exists()


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_run_writes_manifest(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["run", str(project.config)], capsys)
    assert code == 0, err
    m = json.loads((internal_file(project.out, "manifest.json")).read_text())
    assert m["status"] == "succeeded" and m["name"] == "tiny"
    assert m["rows_read"] == 9 and m["rows_rejected"] == 0 and m["rows_accepted"] == 9
    assert m["runner"] == "DirectRunner" and m["releases"] == []
    assert len(m["config_sha256"]) == 64
    prof = m["profile"]
    assert prof["columns"]["zip"]["distinct"] == 9
    assert prof["columns"]["sex"]["distinct"] == 2
    assert prof["qi_combinations"] == {
        "distinct": 9,
        "unique": 9,
        "unique_share_of_rows": 1.0,
        "unique_share_of_combinations": 1.0,
        "persons": 9,
        "unique_persons": 9,
        "unique_share_of_persons": 1.0,
    }
    assert m["hierarchies"]["zip"]["levels"] == 6
    assert (internal_file(project.out, "rejected.csv")).read_text().strip() == "file,line,reason"
    assert "9 rows accepted" in out


def test_second_run_replaces_first(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", str(project.config)], capsys)[0] == 0
    first = json.loads((internal_file(project.out, "manifest.json")).read_text())["run_id"]
    assert run_cli(["run", str(project.config)], capsys)[0] == 0
    second = json.loads((internal_file(project.out, "manifest.json")).read_text())["run_id"]
    assert first != second
    assert sorted(os.listdir(project.out)) == ["internal", "public"]
    assert sorted(os.listdir(internal_file(project.out, ""))) == ["manifest.json", "rejected.csv"]


def test_validate_reads_no_data(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.data.write_bytes(b"\x00\xff not a csv the config could read")
    project.cfg["input"]["path"] = "data.csv"
    project.save()
    code, out, _ = run_cli(["validate", str(project.config)], capsys)
    assert code == 0 and "valid" in out


def test_validate_checks_inputs_exist(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.data.unlink()
    code, out, err = run_cli(["validate", str(project.config)], capsys)
    assert code == 3 and "data.csv" in err and "not found" in err and "input.path" in err
    assert "valid" not in out


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--ouptut", "x"], ["unknown option --ouptut", "did you mean --output?"]),
        (["--direct_num_worker=2"], ["did you mean --direct_num_workers?"]),
        (["stray"], ["unexpected argument 'stray'"]),
        (["--direct_num_workers"], ["--direct_num_workers: expected one argument"]),
        (["--direct_running_mode", "bogus"], ["invalid choice: 'bogus'"]),
    ],
)
def test_run_refuses_unknown_options(
    published: Project, capsys: pytest.CaptureFixture[str], args: list[str], fragments: list[str]
) -> None:
    """A typo used to go to Beam with a warning while the run published to output.dir."""
    code, _, err = run_cli(["run", str(published.config), *args], capsys)
    assert code == 2, err
    for f in fragments:
        assert f in err, err
    assert_nothing_published(published.out, published.before)  # type: ignore[attr-defined]


def test_beam_options_still_pass(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """Known Beam options by name, and anything after '--', reach Beam."""
    args = ["--direct_num_workers", "1", "--", "--not_a_beam_option_here=1"]
    code, _, err = run_cli(["run", str(project.config), *args], capsys)
    assert code == 0, err


def test_schema_into_a_closed_pipe_ends_quietly() -> None:
    """`privpipe schema | head` used to end with an 'unexpected BrokenPipeError' message."""
    privpipe = Path(sys.executable).parent / "privpipe"
    proc = subprocess.Popen(
        [str(privpipe), "schema"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == "", err


STRANDED = """
import threading
from privpipe.pipelines import cli

def dispatch(argv):
    # a library's thread left running by the signal (as Beam's state sampler can be)
    threading.Thread(target=threading.Event().wait, name="stranded").start()
    raise {exc}()

cli._dispatch = dispatch
cli.STRANDED_WAIT_S = 0.5
cli.entry()
"""


@pytest.mark.parametrize(("exc", "code"), [("cli.Terminated", 143), ("KeyboardInterrupt", 130)])
def test_a_stopped_run_exits_though_a_thread_is_left_running(exc: str, code: int) -> None:
    """SIGTERM and Ctrl-C raise wherever the main thread is, also inside a library starting
    a thread it then never stops; the run must still exit with its code."""
    script = STRANDED.format(exc=exc)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == code, proc.stderr
    assert "nothing was published" in proc.stderr


def test_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "130"):
        assert f"  {code}" in out, out


def bad(
    project: Project, capsys: pytest.CaptureFixture[str], expected_code: int, *fragments: str
) -> str:
    """Run after a good run; the bad run must fail and leave the good output as it was."""
    code, _, err = run_cli(["run", str(project.config)], capsys)
    assert code == expected_code, err
    for f in fragments:
        assert f in err, err
    assert_nothing_published(project.out, getattr(project, "before", None))
    return err


@pytest.fixture
def published(project: Project, capsys: pytest.CaptureFixture[str]) -> Project:
    """A project with a successful earlier run, so failures must keep its output."""
    assert run_cli(["run", str(project.config)], capsys)[0] == 0
    project.before = snapshot(project.out)  # type: ignore[attr-defined]
    return project


def test_missing_input_file(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.data.unlink()
    bad(published, capsys, 3, "data.csv", "not found")


def test_empty_file(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.data.write_text("")
    bad(published, capsys, 3, "data.csv", "empty")


def test_header_only(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.write_rows([])
    bad(published, capsys, 3, "data.csv")


def test_wrong_delimiter(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.cfg["input"]["delimiter"] = ","
    published.save()
    bad(published, capsys, 3, "'zip'", "not found", "looks ';'-delimited")


def test_ragged_rows(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.write_rows([*ROWS[:3], "10;47677;29;Female;Flu;extra", *ROWS[3:]])
    err = bad(published, capsys, 3, "1 of 10 rows rejected", "line 5", "max_rejected_fraction")
    assert "expected 5 fields" in err


def test_ragged_rows_within_limit_publish(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.write_rows([*ROWS[:3], "10;47677;29", "11;47677;abc;Male;Flu", *ROWS[3:]])
    project.cfg["input"]["max_rejected_fraction"] = 0.25
    project.save()
    code, _, err = run_cli(["run", str(project.config)], capsys)
    assert code == 0, err
    m = json.loads((internal_file(project.out, "manifest.json")).read_text())
    assert (m["rows_read"], m["rows_rejected"], m["rows_accepted"]) == (11, 2, 9)
    rejected = (internal_file(project.out, "rejected.csv")).read_text().splitlines()
    assert rejected[0] == "file,line,reason" and len(rejected) == 3
    assert any(",5," in r for r in rejected) and any(",6," in r for r in rejected)
    assert "abc" in "".join(rejected)  # the reason names the bad value of the typed column


def test_non_utf8(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    raw = published.data.read_bytes().replace(b"Flu", b"Fl\xfc")
    published.data.write_bytes(raw)
    bad(published, capsys, 3, "data.csv", "UTF-8")


def test_declared_column_absent(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.cfg["schema"]["quasi_identifiers"].append("race")
    published.save()
    bad(published, capsys, 3, "'race' not found")


def test_value_missing_from_hierarchy(
    published: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    published.write_rows([*ROWS, "10;47677;29;Unknown;Flu"])
    bad(published, capsys, 3, "sex", "1 row")


def test_inconsistent_hierarchy_file(
    published: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    (published.root / "h" / "sex.csv").write_text("Male;M;*\nFemale;*\n")
    bad(published, capsys, 3, "sex.csv")


def test_yaml_syntax_error(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.config.write_text(published.config.read_text() + "  bad: [\n")
    bad(published, capsys, 2, "YAML syntax error at line")


def test_unknown_key(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.cfg["input"]["delimter"] = ";"
    published.save()
    bad(published, capsys, 2, "input.delimter: unknown key; did you mean 'delimiter'?")


def test_wrong_type(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.cfg["schema"]["quasi_identifiers"] = "zip"
    published.save()
    bad(published, capsys, 2, "schema.quasi_identifiers: must be a list")


def test_negative_batch_size(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.cfg["input"]["batch_rows"] = -1
    published.save()
    bad(published, capsys, 2, "input.batch_rows: must be an integer >= 1, got -1")


def test_output_dir_not_writable(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = project.root / "blocked"
    blocker.write_text("a file where the output folder should be")
    code, _, err = run_cli(["run", str(project.config), "--output", str(blocker / "out")], capsys)
    assert code == 2 and "not writable" in err
    assert blocker.read_text().startswith("a file")


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["frobnicate"], capsys)
    assert code == 2 and "invalid choice" in err


@pytest.mark.slow
def test_subprocess_exit_code_and_stderr(project: Project) -> None:
    """The installed console script: real process exit codes; a run's output, piped (block
    buffered), is all there after the quick exit (``entry``: no last garbage collection)."""
    exe = Path(sys.executable).parent / "privpipe"
    done = subprocess.run(
        [str(exe), "run", str(project.config), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "succeeded"
    assert "bson" not in done.stderr and "apitools" not in done.stderr  # Beam's import noise
    project.cfg["input"]["batch_rows"] = 0
    project.save()
    proc = subprocess.run(
        [str(exe), "run", str(project.config)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "privpipe: error: config.yaml: input.batch_rows" in proc.stderr


def _after_start_up(
    step: str, then: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that runs the command's start-up ``step`` (a function of
    ``pipelines.cli``) before anything else is imported, then the code ``then``; it must
    exit 0."""
    code = f"import sys\nfrom privpipe.pipelines.cli import {step}\n{step}()\n{then}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return done


_A_PIPELINE = (
    "import apache_beam as beam\n"
    "with beam.Pipeline() as p:\n"
    "    _ = p | beam.Create([1, 2, 3]) | beam.Map(print)\n"
)


def test_the_command_skips_beams_mongodb_libraries_and_beam_still_runs() -> None:
    """``entry`` marks Beam's MongoDB client libraries absent before Beam is imported:
    they are never loaded, Beam's warning about them is dropped, and a pipeline runs."""
    done = _after_start_up(
        "skip_unused_connectors",
        "from apache_beam.io import mongodbio\n"
        + _A_PIPELINE
        + "print(sys.modules['pymongo'], sys.modules['bson'], mongodbio.MongoClient)\n",
    )
    assert done.stdout.split().count("None") == 3 and {"1", "2", "3"} <= set(done.stdout.split())
    assert "bson" not in done.stderr


def test_the_command_loads_beams_http_clients_only_when_used() -> None:
    """``entry`` registers httplib2 and requests unrun before Beam is imported: importing
    Beam and running a pipeline runs neither (nor pyparsing, urllib3); the first use of a
    name runs the library, once, and it then works as if imported."""
    done = _after_start_up(
        "lazy_http_libraries",
        _A_PIPELINE + "print('unrun', type(sys.modules['httplib2']).__name__,\n"
        "      type(sys.modules['requests']).__name__,\n"
        "      'pyparsing' in sys.modules, 'urllib3' in sys.modules)\n"
        "from apache_beam.internal.http_client import get_new_http\n"
        "import requests\n"
        "print('used', type(get_new_http()).__name__, requests.Request('GET', 'http://x').method,\n"
        "      type(sys.modules['httplib2']).__name__, 'pyparsing' in sys.modules)\n",
    )
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line}
    assert lines["unrun"] == ["_OnFirstUse", "_OnFirstUse", "False", "False"]
    assert lines["used"] == ["Http", "GET", "module", "True"]
    assert {"1", "2", "3"} <= set(lines)


@pytest.mark.parametrize(("setting", "expected"), [(None, "False False"), ("1", "True True")])
def test_the_command_asks_numpy_for_no_huge_pages_unless_the_user_did(
    setting: str | None, expected: str
) -> None:
    """Before numpy is imported, ``no_huge_page_stalls`` turns numpy's madvise of huge
    pages off in the command's process and in the processes it starts (the environment);
    a user's own ``NUMPY_MADVISE_HUGEPAGE`` is kept."""
    probe = "from numpy._core import multiarray; print(multiarray._get_madvise_hugepage())"
    env = {k: v for k, v in os.environ.items() if k != HUGEPAGE_SETTING}
    if setting is not None:
        env[HUGEPAGE_SETTING] = setting
    done = _after_start_up(
        "no_huge_page_stalls",
        "import subprocess\n"
        "from numpy._core import multiarray\n"
        f"child = subprocess.run([sys.executable, '-c', {probe!r}], capture_output=True,"
        " text=True)\n"
        "print(multiarray._get_madvise_hugepage(), child.stdout.strip())\n",
        env,
    )
    assert done.stdout.strip() == expected


def test_entry_sets_the_huge_page_setting_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []
    monkeypatch.delenv(HUGEPAGE_SETTING, raising=False)
    monkeypatch.setattr(cli, "main", lambda: seen.append(os.environ.get(HUGEPAGE_SETTING)) or 0)
    monkeypatch.setattr(cli, "_quick_exit", lambda: None)
    with pytest.raises(SystemExit) as ended:
        cli.entry()
    assert ended.value.code == 0 and seen == ["0"]


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["demo", "--output", str(tmp_path / "d"), "--rows", "3000"], capsys)
    assert code == 0, err
    m = json.loads((internal_file(tmp_path / "d", "manifest.json")).read_text())
    assert m["rows_accepted"] == 3000 and m["rows_rejected"] == 0
    assert m["profile"]["columns"]["person_id"]["distinct"] < 3000  # several visits per person
    assert 0 < m["profile"]["qi_combinations"]["unique_share_of_rows"] < 1
    assert "published: k5, dp_zip, ldp_diagnosis, weekly_visits" in out
    assert sorted(os.listdir(tmp_path / "d")) == ["budget", "input", "internal", "public"]
    assert m["published"] == sorted(os.listdir(tmp_path / "d" / "public"), key=m["releases"].index)
    # every release attacked, the comparative report written, its path printed last
    # (continual counts are published after the attacks: their state advances last)
    assert set(m["attacks"]) == {"raw", *m["releases"]} - {"weekly_visits"}
    report = internal_file(tmp_path / "d", "report.html")
    assert out.strip().splitlines()[-1] == f"privpipe: report: {report} (audit.json, report.md)"
    audit = json.loads((internal_file(tmp_path / "d", "audit.json")).read_text())
    assert set(audit["releases"]) == set(m["releases"])
    # person-level spend of the published releases only: dp_zip 0.5 + local DP 2 x 1; the
    # continual count (ε 1) is an event-level entry beside it
    assert m["budget"]["spent"]["epsilon"] == 2.5
    assert m["budget"]["charged_this_run"]["weekly_visits"]["unit"] == "event"


def test_json_summary_for_schedulers(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """--json: stdout is exactly one JSON document; the progress lines go to stderr."""
    code, out, err = run_cli(["run", str(project.config), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"] == "succeeded" and summary["exit_code"] == 0
    assert summary["rows"] == {"read": 9, "accepted": 9, "rejected": 0}
    assert summary["public_dir"] == str(project.out / "public")
    assert (
        summary["run_id"]
        == json.loads(internal_file(project.out, "manifest.json").read_text())["run_id"]
    )
    assert "rows accepted" in err and "rows accepted" not in out


def test_json_summary_on_failure(published: Project, capsys: pytest.CaptureFixture[str]) -> None:
    published.data.unlink()
    code, out, err = run_cli(["run", str(published.config), "--json"], capsys)
    assert code == 3
    summary = json.loads(out)
    assert summary["status"] == "failed" and summary["exit_code"] == 3
    assert "not found" in summary["error"] and "not found" in err
    assert_nothing_published(published.out, published.before)  # type: ignore[attr-defined]


def test_quiet_prints_nothing_on_success(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["run", str(project.config), "--quiet"], capsys)
    assert code == 0 and out == "", out
    assert "rows accepted" not in err and "reading" not in err, err
    assert (internal_file(project.out, "manifest.json")).exists()


def test_plan_charges_nothing_and_says_what_a_run_would_spend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`privpipe plan`: the costs per release and what is left, the ledger untouched; an
    unaffordable run is exit 4 after the plan is printed; a missing input is exit 3."""
    config, cfg = dp_project(tmp_path)
    data = tmp_path / "data.csv"
    with open_config_ledger(config) as ledger:
        before = ledger.history()
    code, out, err = run_cli(["plan", str(config)], capsys)
    assert code == 0, err
    assert re.search(r"h\s+dp_histogram\s+dataset\s+1.5\s+0", out), out
    assert "spent 0, 0; this run 1.5, 0; left after it 0.5, 0" in out, out
    assert "the run fits" in out
    with open_config_ledger(config) as ledger:
        assert ledger.history() == before  # nothing charged
    assert not (tmp_path / "out").exists()  # nothing published
    cfg["releases"][1]["epsilon"] = 3
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, out, err = run_cli(["plan", str(config)], capsys)
    assert code == 4 and "would be refused" in err and "this run 3, 0" in out, (out, err)
    data.unlink()
    code, out, err = run_cli(["plan", str(config)], capsys)
    assert code == 3 and "not found" in err


def dp_project(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A config with a k-anonymous table (a candidate) and a published DP histogram, its
    ledger provisioned."""
    data = tmp_path / "data.csv"
    data.write_text("zip,sex\n" + "".join(f"4767{i % 10},{'MF'[i % 2]}\n" for i in range(50)))
    cfg: dict[str, Any] = {
        "name": "plan",
        "input": {"path": str(data)},
        "schema": {"quasi_identifiers": ["zip"], "sensitive": "sex"},
        "hierarchies": {"zip": {"mask": {"digits": 5}}},
        "releases": [
            {"name": "k2", "kind": "k_anonymity", "k": 2},
            {
                "name": "h",
                "kind": "dp_histogram",
                "epsilon": 1.5,
                "group_by": ["sex"],
                "domain": {"sex": ["M", "F"]},
            },
        ],
        "publish": ["h"],
        "budget": {"ledger": str(tmp_path / "ledger.sqlite"), "lifetime_epsilon": 2},
        "output": {"dir": str(tmp_path / "out")},
    }
    config = tmp_path / "plan.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    provision_ledger(config)
    return config, cfg


def test_only_runs_a_subset_without_spending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --only k2`: the table is computed (tuning k), the DP release is not run, not
    charged and not published; an unknown name is exit 2 naming the releases."""
    config, _ = dp_project(tmp_path)
    code, out, err = run_cli(["run", str(config), "--only", "k2"], capsys)
    assert code == 0, err
    m = json.loads(internal_file(tmp_path / "out", "manifest.json").read_text())
    assert m["only"] == ["k2"] and m["releases"] == ["k2"] and m["published"] == []
    assert "not charged and not published" in out
    with open_config_ledger(config) as ledger:
        assert ledger.history() == []
    code, _, err = run_cli(["run", str(config), "--only", "k3"], capsys)
    assert code == 2 and "no release named 'k3'" in err and "k2, h" in err


def test_select_releases_keeps_sweeps_and_publish_semantics() -> None:
    from privpipe.pipelines.plan import select_releases

    data = {
        "releases": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "sweep": [{"release": "a", "k": [2, 3]}, {"release": "b", "k": [4]}],
        "publish": ["a-k2", "b", "c"],
    }
    out = select_releases(data, ["a", "c"], "x.yaml")
    assert [r["name"] for r in out["releases"]] == ["a", "c"]
    assert out["sweep"] == [{"release": "a", "k": [2, 3]}] and out["publish"] == ["a-k2", "c"]
    # no publish: with several releases nothing is published, and a selection of one
    # release must not start publishing it
    assert select_releases({**data, "publish": None}, ["c"], "x.yaml")["publish"] == []
    single = {"releases": [{"name": "a"}]}
    assert select_releases(single, ["a"], "x.yaml")["publish"] == ["a"]
    with pytest.raises(ConfigError, match="did you mean 'c'"):
        select_releases(data, ["cc"], "x.yaml")


def test_outputs_are_not_world_readable_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """public/ 0750 (0755 only with output.world_readable), internal/ 0700, ledger 0600."""
    import stat

    config, cfg = dp_project(tmp_path)
    assert run_cli(["run", str(config)], capsys)[0] == 0
    out = tmp_path / "out"

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(out / "public") == 0o750 and mode(out / "internal") == 0o700
    assert mode(tmp_path / "ledger.sqlite") == 0o600
    cfg["output"]["world_readable"] = True
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert run_cli(["run", str(config), "--only", "k2"], capsys)[0] == 0  # no DP spend again
    assert mode(out / "public") == 0o755 and mode(out / "internal") == 0o700


def test_the_collector_is_paused_for_the_first_imports_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    import privpipe.pipelines.run  # noqa: F401
    from privpipe.pipelines import cli

    assert gc.isenabled()
    with cli._collector_paused():  # the pipeline's modules are imported: nothing to pause
        assert gc.isenabled()
    monkeypatch.delitem(sys.modules, "privpipe.pipelines.run")
    gc.unfreeze()
    with cli._collector_paused():  # a first import
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # what the imports left is out of later collections
    gc.unfreeze()
    with pytest.raises(ValueError), cli._collector_paused():  # restored on errors too
        raise ValueError("x")
    assert gc.isenabled()
