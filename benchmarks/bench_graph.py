"""Beam graph size and cost of the demo config: ParDo count, construction and proto seconds.

Beam inspects every method of every DoFn (``userstate.get_dofn_specs``) when the graph is
built and again when it is turned into its runner proto for submission, so both times grow
with the number of ParDos. This builds the demo config's whole graph (every release, DP
and local DP jobs, the audit steps) on a small generated input, without running it.

    python benchmarks/bench_graph.py [--config configs/demo.yaml] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import apache_beam as beam  # noqa: E402

from benchmarks._measure import machine  # noqa: E402

PARDO_URN = "beam:transform:pardo:v1"


def graph_size(proto: object) -> dict[str, int]:
    """Leaf transforms of the runner proto by kind (ParDo, GroupByKey, Flatten, ...)."""
    kinds: Counter[str] = Counter()
    for t in proto.components.transforms.values():  # type: ignore[attr-defined]
        if not t.subtransforms:
            kinds[t.spec.urn.split(":")[2] if t.spec.urn else "primitive"] += 1
    return dict(kinds)


def build_once(config: Path, data: Path, out: Path) -> dict[str, object]:
    from privpipe.pipelines.continual_release import continual_jobs
    from privpipe.pipelines.dp_release import dp_jobs
    from privpipe.pipelines.local_release import local_jobs
    from privpipe.pipelines.output import RunOutput, new_run_id
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.run import build_graph, pipeline_options
    from privpipe.transforms.io import inspect_input

    plan = load_plan(config, output_dir=out, input_override=data)
    spec = plan.input_spec()
    columns = inspect_input(spec)
    out_ = RunOutput(plan.output_dir, new_run_id())
    t0, c0 = time.perf_counter(), time.process_time()
    p = beam.Pipeline(options=pipeline_options([], None))
    build_graph(
        p, spec, columns, plan, out_, dp_jobs(plan), None, local_jobs(plan), continual_jobs(plan),
        "0" * 64,
    )  # fmt: skip
    t1, c1 = time.perf_counter(), time.process_time()
    proto = p.to_runner_api()
    t2, c2 = time.perf_counter(), time.process_time()
    kinds = graph_size(proto)
    return {
        "construct_s": round(t1 - t0, 3),
        "proto_s": round(t2 - t1, 3),
        "construct_cpu_s": round(c1 - c0, 3),
        "proto_cpu_s": round(c2 - c1, 3),
        "pardos": kinds.get("pardo", 0),
        "transforms": sum(kinds.values()),
        "kinds": kinds,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps({"benchmark": "graph", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                      "machine": machine()}), flush=True)  # fmt: skip
    from privpipe.pipelines.demo_data import write_csv

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        data = write_csv(tmp / "input" / "demo.csv", 2_000, seed=1)
        for _ in range(args.repeat):
            print(json.dumps(build_once(Path(args.config), Path(data), tmp / "out")), flush=True)


if __name__ == "__main__":
    main()
