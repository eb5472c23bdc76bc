"""`make bench`: every benchmark in turn; each prints JSON lines (record them in RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["bench_io.py", "bench_anonymity.py", "bench_dp.py", "bench_local_dp.py"]

if __name__ == "__main__":
    failed = 0
    for name in BENCHMARKS:
        print(f"# {name}", flush=True)
        failed |= subprocess.call([sys.executable, str(HERE / name), *sys.argv[1:]])
    sys.exit(failed)
