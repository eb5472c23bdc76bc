"""`privpipe ldp aggregate REPORTS`: collected local-DP reports into frequency estimates.

Collection and aggregation can run as separate jobs: a `local_dp` release with
``write_reports: true`` writes ``internal/local_reports/<name>/reports.csv`` (what a
collector receives: the perturbed reports, never a person id or a true value), and this
command turns such a
file back into the same estimates as the release's data.csv. Aggregation is
post-processing of the reports, so it spends no budget.

Exit codes: 2 for bad arguments (protocol, epsilon, domain size, a domain of the wrong
length), 3 for a reports file that is missing or malformed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from privpipe.dp.local import PROTOCOLS, aggregate, public_halfwidth, reports_from_frame
from privpipe.errors import ConfigError, InputDataError


def _domain(spec: str | None, d: int) -> list[str]:
    if spec is None:
        return [str(i) for i in range(d)]
    p = Path(spec)
    if p.is_file():
        try:
            values = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--domain {p}: cannot read the file ({e})") from None
        values = [v for v in values if v]
    else:
        values = [v.strip() for v in spec.split(",")]
    if len(values) != d:
        raise ConfigError(
            f"--domain: {len(values)} value(s) given but --domain-size is {d}; list the "
            "values in code order (the release.json's parameters.domain)"
        )
    if len(set(values)) != len(values):
        raise ConfigError("--domain: a value is listed twice")
    return values


def read_reports(path: str | Path) -> pd.DataFrame:
    """The reports table (CSV or Parquet), ``bits`` kept as text."""
    p = Path(path)
    if not p.is_file():
        raise InputDataError(f"{p}: no such reports file; check the path")
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p)
        return pd.read_csv(p, dtype={"bits": str}, keep_default_na=False, na_values=[""])
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise InputDataError(f"{p}: cannot read the reports ({e})") from None


def aggregate_reports(
    path: str | Path,
    protocol: str,
    epsilon: float,
    domain_size: int,
    domain: str | None = None,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """value, estimate, ci_low, ci_high: the release's data.csv computed from its reports."""
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"--protocol: unknown local DP protocol {protocol!r}; choose one of "
            f"{', '.join(PROTOCOLS)} (the release.json's parameters.protocol)"
        )
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ConfigError(f"--epsilon: must be a finite number > 0, got {epsilon!r}")
    if domain_size < 2:
        raise ConfigError(f"--domain-size: must be an integer >= 2, got {domain_size}")
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence: must lie strictly between 0 and 1, got {confidence}")
    values = _domain(domain, domain_size)
    frame = read_reports(path)
    try:
        reports = reports_from_frame(frame, protocol, epsilon, domain_size)
    except InputDataError as e:
        raise InputDataError(f"{Path(path).name}: {e}") from None
    est = aggregate(reports, beta=1.0 - confidence)
    # the same interval as the published release: from the estimates alone
    half = public_halfwidth(est.parameters, est.counts, 1.0 - confidence)
    return pd.DataFrame(
        {
            "value": values,
            "estimate": est.counts.astype(np.float64),
            "ci_low": est.counts - half,
            "ci_high": est.counts + half,
        }
    )
