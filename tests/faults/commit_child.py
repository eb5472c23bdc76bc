"""A child process publishing one run into DIR; the fault corpus kills it or races it.

    python commit_child.py DIR RUN_ID [wait]

Stages internal/{manifest.json,report.md,audit.json} and public/<RUN_ID>/data.csv, each
holding RUN_ID, then commits. With ``wait`` it prints "staged" once its RunOutput holds
DIR and waits for a line on stdin before committing (the race test). Exit codes: 0
committed, else the PrivpipeError's exit code (its message on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipelines.output import RunOutput
from privpipe.errors import PrivpipeError

FILES = ("manifest.json", "report.md", "audit.json")


def main() -> int:
    out_dir, run_id = Path(sys.argv[1]), sys.argv[2]
    try:
        out = RunOutput(out_dir, run_id)
    except PrivpipeError as e:
        print(f"privpipe: error: {e}", file=sys.stderr)
        return e.exit_code
    for note in out.notes:
        print(note)
    for name in FILES:
        (out.internal / name).write_text(run_id)
    (out.releases / run_id).mkdir()
    (out.releases / run_id / "data.csv").write_text(run_id)
    out.arrange([run_id])
    if sys.argv[3:] == ["wait"]:
        print("staged", flush=True)
        sys.stdin.readline()
    out.commit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
