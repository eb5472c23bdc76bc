"""Budget ledgers for tests: one place that provisions a config's ledger before a run.

Issue 12: a run never creates a ledger; an operator creates it on purpose (`privpipe
budget init`). Tests that run DP releases call ``provision_ledger(config_path)`` before
the run. The key is the session's PRIVPIPE_LEDGER_KEY (tests/conftest.py) unless the
config names a key file, and the heads file lands in the test's tmp folder (conftest
points XDG_STATE_HOME there) unless the config names one.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from privpipe.dp.budget import ApproxBudget, to_fraction
from privpipe.dp.ledger import Ledger, ledger_path
from privpipe.dp.ledger_auth import LedgerKey, load_key, new_key_file

TEST_KEY = "privpipe-tests-ledger-key-0123456789abcdef0123456789abcdef"


def config_key(config: Path, dataset: str | None = None) -> LedgerKey:
    """The ledger key (and heads file) that ``config``'s budget section names."""
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    b = cfg["budget"]

    def at(p: str | None) -> Path | None:
        return None if p is None else config.parent / os.path.expanduser(p)

    key_file = at(b.get("key_file"))
    if key_file is not None and not key_file.exists():
        new_key_file(key_file)
    return load_key(
        dataset or str(cfg["name"]), key_file, b.get("key_env"), at(b.get("heads_file"))
    )


def provision_ledger(config: Path, epsilon: float | None = None) -> Path:
    """Create the ledger (and audit ledger) ``config``'s budget section names, with its
    lifetime (or ``epsilon`` when the config gives none); an existing one is kept, and so is
    a dataset the heads file already knows (the run then finds it moved or deleted)."""
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    if not cfg.get("budget"):
        return Path()
    b, name = cfg["budget"], str(cfg["name"])
    eps = b.get("lifetime_epsilon", epsilon)
    assert eps is not None, "the config has no lifetime_epsilon: pass epsilon="
    life = ApproxBudget(to_fraction(eps, "eps"), to_fraction(b.get("lifetime_delta", 0), "d"))
    made = Path()
    for key, dataset in (("ledger", name), ("audit_ledger", f"{name}.audit")):
        if b.get(key) is None:
            continue
        path = config.parent / os.path.expanduser(b[key])
        if path.is_dir():
            path = ledger_path(path, dataset)
        key = config_key(config, dataset)
        if not path.exists() and dataset not in key.read_heads():  # never restart a lifetime
            Ledger.create(path, dataset, life, key)
        made = made if key == "audit_ledger" else path.resolve()
    return made


def open_config_ledger(config: Path) -> Ledger:
    """The config's ledger, opened and verified like a run opens it."""
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    path = config.parent / os.path.expanduser(cfg["budget"]["ledger"])
    return Ledger.open(path, str(cfg["name"]), config_key(config))
