"""Run a command in a fresh process and measure its wall time and peak RSS (whole process tree)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil


def measure(cmd: Sequence[str], interval: float = 0.05, timeout: float = 1800) -> dict[str, Any]:
    """Wall seconds, peak summed RSS of the process and its descendants (MB), and its JSON."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            rss = 0
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    rss += p.memory_info().rss
            peak = max(peak, rss)
        except psutil.Error:
            pass
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            raise TimeoutError(" ".join(cmd))
        time.sleep(interval)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(err[-4000:])
        raise RuntimeError(f"benchmark step failed ({proc.returncode}): {' '.join(cmd)}")
    last = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {}
    return {"wall_s": round(wall, 3), "peak_rss_mb": round(peak / 2**20, 1), **result}


def machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": psutil.cpu_count(logical=True),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
