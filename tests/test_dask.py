"""privpipe on Dask (issue 15): Beam's DaskRunner bugs, privpipe's runner, equal results.

One ``distributed.LocalCluster`` (2 worker processes, 1 thread each) serves every test of
this module and is closed even when a test fails. Each Beam DaskRunner bug privpipe works
around (pipelines/dask_runner.py) has a minimal reproduction here, marked xfail(strict): the
day Beam fixes it, the test passes and strict xfail fails, telling us to drop the
workaround. The same pipeline on privpipe's runner passes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

dd = pytest.importorskip("dask.distributed")

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.pvalue import AsList, TaggedOutput  # noqa: E402
from apache_beam.transforms.window import GlobalWindow  # noqa: E402
from apache_beam.utils.windowed_value import WindowedValue  # noqa: E402

from tests.layout import internal_file, release_dir  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two single-threaded worker processes, shut down whatever the tests did."""
    c = dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        yield c
    finally:
        c.close()


def beam_runner() -> Any:
    from apache_beam.runners.dask.dask_runner import DaskRunner

    return DaskRunner()


def privpipe_runner() -> Any:
    from privpipe.pipelines.dask_runner import DaskRunner

    return DaskRunner()


def run_on(
    make_runner: Callable[[], Any], cluster: Any, build: Callable[[Any], None], *flags: str
) -> None:
    """Build a pipeline with ``build(p)`` and run it to the end on ``cluster``."""
    options = PipelineOptions([f"--dask_client_address={cluster.scheduler_address}", *flags])
    p = beam.Pipeline(runner=make_runner(), options=options)
    build(p)
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        result.client.close()  # Beam's result never closes its client


class Record:
    """A sink that appends what it sees to a file (workers are other processes)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = folder / name

    def __call__(self, value: Any) -> Any:
        with open(self.path, "a") as f:
            f.write(f"{value}\n")
        return value

    def seen(self) -> list[str]:
        return sorted(self.path.read_text().split()) if self.path.exists() else []


class SplitOdd(beam.DoFn):  # type: ignore[misc]
    def process(self, x: int) -> Iterator[Any]:
        yield TaggedOutput("odd", x) if x % 2 else x


def tagged(folder: Path) -> tuple[Callable[[Any], None], Record, Record]:
    even, odd = Record(folder, "even"), Record(folder, "odd")

    def build(p: Any) -> None:
        split = (
            p | beam.Create([1, 2, 3, 4]) | beam.ParDo(SplitOdd()).with_outputs("odd", main="even")
        )
        _ = split.even | "Even" >> beam.Map(even)
        _ = split.odd | "Odd" >> beam.Map(odd)

    return build, even, odd


class SumInFinish(beam.DoFn):  # type: ignore[misc]
    def start_bundle(self) -> None:
        self.total = 0

    def process(self, x: int) -> None:
        self.total += x

    def finish_bundle(self) -> Iterator[Any]:
        yield WindowedValue(self.total, 0, (GlobalWindow(),))


def finishing(folder: Path) -> tuple[Callable[[Any], None], Record]:
    sums = Record(folder, "sums")

    def build(p: Any) -> None:
        _ = p | beam.Create(list(range(10))) | beam.ParDo(SumInFinish()) | beam.Map(sums)

    return build, sums


def side_input(folder: Path) -> tuple[Callable[[Any], None], Record, Record]:
    computed, out = Record(folder, "side"), Record(folder, "out")

    def build(p: Any) -> None:
        side = p | "Side" >> beam.Create([7]) | "Computed" >> beam.Map(computed)
        main = p | "Main" >> beam.Create(list(range(40)))
        _ = main | beam.Map(lambda x, s: out(x + s[0]), AsList(side))

    return build, computed, out


# ------------------------------------------------------------------ Beam's DaskRunner bugs


@pytest.mark.xfail(strict=True, reason="Beam DaskRunner: only the last sink runs")
def test_beam_dask_runs_every_sink(cluster: Any, tmp_path: Path) -> None:
    build, even, _odd = tagged(tmp_path)
    run_on(beam_runner, cluster, build)
    assert even.seen() == ["2", "4"]  # Beam computes only the last branch ("Odd")


@pytest.mark.xfail(strict=True, reason="Beam DaskRunner: tagged outputs are not split")
def test_beam_dask_splits_tagged_outputs(cluster: Any, tmp_path: Path) -> None:
    build, _even, odd = tagged(tmp_path)
    run_on(beam_runner, cluster, build)
    assert odd.seen() == ["1", "3"]  # Beam hands 1, 2, 3, 4 to the "odd" consumer


@pytest.mark.xfail(strict=True, reason="Beam DaskRunner: finish_bundle outputs dropped")
def test_beam_dask_keeps_finish_bundle_outputs(cluster: Any, tmp_path: Path) -> None:
    build, sums = finishing(tmp_path)
    run_on(beam_runner, cluster, build)
    assert sum(int(s) for s in sums.seen()) == 45


@pytest.mark.xfail(strict=True, reason="Beam DaskRunner: side input recomputed per task")
def test_beam_dask_computes_a_side_input_once(cluster: Any, tmp_path: Path) -> None:
    build, computed, out = side_input(tmp_path)
    run_on(beam_runner, cluster, build, "--dask_npartitions=4")
    assert len(out.seen()) == 40
    assert computed.seen() == ["7"]  # Beam: once per partition of the main input


def test_beam_dask_has_no_metrics() -> None:
    """Beam's result raises on metrics() (no stage timings); privpipe's reports counters."""
    from apache_beam.runners.dask.dask_runner import DaskRunnerResult

    with pytest.raises(NotImplementedError):
        DaskRunnerResult(client=None, futures=[]).metrics()


# ------------------------------------------------------------------ privpipe's runner


def test_privpipe_dask_runs_every_sink_with_split_tags(cluster: Any, tmp_path: Path) -> None:
    build, even, odd = tagged(tmp_path)
    run_on(privpipe_runner, cluster, build)
    assert even.seen() == ["2", "4"]
    assert odd.seen() == ["1", "3"]


def test_privpipe_dask_keeps_finish_bundle_outputs(cluster: Any, tmp_path: Path) -> None:
    build, sums = finishing(tmp_path)
    run_on(privpipe_runner, cluster, build)
    assert sum(int(s) for s in sums.seen()) == 45


def test_privpipe_dask_computes_a_side_input_once(cluster: Any, tmp_path: Path) -> None:
    build, computed, out = side_input(tmp_path)
    run_on(privpipe_runner, cluster, build, "--dask_npartitions=4")
    assert out.seen() == sorted(str(x + 7) for x in range(40))
    assert computed.seen() == ["7"]


def test_privpipe_dask_groups_by_key_across_workers(cluster: Any, tmp_path: Path) -> None:
    """Keys hashed on two worker processes land in one group each (string keys: Python's
    own hash differs per process)."""
    groups = Record(tmp_path, "groups")

    def build(p: Any) -> None:
        _ = (
            p
            | beam.Create([(f"k{i % 5}", i) for i in range(50)])
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: groups(f"{k}:{sum(vs)}"))
        )

    run_on(privpipe_runner, cluster, build, "--dask_npartitions=4")
    assert groups.seen() == [f"k{j}:{sum(range(j, 50, 5))}" for j in range(5)]


def test_privpipe_dask_reports_counters(cluster: Any) -> None:
    from privpipe.transforms.timing import stage_counters

    class Count(beam.DoFn):  # type: ignore[misc]
        def process(self, x: int) -> Iterator[int]:
            beam.metrics.Metrics.counter("privpipe.stage", "test").inc(x)
            yield x

    options = PipelineOptions([f"--dask_client_address={cluster.scheduler_address}"])
    p = beam.Pipeline(runner=privpipe_runner(), options=options)
    _ = p | beam.Create([1, 2, 3]) | beam.ParDo(Count())
    result = p.run()
    result.wait_until_finish()
    assert stage_counters(result) == {"test": 6}


def test_privpipe_dask_raises_a_worker_error(cluster: Any) -> None:
    from privpipe.errors import InputDataError

    def bad(x: int) -> int:
        raise InputDataError(f"row {x}: bad")

    with pytest.raises(InputDataError, match="bad"):
        run_on(privpipe_runner, cluster, lambda p: p | beam.Create([1]) | beam.Map(bad))


# ------------------------------------------------------------------ equal results


DEMO_ROWS = 2_000
ADULT_ROWS = 3_000
SEED = 20261124  # --insecure-seed: the same DP noise and bounding on both runners
VOLATILE = {
    "run_id",
    "started",
    "finished",
    "created_at",
    "seconds",
    "timings",
    "runner",
    "report",
    "ledger_head",
}


def stable(doc: Any, out: str) -> Any:
    """A JSON document without what differs between any two runs on one runner: ids,
    clocks, timings, the run's own folder (``out``: its ledger), the last bits of float
    sums (tables are in random row order) and the row-linking figures, measured on those
    random orders (their verdicts are kept)."""
    if isinstance(doc, dict):
        return {
            k: [(r["releases"], r["breach"]) for r in v] if k == "row_linking" else stable(v, out)
            for k, v in doc.items()
            if k not in VOLATILE and not k.endswith("_seconds")
        }
    if isinstance(doc, list):
        return [stable(v, out) for v in doc]
    if isinstance(doc, float):
        return float(f"{doc:.9g}")
    if isinstance(doc, str):
        return doc.replace(out, "<out>")
    return doc


def outputs(out: Path) -> dict[str, Any]:
    """Every release (published and candidate: sorted rows, release.json), the audit and
    the manifest's figures, comparable across runs (table rows are in random order)."""
    import pandas as pd

    found: dict[str, Any] = {}
    for folder in (out / "public", out / "internal" / "candidates"):
        for release in sorted(p for p in folder.iterdir() if p.is_dir()):
            frame = pd.read_csv(release / "data.csv")
            rows = frame.sort_values(list(frame.columns)).reset_index(drop=True)
            found[f"{release.name}/data"] = rows.to_dict("split")
            doc = json.loads((release / "release.json").read_text())
            found[f"{release.name}/release.json"] = stable(doc, str(out))
    found["audit"] = stable(json.loads(internal_file(out, "audit.json").read_text()), str(out))
    found["manifest"] = stable(
        json.loads(internal_file(out, "manifest.json").read_text()), str(out)
    )
    return found


def first_rows(out: Path, name: str) -> list[Any]:
    import pandas as pd

    return pd.read_csv(release_dir(out, name) / "data.csv").head(20).values.tolist()


def run_plan(plan: Any, out: Path, *flags: str) -> Path:
    from privpipe.pipelines.run import run

    run(plan, beam_args=list(flags), log=lambda _m: None, insecure_seed=SEED)
    return out


def demo_plan(out: Path, data: Path) -> Any:
    from privpipe.pipelines.cli import DEMO_CONFIG, demo_ledger
    from privpipe.pipelines.plan import load_plan
    from tests.test_runners import without_holdout

    ledger, key = demo_ledger(out / "budget")  # a ledger per run, as `privpipe demo` makes
    plan = load_plan(
        DEMO_CONFIG, output_dir=out, input_override=data, ledger_override=ledger,
        key_file_override=key,
    )  # fmt: skip
    plan = without_holdout(plan)  # a fresh key per run holds out different persons
    # every record a target: a sample of 5,000 comes in the order of a keyed hash whose key
    # is fresh per run, which moves the seeded attack simulations on any runner
    attacks = plan.config.attacks.model_copy(update={"targets": "all"})
    return dataclasses.replace(plan, config=plan.config.model_copy(update={"attacks": attacks}))


def adult_config(folder: Path) -> Path:
    """configs/adult.yaml on Adult's first rows, without its sweep and two of its releases."""
    import yaml

    from tests.conftest import ARX, ROOT

    lines = (ARX / "adult.csv").read_text().splitlines()[: ADULT_ROWS + 1]
    (folder / "adult.csv").write_text("\n".join(lines) + "\n")
    cfg = yaml.safe_load((ROOT / "configs" / "adult.yaml").read_text())
    cfg["input"]["path"] = str(folder / "adult.csv")
    cfg["hierarchies"] = {
        c: {"file": str(ARX / Path(h["file"]).name)} for c, h in cfg["hierarchies"].items()
    }
    cfg.pop("sweep")
    keep = ("k5-s5", "l3-rec", "t02", "mondrian5", "dp1")  # every algorithm and kind once
    cfg["releases"] = [r for r in cfg["releases"] if r["name"] in keep]
    cfg["budget"]["ledger"] = str(folder / "ledger.sqlite")
    cfg["output"]["dir"] = str(folder / "out")
    path = folder / "adult.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_demo_equal_on_dask_and_direct(cluster: Any, tmp_path: Path) -> None:
    """The demo (every release kind, attacks, audit) gives the same outputs on Dask."""
    from privpipe.pipelines.demo_data import write_csv

    data = tmp_path / "demo.csv"
    write_csv(data, DEMO_ROWS)
    direct = run_plan(demo_plan(tmp_path / "direct", data), tmp_path / "direct")
    dask = run_plan(
        demo_plan(tmp_path / "dask", data), tmp_path / "dask",
        "--runner=dask", f"--dask_client_address={cluster.scheduler_address}",
    )  # fmt: skip
    m = json.loads(internal_file(dask, "manifest.json").read_text())
    assert m["runner"] == "dask"
    assert m["timings"]["stages"].get("read", 0) > 0  # the workers' counters came back
    assert outputs(dask) == outputs(direct)
    # rows are shuffled on the workers from a CSPRNG: no run's order is another's
    assert first_rows(dask, "k5") != first_rows(direct, "k5")


def test_adult_equal_on_dask_and_direct(cluster: Any, tmp_path: Path) -> None:
    from privpipe.pipelines.plan import load_plan

    cfg = adult_config(tmp_path)
    direct = run_plan(load_plan(cfg, output_dir=tmp_path / "direct"), tmp_path / "direct")
    dask = run_plan(
        load_plan(cfg, output_dir=tmp_path / "dask"), tmp_path / "dask",
        "--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}",
    )  # fmt: skip
    assert outputs(dask) == outputs(direct)
    assert first_rows(dask, "k5-s5") != first_rows(direct, "k5-s5")


# ------------------------------------------------------------------ runner names


@pytest.mark.parametrize(
    "name", ["dask", "DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"]
)
def test_every_dask_name_gets_privpipes_runner(name: str) -> None:
    from privpipe.pipelines.dask_runner import DaskRunner
    from privpipe.pipelines.run import pipeline_options
    from privpipe.pipelines.runner import runner_for

    assert isinstance(runner_for(pipeline_options([], name)), DaskRunner)


def test_an_unknown_runner_name_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from privpipe.errors import ConfigError
    from privpipe.pipelines.cli import main
    from privpipe.pipelines.run import pipeline_options
    from privpipe.pipelines.runner import runner_for
    from tests.conftest import ROOT

    with pytest.raises(ConfigError, match="--runner Daskk: no such Beam runner; did you mean dask"):
        runner_for(pipeline_options([], "Daskk"))
    assert runner_for(pipeline_options([], "PortableRunner")) is None  # Beam resolves it
    code = main(["run", str(ROOT / "configs" / "adult.yaml"), "--output", str(tmp_path / "o"),
                 "--runner", "Daskk"])  # fmt: skip
    assert code == 2
    assert "no such Beam runner" in capsys.readouterr().err
    out = tmp_path / "o"
    assert not out.exists() or not any(out.iterdir())  # nothing half-written
