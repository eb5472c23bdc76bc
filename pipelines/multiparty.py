"""Multiparty histograms as separate runs: a party's share, and `privpipe multiparty aggregate`.

The trust property of the README's table — each party sees only its own rows — holds on this
path, not in the one-process ``local_dp`` ``parties:`` simulation:

1. party j runs ``privpipe run party.yaml`` on ITS OWN data with a ``dp_party_histogram``
   release (``party: {release_id, index: j, count: m}``). The pipeline counts one value per
   person over the public domain (pipelines/local_release.py jobs, no oracle); the driver
   charges party j's own ledger ε before reading, adds party j's own discrete Laplace noise
   (scale 2/ε: substitution of one person, dp/multiparty.py) and writes
   ``releases/<name>/party.json`` (the share: public to the aggregator; never a row, never an
   exact count), ``data.csv`` and ``release.json``;
2. the aggregator runs ``privpipe multiparty aggregate party0.json … --output DIR``: every
   file must describe the same release (id, domain, ε, neighbour relation, m) with each party
   exactly once (:func:`dp.multiparty.combine_shares`); it writes ``DIR/data.csv`` (the summed
   histogram with intervals) and ``DIR/release.json`` with the guarantee. Summing is
   post-processing: it spends no budget.

With ``--insecure-seed S`` party j draws its noise from :func:`dp.multiparty.party_seed`
(S, release_id, j), exactly as the simulation draws party j's noise for a ``local_dp``
release named release_id, so the two paths can be compared number for number.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privpipe.dp.multiparty import (
    PARTY_FORMAT,
    SUBSTITUTION_L1,
    TRUST_SEPARATE,
    calibration_problems,
    combine_shares,
    party_seed,
    party_share,
)
from privpipe.dp.noise import honest_document, laplace_ci_halfwidth, laplace_scale
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal
from privpipe.pipelines.config import PartyHistogramRelease
from privpipe.pipelines.dp_release import sampler
from privpipe.pipelines.plan import Plan
from privpipe.transforms.local_dp import LocalPartial
from privpipe.transforms.sink import write_json, write_table

PARTY_FILE = "party.json"


def _table(values: Sequence[str], est: np.ndarray, half: float) -> pd.DataFrame:
    est = est.astype(np.float64)
    return pd.DataFrame(
        {"value": list(values), "estimate": est, "ci_low": est - half, "ci_high": est + half}
    )


def publish_party(
    name: str,
    r: PartyHistogramRelease,
    values: Sequence[str],
    partial: LocalPartial,
    plan: Plan,
    staging: Path,
    seed: int | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Noise this party's exact histogram with its own noise; write party.json and the release.

    ``values``: the public domain (then ``other``) in code order; ``partial.support`` holds
    the exact count of each (one value per person).
    """
    t0 = time.perf_counter()
    p = r.party
    values = list(values)
    share = party_share(
        partial.support, r.epsilon, sampler(party_seed(seed, p.release_id, p.index))
    )
    scale = laplace_scale(SUBSTITUTION_L1, r.epsilon)
    problems = calibration_problems(r.epsilon, SUBSTITUTION_L1, scale, "substitution")
    if share.shape != (len(values),):
        problems.append(f"{share.size} noisy counts for {len(values)} domain values")
    if problems:
        raise PrivacyRefusal(
            f"release {name!r} failed its verification: {'; '.join(problems)}; "
            "nothing was published"
        )
    unit = plan.config.schema_.privacy_unit or "row"
    party_doc = {
        "format": PARTY_FORMAT,
        "release_id": p.release_id,
        "party": p.index,
        "parties": p.count,
        "attribute": r.attribute,
        "domain": values,
        "epsilon": r.epsilon,
        "neighbours": "substitution",
        "unit": unit,
        "mechanism": "discrete_laplace",
        "sensitivity": SUBSTITUTION_L1,
        "scale": scale,
        "counts": [int(c) for c in share],
        "insecure_seed": seed,
    }
    half = float(laplace_ci_halfwidth(scale, 1.0 - r.confidence))
    folder = staging / "releases" / name
    folder.mkdir(parents=True, exist_ok=True)
    fmt = plan.config.output.format
    write_table(_table(values, share, half), str(folder / f"data.{fmt}"), fmt)
    write_json(str(folder / PARTY_FILE), party_doc)
    doc = {
        "name": name,
        "kind": "dp_party_histogram",
        "parameters": {
            "attribute": r.attribute,
            "domain": values,
            "other": r.other,
            "party": {"release_id": p.release_id, "index": p.index, "count": p.count},
            "mechanism": "discrete_laplace",
            "sensitivity": SUBSTITUTION_L1,
            "scale": scale,
            "confidence": r.confidence,
            "party_file": PARTY_FILE,
        },
        "guarantee": {
            "epsilon": r.epsilon,
            "delta": 0.0,
            "model": "multiparty (one party's share)",
            "neighbours": "substitution",
            "unit": unit,
            "trust": TRUST_SEPARATE,
        },
        "metrics": {"ci_halfwidth": half},
        "verification": {"ok": True, "problems": []},
        "verified": True,
        "insecure_seed": seed,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json(str(folder / "release.json"), honest_document(doc, seed))
    log(
        f"privpipe: party {p.index} of {p.count} of {p.release_id!r}: share written to "
        f"{name}/{PARTY_FILE} (send it to the aggregator)"
    )
    return {"rows_in": partial.rows_in, "persons": partial.n}


def read_party_file(path: str | Path) -> dict[str, Any]:
    """One party.json (exit 3 when missing or not JSON)."""
    p = Path(path)
    if not p.is_file():
        raise InputDataError(f"{p}: no such party file; check the path")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputDataError(f"{p}: cannot read the party file ({e})") from None
    if not isinstance(doc, dict):
        raise InputDataError(f"{p}: a party file is a JSON object, got {type(doc).__name__}")
    return doc


def aggregate_parties(
    paths: Sequence[str | Path], output: str | Path, confidence: float = 0.95
) -> dict[str, Any]:
    """Check the party files, sum the shares, write DIR/data.csv and DIR/release.json.

    Nothing is written unless every check passes. Returns the release document.
    """
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence: must lie strictly between 0 and 1, got {confidence}")
    docs = [(str(p), read_party_file(p)) for p in paths]
    est, head = combine_shares(docs, beta=1.0 - confidence)
    seeds = sorted({d["insecure_seed"] for _, d in docs if isinstance(d.get("insecure_seed"), int)})
    table = _table(list(head["domain"]), est.counts, est.halfwidth)
    doc = {
        "name": head["release_id"],
        "kind": "multiparty_aggregate",
        "parameters": {
            "attribute": head["attribute"],
            "domain": list(head["domain"]),
            "parties": est.m,
            "party_files": [Path(n).name for n, _ in docs],
            "mechanism": head["mechanism"],
            "sensitivity": head["sensitivity"],
            "scale": head["scale"],
            "confidence": confidence,
        },
        "guarantee": {
            "epsilon": float(head["epsilon"]),
            "delta": 0.0,
            "model": "multiparty",
            "parties": est.m,
            "neighbours": head["neighbours"],
            "unit": head["unit"],
            "trust": TRUST_SEPARATE,
        },
        "metrics": {"variance_per_value": est.variance, "ci_halfwidth": est.halfwidth},
        "insecure_seed": seeds[0] if len(seeds) == 1 else (seeds or None),
    }
    out = Path(output)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_table(table, str(out / "data.csv"), "csv")
        seeded = honest_document(doc, seeds[0]) if seeds else doc  # a seeded share: no claim
        write_json(str(out / "release.json"), seeded | {"insecure_seed": doc["insecure_seed"]})
    except OSError as e:
        raise ConfigError(
            f"--output {out}: cannot write ({e.strerror}); choose another folder"
        ) from None
    if seeds:
        print(
            "privpipe: warning: party files were made with --insecure-seed; the aggregate is "
            "NOT private",
            file=sys.stderr,
        )
    return doc
