"""`make bench`: every benchmark in turn; each prints JSON lines (record them in RESULTS.md).

``--save FILE`` also writes every JSON line printed to FILE (``make bench`` hands the demo's
line to ``regress.py``); other arguments go to every benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "bench_io.py",
    "bench_anonymity.py",
    "bench_dp.py",
    "bench_local_dp.py",
    "bench_demo.py",
    "bench_dask.py",  # DirectRunner against Dask with 1 and 2 workers (privpipe[dask])
]


def run(name: str, args: list[str], saved: list[str]) -> int:
    """One benchmark; its output passed through, its JSON lines kept."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / name), *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith("{"):
            saved.append(line)
    return proc.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    save = None
    if "--save" in args:
        i = args.index("--save")
        save = Path(args[i + 1])
        del args[i : i + 2]
    failed = 0
    saved: list[str] = []
    for name in BENCHMARKS:
        print(f"# {name}", flush=True)
        failed |= run(name, args, saved)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text("".join(saved), encoding="utf-8")
    sys.exit(failed)
