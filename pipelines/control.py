"""The control records of a run (``attacks.control``): where they come from, the holdout
key, and what the driver reads back (REFERENCE.md "Measuring leakage against a baseline").

- ``{holdout: share}``: :class:`transforms.holdout.HoldOut` splits the input right after the
  read; the run's fresh key is kept in ``DIR/internal/holdout.key`` (mode 0600, never in
  public/) so ``privpipe report`` can rebuild the audit with the same members.
- ``{file: path}``: the file is read by the input's own reader and validation; any bad row
  stops the run (exit 3) naming the file and line.

Either way the control rows' audit columns reach the driver through the private work
folder (:data:`CONTROL_TABLE`); the number of control records goes to internal files only.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pandas as pd

from privpipe.attacks.control import OlderKeyScheme, key_from_hex, key_to_hex
from privpipe.errors import ConfigError, InputDataError
from privpipe.pipelines.config import ControlConfig
from privpipe.pipelines.plan import _EXTENSIONS, Plan
from privpipe.transforms.io import InputSpec

CONTROL_TABLE = "attack_controls"  # work/<name>.parquet: the control rows' audit columns
CONTROL_REJECTED = "control_rejected"  # work/<name>.csv: bad rows of a control file
HOLDOUT_KEY_FILE = "holdout.key"  # internal/<name>: the run's holdout key (rule and hex, 0600)
NO_CONTROL = "no control set (attacks.control)"


def control_config(plan: Plan) -> ControlConfig | None:
    """The config's ``attacks.control`` (None without attacks or without a control set)."""
    attacks = plan.config.attacks
    return None if attacks is None else attacks.control


def holdout_share(plan: Plan) -> float | None:
    """The share of persons held out of the input, or None (no holdout)."""
    c = control_config(plan)
    return None if c is None else c.holdout


def control_spec(plan: Plan) -> InputSpec | None:
    """How to read ``attacks.control.file`` (the input's reader settings; its format from
    the extension, else the input's); ConfigError (exit 2) if the file does not exist."""
    c = control_config(plan)
    if c is None or c.file is None:
        return None
    path = plan.resolve(c.file)
    if not path.is_file():
        raise ConfigError(
            f"{plan.config_path.name}: attacks.control.file: {path} does not exist; give a "
            "file of records of the same population that are not in the input (same "
            "columns), or use attacks.control: {holdout: 0.1}"
        )
    fmt = _EXTENSIONS.get(path.suffix.lower(), plan.input_format)
    return dataclasses.replace(plan.input_spec(), paths=(str(path),), format=fmt)  # type: ignore[arg-type]


def write_key(internal: Path, key: str) -> Path:
    """The run's holdout key into ``internal/holdout.key``, readable by the owner only."""
    path = internal / HOLDOUT_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key_to_hex(key) + "\n")
    return path


def read_key(run_dir: Path) -> str:
    """A finished run's holdout key (``privpipe report``); InputDataError if it is missing
    or damaged, or was written for an older privpipe's holdout rule."""
    path = run_dir / "internal" / HOLDOUT_KEY_FILE
    try:
        return key_from_hex(path.read_text(encoding="ascii"))
    except OlderKeyScheme as e:
        raise InputDataError(
            f"{path}: {e}; this privpipe would hold out other persons, so the audit cannot "
            "be rebuilt with the run's members: rebuild it with the privpipe version that "
            "made the run (its manifest names it), or run the config again"
        ) from None
    except (OSError, ValueError, UnicodeError):
        raise InputDataError(
            f"{path}: the run held persons out (attacks.control.holdout) but its holdout key "
            "is missing or damaged; the audit cannot be rebuilt with the same members"
        ) from None


def load_controls(plan: Plan, work: Path) -> pd.DataFrame | None:
    """The control rows' audit columns the pipeline wrote (None without a control set);
    InputDataError (exit 3) naming the file and line if a control file had a bad row."""
    c = control_config(plan)
    if c is None:
        return None
    rejected = work / f"{CONTROL_REJECTED}.csv"
    if c.file is not None and rejected.exists():
        bad = pd.read_csv(rejected, dtype={"file": str, "reason": str})
        if len(bad):
            first = bad.sort_values(["line"]).head(3)
            where = "; ".join(
                f"line {ln}: {r}" for ln, r in zip(first["line"], first["reason"], strict=True)
            )
            raise InputDataError(
                f"{plan.resolve(c.file)}: attacks.control.file has {len(bad)} row(s) the "
                f"input's reader rejects ({where}); fix them (the control file is read and "
                "validated like the input)"
            )
    if not (work / f"{CONTROL_TABLE}_counts.parquet").exists():
        return None
    from privpipe.pipelines.audit import load_truth

    # the control records' sample of targets (``attrs["records"]``: how many there were)
    return load_truth(plan, work, CONTROL_TABLE)[1]


def control_records(control: pd.DataFrame | None) -> int:
    """How many control records the run held out or read (the staged sample says it)."""
    if control is None:
        return 0
    return int(control.attrs.get("records", len(control)))


def control_summary(plan: Plan, control: pd.DataFrame | None) -> dict[str, Any]:
    """``audit["attacker"]["control"]`` (contract §1): source, share, records."""
    c = control_config(plan)
    if c is None:
        return {"source": None, "share": None, "records": 0}
    return {
        "source": "holdout" if c.holdout is not None else "file",
        "share": c.holdout,
        "records": control_records(control),
    }
