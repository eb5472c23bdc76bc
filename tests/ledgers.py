"""Budget ledgers for tests: one place that provisions a config's ledger before a run.

Issue 12 makes ledgers something an operator creates on purpose (`privpipe budget
init`); a run will no longer create one. Tests that run DP releases call
``provision_ledger(config_path)`` before the run, so only this function changes then.
Today a run still creates its ledger itself, so there is nothing to do yet.
"""

from __future__ import annotations

from pathlib import Path


def provision_ledger(config: Path) -> None:
    """Make sure the ledger that ``config``'s budget section names exists (see module doc)."""
    del config
