"""Runner portability: the demo pipeline gives the same figures on every runner.

PortableRunner runs against Beam's own Python job service started here on a free
loopback port with LOOPBACK workers; multi-processing DirectRunner pickles every
DoFn into worker processes. Equal manifests prove the graph keeps no driver-side state.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from privpipe.pipelines.cli import main
from privpipe.pipelines.demo_data import write_csv
from tests.conftest import Project
from tests.layout import internal_file
from tests.ledgers import provision_ledger

pytestmark = pytest.mark.slow

ROWS = 4_000


def figures(out: Path) -> dict[str, object]:
    m = json.loads((internal_file(out, "manifest.json")).read_text())
    return {
        k: m[k]
        for k in (
            "rows_read",
            "rows_accepted",
            "rows_rejected",
            "profile",
            "hierarchies",
            "releases",
            "status",
        )
    }


@pytest.fixture(scope="module")
def demo_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "demo.csv"
    write_csv(path, ROWS)
    return path


@pytest.fixture(scope="module")
def job_service() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apache_beam.runners.portability.local_job_service_main",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("Beam's local job service did not start")
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def direct_figures(tmp_path_factory: pytest.TempPathFactory, demo_input: Path) -> dict:
    out = tmp_path_factory.mktemp("direct")
    return figures(_run(out, demo_input))


def _run(out: Path, demo_input: Path, *extra: str) -> Path:
    from privpipe.pipelines.run import run

    plan = without_report(without_holdout(demo_plan(out, demo_input)))
    run(plan, beam_args=list(extra), log=lambda _m: None)
    assert not internal_file(out, "report.html").exists()  # the audit did not run
    return out


def demo_plan(out: Path, demo_input: Path, only: tuple[str, ...] | None = None) -> Any:
    """The demo config's plan on ``demo_input``, output in ``out``, with a ledger (and
    continual state) of its own, as `privpipe demo` makes: the demo's shared one would
    refuse re-runs. ``only``: just those releases (`run --only`)."""
    from privpipe.pipelines.cli import DEMO_CONFIG, demo_ledger
    from privpipe.pipelines.plan import load_plan

    ledger, key = demo_ledger(out / "budget")
    return load_plan(
        DEMO_CONFIG,
        output_dir=out,
        input_override=demo_input,
        ledger_override=ledger,
        key_file_override=key,
        only=only,
    )


def without_holdout(plan: Any) -> Any:
    """The demo without its control holdout: a fresh key per run holds out different
    persons, so two runs' figures are comparable only without it."""
    attacks = plan.config.attacks.model_copy(update={"control": None})
    return dataclasses.replace(plan, config=plan.config.model_copy(update={"attacks": attacks}))


def without_report(plan: Any) -> Any:
    """The plan with its audit and report switched off (``report.enabled: false``): for
    tests that compare what a run publishes and its manifest's figures, which the audit
    (attacks on every release, utility, report: ~7 s of a 4,000-row demo run) never
    changes. The release attacks and the publication check still run."""
    report = plan.config.report.model_copy(update={"enabled": False})
    return dataclasses.replace(plan, config=plan.config.model_copy(update={"report": report}))


def test_direct_runner_figures_are_sane(direct_figures: dict) -> None:
    assert direct_figures["rows_accepted"] == ROWS
    assert direct_figures["profile"]["qi_combinations"]["distinct"] > 100


def test_portable_runner_matches_direct(
    tmp_path: Path, demo_input: Path, job_service: int, direct_figures: dict
) -> None:
    out = _run(
        tmp_path / "portable",
        demo_input,
        "--runner=PortableRunner",
        f"--job_endpoint=localhost:{job_service}",
        "--environment_type=LOOPBACK",
    )
    m = json.loads((internal_file(out, "manifest.json")).read_text())
    assert m["runner"] == "PortableRunner"
    assert figures(out) == direct_figures


def test_multiprocessing_direct_runner_matches(
    tmp_path: Path, demo_input: Path, direct_figures: dict
) -> None:
    out = _run(
        tmp_path / "mp",
        demo_input,
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    )
    assert figures(out) == direct_figures


def test_runner_flag_passes_through_the_cli(
    tmp_path: Path, demo_input: Path, job_service: int, direct_figures: dict
) -> None:
    cfg = tmp_path / "demo.yaml"
    from privpipe.pipelines.cli import DEMO_CONFIG

    text = DEMO_CONFIG.read_text().replace("../demo-out/input/demo.csv", str(demo_input))
    text = text.replace("demo/hierarchies/", str(DEMO_CONFIG.parent / "demo" / "hierarchies") + "/")
    text = text.replace("../demo-out/budget/", str(tmp_path / "budget") + "/")
    assert "control: {holdout:" in text
    text = re.sub(r"\n  control: \{holdout: [0-9.]+\}", "", text)  # as without_holdout
    assert "\nreport:\n" in text
    text = text.replace("\nreport:\n", "\nreport:\n  enabled: false\n")  # as without_report
    cfg.write_text(text)
    provision_ledger(cfg)
    out = tmp_path / "cli"
    code = main(
        [
            "run",
            str(cfg),
            "--output",
            str(out),
            "--runner",
            "PortableRunner",
            "--",
            f"--job_endpoint=localhost:{job_service}",
            "--environment_type=LOOPBACK",
        ]
    )
    assert code == 0
    assert not internal_file(out, "report.html").exists()
    assert figures(out) == direct_figures


def test_pipeline_options_make_each_view_once_and_share_values() -> None:
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions, TypeOptions

    from privpipe.pipelines.run import pipeline_options

    options = pipeline_options(["--direct_num_workers=2"], None)
    # one view per class (Beam asks for one per applied transform; each new one re-parses)
    assert options.view_as(TypeOptions) is options.view_as(TypeOptions)
    assert options.view_as(StandardOptions).runner == "DirectRunner"
    assert options.view_as(DirectOptions).direct_num_workers == 2
    options.view_as(TypeOptions).pipeline_type_check = False  # a write through one view ...
    assert options.get_all_options()["pipeline_type_check"] is False  # ... is the option's
    assert options.view_as(TypeOptions).pipeline_type_check is False
    assert pipeline_options([], "PortableRunner").view_as(StandardOptions).runner == (
        "PortableRunner"
    )


def _made_tempdirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders ``tempfile.mkdtemp`` makes from now on (Beam's among them)."""
    import tempfile

    made: list[str] = []
    real = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        folder = real(*args, **kwargs)
        made.append(folder)
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return made


def test_direct_runner_makes_no_prism_download_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """DirectRunner runs on Beam's FnApiRunner directly: Beam's own DirectRunner would first
    try to download the Prism runner, leaving an empty /tmp/beam-temp* folder per run."""
    import apache_beam as beam

    from privpipe.pipelines.run import pipeline_options
    from privpipe.pipelines.runner import runner_for

    made = _made_tempdirs(monkeypatch)
    options = pipeline_options([], None)
    with beam.Pipeline(runner=runner_for(options), options=options) as p:
        _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
    assert not [f for f in made if "beam-temp" in f]
    assert runner_for(pipeline_options([], "PortableRunner")) is None


def test_bundles_run_here_sample_their_state_every_20_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DirectRunner's bundles sample every 20 ms, so a bundle's end waits at most that
    long for its sampler (Beam's 200 ms: up to 0.2 s idle per stage); the samplers a
    pipeline run here starts are those. A Beam with another default is left alone."""
    import apache_beam as beam
    from apache_beam.runners.worker import statesampler

    from privpipe.pipelines.run import pipeline_options
    from privpipe.pipelines.runner import SAMPLING_PERIOD_MS, runner_for, shorter_state_sampling

    init = statesampler.StateSampler.__init__
    monkeypatch.setattr(init, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    periods: list[int] = []
    started = statesampler.StateSampler.start

    def start(self: Any) -> None:
        periods.append(self.sampling_period_ms)
        started(self)

    monkeypatch.setattr(statesampler.StateSampler, "start", start)
    options = pipeline_options([], None)
    with beam.Pipeline(runner=runner_for(options), options=options) as p:
        _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
    assert periods and set(periods) == {SAMPLING_PERIOD_MS} and SAMPLING_PERIOD_MS == 20
    monkeypatch.setattr(init, "__defaults__", (150,))  # another Beam's default: kept
    shorter_state_sampling()
    assert init.__defaults__ == (150,)


@pytest.mark.parametrize("fails", ["graph", "run", "none"])
def test_a_run_leaves_no_beam_pipeline_folder_in_tmp(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """Beam makes ``/tmp/beam-pipeline-temp*`` when a pipeline is built and removes it only
    when it runs: a run refused while its graph is built (or before it runs) left one
    behind every time."""
    from privpipe.errors import ConfigError
    from privpipe.pipelines import run as run_module
    from privpipe.pipelines.cli import main

    made = _made_tempdirs(monkeypatch)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConfigError("releases[0]: refused for the test")

    if fails == "graph":
        monkeypatch.setattr(run_module, "build_graph", refuse)
    elif fails == "run":  # after the graph, before the pipeline runs
        import apache_beam as beam

        monkeypatch.setattr(beam.Pipeline, "run", refuse)
    project.cfg["releases"] = [{"name": "k2", "kind": "k_anonymity", "k": 2}]
    project.save()
    code = main(["run", str(project.config), "--output", str(tmp_path / "out")])
    assert code == (0 if fails == "none" else 2)
    beam_folders = [f for f in made if "beam-pipeline-temp" in f]
    assert beam_folders  # the spy saw Beam make it
    assert not [f for f in beam_folders if Path(f).exists()]
