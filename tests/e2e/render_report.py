"""`make e2e`: render the demo's report.html in headless Chromium as a person would see it.

Installs Debian's chromium if it is missing (apt-get; needs root), runs the demo (unless a
run folder is given), opens report.html headless, fails on any browser console message
(the report has no scripts, so any message means something is broken: a bad SVG, a
blocked resource), and saves a PNG screenshot beside the report.

    python tests/e2e/render_report.py [RUN_DIR]
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--enable-logging=stderr",
    "--v=0",
    "--hide-scrollbars",
    "--window-size=1280,4000",
]
CONSOLE = re.compile(r"CONSOLE|Uncaught|Failed to load resource|net::ERR_")


def chromium() -> str:
    """The chromium binary, installed from Debian's packages if missing."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    print("e2e: installing chromium (apt-get)", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True)
    found = shutil.which("chromium")
    if not found:
        sys.exit("e2e: chromium could not be installed; install it with apt-get install chromium")
    return found


def main() -> int:
    if len(sys.argv) > 1:
        run_dir = Path(sys.argv[1]).resolve()
    else:
        run_dir = ROOT / "demo-out"
        subprocess.run(
            [sys.executable, "-m", "privpipe.pipelines.cli", "demo", "--output", str(run_dir)],
            check=True,
            cwd=ROOT,
        )
    report = run_dir / "internal" / "report.html"
    if not report.is_file():
        sys.exit(f"e2e: {report} not found; run the demo first")
    shot = report.with_name("report.png")
    shot.unlink(missing_ok=True)
    proc = subprocess.run(
        [chromium(), *FLAGS, f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    problems = [line for line in proc.stderr.splitlines() if CONSOLE.search(line)]
    if proc.returncode != 0:
        problems.append(f"chromium exited with {proc.returncode}")
    if not shot.is_file() or shot.stat().st_size < 10_000:
        problems.append(f"no screenshot at {shot}")
    if problems:
        print("e2e: FAILED\n" + "\n".join(problems), file=sys.stderr)
        return 1
    print(f"e2e: report.html rendered without console errors; screenshot {shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
