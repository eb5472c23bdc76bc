"""The audit's driver stages alone, replayed on a finished demo run: CPU s, wall s, peak RSS.

Two steps, so the (long) pipeline runs once and the audit can be measured again and again,
on this code or another checkout (``PYTHONPATH=<checkout>``):

    python benchmarks/bench_audit.py prepare OUT --data demo.csv --rows N
        ``privpipe demo`` on ``demo.csv`` into OUT, skipping the audit and keeping the run's
        private work folder (the staged truth, targets, published counts); its path goes to
        OUT/work.txt.
    python benchmarks/bench_audit.py audit OUT [--profile FILE]
        In a fresh process: what ``pipelines.run._run`` does after the pipeline (load the
        truth, attacks, the publication check, the common attacker, utility, publication
        attacks, report), each stage timed (wall and this process's CPU), then the peak RSS
        of the process (imports included). Prints one JSON line. ``--profile``: a cProfile
        dump of the whole replay.

The replay writes its report into a temporary folder; OUT is not modified.
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def prepare(out: Path, data: Path, rows: int) -> None:
    """The demo on ``data`` into ``out`` with the driver's audit skipped, work kept."""
    import privpipe.pipelines.output as output
    import privpipe.pipelines.run as run
    from privpipe.pipelines.cli import _demo

    kept: list[Path] = []

    def keep_work(self: Any) -> None:  # a copy of the work folder outlives the run (a
        if self._work is not None:  # later run's recovery removes the unlocked original)
            import shutil

            shutil.copytree(self._work, out / "work", dirs_exist_ok=True)
            shutil.rmtree(self._work, ignore_errors=True)
            kept.append(out / "work")

    output.RunOutput._drop_work = keep_work  # type: ignore[method-assign]
    run.wants_audit = lambda plan: False  # type: ignore[assignment]
    run.load_releases = lambda *a, **k: {}  # type: ignore[assignment]
    run.run_attacks = lambda *a, **k: {"raw": {}}  # type: ignore[assignment]
    run.check_combination = lambda *a, **k: {}  # type: ignore[assignment]
    code = _demo(str(out), rows, 20261122, None, [], None, str(data))
    if code != 0 or not kept:
        raise SystemExit(f"the demo failed ({code})")
    (out / "work.txt").write_text(str(kept[-1]) + "\n")
    print(f"prepared {out} (work {kept[-1]})")


@contextmanager
def timed(into: dict[str, dict[str, float]], name: str) -> Iterator[None]:
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        into[name] = {
            "wall_s": round(time.perf_counter() - w0, 3),
            "cpu_s": round(time.process_time() - c0, 3),
        }


def replay(out: Path) -> dict[str, Any]:
    """The driver's audit after the pipeline, as ``_run`` calls it, each stage timed."""
    from privpipe.pipelines.audit import (
        ATTACKED_KINDS,
        common_releases,
        load_releases,
        load_truth,
        run_attacks,
        run_common,
        write_audit,
    )
    from privpipe.pipelines.continual_release import continual_jobs
    from privpipe.pipelines.control import load_controls
    from privpipe.pipelines.dp_release import dp_jobs
    from privpipe.pipelines.hierarchies import HierarchyResolver
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.publication import check_combination, dp_count_keys
    from privpipe.transforms.profile import split_internal
    from privpipe.transforms.sink import load_json

    work = Path((out / "work.txt").read_text().strip())
    ran = json.loads((out / "internal" / "manifest.json").read_text())
    plan = load_plan(
        ran["config"],
        output_dir=out,
        input_override=ran["input"][0],
        ledger_override=out / "budget" / "ledger.sqlite",
        key_file_override=out / "budget" / "ledger.key",
    )
    manifest = json.loads((out / "internal" / "manifest.json").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    staging = scratch / "staging"
    (staging / "releases").mkdir(parents=True)
    for folder in (out / "public", out / "internal" / "candidates"):
        for p in sorted(folder.iterdir()) if folder.is_dir() else []:
            if p.is_dir():
                (staging / "releases" / p.name).symlink_to(p)
    stages: dict[str, dict[str, float]] = {}
    c0, w0 = time.process_time(), time.perf_counter()
    with_work = "work" in inspect.signature(load_releases).parameters
    kw: dict[str, Any] = {"work": work} if with_work else {}
    profile, value_counts = split_internal(load_json(str(work / "profile.json")))
    hierarchies = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)(value_counts)
    control = load_controls(plan, work)
    with timed(stages, "load_truth"):
        raw, targets = load_truth(plan, work)
    with timed(stages, "attacks"):
        loaded = load_releases(plan, staging, ATTACKED_KINDS, **kw)
        results = run_attacks(plan, loaded, raw, hierarchies, control=control, targets=targets)
    chosen = list(manifest.get("published") or [])
    publication = {"published": chosen, "candidates": manifest.get("candidates")}
    with timed(stages, "publication_check"):
        check_kw = (
            {"work": work} if "work" in inspect.signature(check_combination).parameters else {}
        )
        publication |= check_combination(
            plan, staging / "releases", loaded, chosen, raw, hierarchies,
            dp_count_keys([*dp_jobs(plan), *continual_jobs(plan)]), lambda m: None, **check_kw,
        )  # fmt: skip
    manifest = {**manifest, "publication": publication}
    with timed(stages, "common"):
        every = common_releases(plan, staging, loaded, **kw)
        common = run_common(plan, every, raw, hierarchies, control=control, targets=targets)
    loaded = {**loaded, **every}
    from privpipe.timing import StageClock, active

    clock = StageClock()
    with timed(stages, "audit"), active(clock):
        write_audit(
            plan, staging, raw, hierarchies, results, manifest, loaded,
            into=scratch / "internal", common=common, work=work, control=control,
            targets=targets,
        )  # fmt: skip
    inner = clock.timings()["stages"]
    audit = json.loads((scratch / "internal" / "audit.json").read_text())
    return {
        "rows": int(profile["rows"]),
        "with_published_counts": with_work,
        "driver_cpu_s": round(time.process_time() - c0, 2),
        "driver_wall_s": round(time.perf_counter() - w0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stages": stages,
        "audit_inner_wall_s": {k: round(v, 2) for k, v in inner.items()},
        "report": str(scratch / "internal" / "audit.json"),
        "attack_rates": {
            n: {a: r.rates.get("rate") for a, r in found.items()} for n, found in results.items()
        },
        "publication_breaches": sum(
            bool(e.get("breach")) for v in audit["publication_attacks"].values() for e in v
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out", type=Path)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--rows", type=int, required=True)
    a = sub.add_parser("audit")
    a.add_argument("out", type=Path)
    a.add_argument("--profile", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.out.resolve(), args.data.resolve(), args.rows)
        return 0
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        found = prof.runcall(replay, args.out.resolve())
        prof.dump_stats(str(args.profile))
    else:
        found = replay(args.out.resolve())
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
