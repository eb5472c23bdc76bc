"""Attacks against every release of a run, and audit.json (DESIGN.md "Outputs").

After the releases are staged, the driver reads what was published (data.csv and
release.json of each release) plus the accepted input rows' QI and sensitive columns,
which the pipeline wrote to the run's internal folder. The raw rows serve only as the
attacker's targets (their QI values, which the attacker is assumed to know) and to score
whether a guess was right; attacks read nothing else. The raw table itself is attacked
as the no-protection baseline.

- anonymised tables: homogeneity, background knowledge (b = 0…3, worst case or random),
  skewness, similarity (sensitive-value categories), linkage (prosecutor re-identification);
- DP releases: attribute inference from a (QI × sensitive) histogram's noisy cells,
  membership inference on a released count and a differencing attack on two releases
  that differ by one person, each simulated with the release's own noise scale and set
  beside the bound (e^ε+δ)/(1+e^ε).

Targets are records (rows), as in the literature's attacker model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anonymity.hierarchy import Hierarchy
from attacks import (
    AttackerKnowledge,
    AttackResult,
    background_knowledge,
    baseline_table,
    differencing_attack,
    histogram_attribute_inference,
    homogeneity,
    linkage,
    match_targets,
    membership_inference,
    similarity,
    skewness,
)
from dp.noise import SeededTestSampler
from pipelines.config import ANONYMITY_KINDS, DP_KINDS, TABLE_ATTACK_NAMES, AttacksConfig
from pipelines.plan import Plan
from transforms.sink import write_json

RAW_TABLE = "attack_targets"
BASELINE = "raw"


def knowledge_of(cfg: AttacksConfig) -> AttackerKnowledge:
    """The attacker model of the config (background knowledge from its attack entry)."""
    bk = cfg.attacks().get("background_knowledge", {})
    return AttackerKnowledge(
        targets=cfg.targets,
        known=tuple(cfg.known) if cfg.known else None,
        background=int(bk.get("eliminate", 0)),
        background_mode=bk.get("mode", "worst"),
        tau=cfg.tau,
        seed=cfg.seed,
    )


def _table_attacks(
    published: pd.DataFrame,
    raw: pd.DataFrame,
    plan: Plan,
    hierarchies: Mapping[str, Hierarchy],
    guarantee: Mapping[str, Any] | None,
    reference: Mapping[str, float],
) -> dict[str, AttackResult]:
    cfg = plan.config.attacks
    assert cfg is not None
    s = plan.config.schema_
    qis, sa = tuple(s.quasi_identifiers), str(s.sensitive)
    knowledge = knowledge_of(cfg)
    wanted = {k: v for k, v in cfg.attacks().items() if k in TABLE_ATTACK_NAMES}
    if not wanted:
        return {}
    rows = knowledge.target_rows(len(raw))
    view = match_targets(
        published,
        raw.iloc[rows],
        qis,
        sa,
        {q: hierarchies[q] for q in qis if q in hierarchies},
        known=knowledge.known_qis(qis),
        target_rows=rows,
    )
    out: dict[str, AttackResult] = {}
    for name, params in wanted.items():
        if name == "homogeneity":
            out[name] = homogeneity(view, knowledge, guarantee)
        elif name == "background_knowledge":
            out[name] = background_knowledge(view, knowledge, guarantee)
        elif name == "skewness":
            threshold = float(params.get("threshold", 2.0))
            out[name] = skewness(view, guarantee, ratio_threshold=threshold, reference=reference)
        elif name == "similarity":
            out[name] = similarity(view, hierarchies[sa], knowledge, int(params.get("level", 1)))
        elif name == "linkage":
            risk = float(params.get("risk_threshold", 0.2))
            out[name] = linkage(view, guarantee, risk_threshold=risk)
    return out


def _dp_attacks(
    folder: Path, doc: Mapping[str, Any], raw: pd.DataFrame, plan: Plan
) -> dict[str, AttackResult]:
    """Attacks on one DP release: attribute inference where the histogram allows it, and
    membership/differencing simulated with the release's count noise."""
    cfg = plan.config.attacks
    assert cfg is not None
    wanted = cfg.attacks()
    s = plan.config.schema_
    sa = str(s.sensitive)
    params = doc["parameters"]
    eps, delta = float(doc["guarantee"]["epsilon"]), float(doc["guarantee"]["delta"])
    out: dict[str, AttackResult] = {}
    queries: dict[str, Any] = params.get("queries", {})
    first: dict[str, Any] = next(iter(queries.values()), {}) if queries else {}
    keys = [*params.get("partition_by", []), *first.get("group_by", [])]
    levels = first.get("levels", {})
    qis_in = [k for k in keys if k in s.quasi_identifiers and not levels.get(k)]
    if (
        "attribute_inference" in wanted
        and doc["kind"] in ("dp_histogram", "dp_count")
        and len(queries) == 1
        and sa in keys
        and not levels.get(sa)
        and qis_in
        and len(qis_in) == len(keys) - 1
    ):
        histogram = pd.read_csv(
            folder / "data.csv", dtype={k: str for k in keys}, keep_default_na=False
        )
        knowledge = knowledge_of(cfg)
        targets = knowledge.select_targets(raw).astype({q: str for q in [*qis_in, sa]})
        out["attribute_inference"] = histogram_attribute_inference(
            histogram, targets, qis_in, sa, epsilon=eps, delta=delta, knowledge=knowledge
        )
    noise = first.get("count_noise") or first.get("sum_noise")
    if noise and doc["kind"] in ("dp_count", "dp_histogram"):
        table = pd.read_csv(folder / "data.csv")
        count = int(np.median(table["count"])) if len(table) else 0
        for name, fn in (
            ("membership", membership_inference),
            ("differencing", differencing_attack),
        ):
            if name in wanted:
                out[name] = fn(
                    count,
                    scale=float(noise["scale"]),
                    mechanism=noise["mechanism"],
                    sampler=SeededTestSampler(cfg.seed),  # a simulation, not a release
                    trials=int(wanted[name].get("trials", 10_000)),
                    epsilon=eps,
                    delta=delta,
                    seed=cfg.seed,
                )
    return out


def _reference(raw: pd.DataFrame, sa: str) -> dict[str, float]:
    shares = raw[sa].astype(str).value_counts(normalize=True)
    return {str(k): float(v) for k, v in shares.items()}


def run_attacks(
    plan: Plan, staging: Path, work: Path, hierarchies: Mapping[str, Hierarchy]
) -> dict[str, Any]:
    """Every configured attack on the baseline and every staged release → audit.json."""
    cfg = plan.config.attacks
    assert cfg is not None
    t0 = time.perf_counter()
    s = plan.config.schema_
    qis, sa = list(s.quasi_identifiers), str(s.sensitive)
    raw = pd.read_parquet(work / f"{RAW_TABLE}.parquet")
    reference = _reference(raw, sa)
    results: dict[str, dict[str, AttackResult]] = {}
    guarantees: dict[str, Any] = {}
    results[BASELINE] = _table_attacks(
        baseline_table(raw, qis, sa), raw, plan, hierarchies, None, reference
    )
    guarantees[BASELINE] = None
    for r in plan.config.releases:
        folder = staging / "releases" / r.name
        doc = json.loads((folder / "release.json").read_text())
        guarantees[r.name] = doc.get("guarantee")
        if r.kind in ANONYMITY_KINDS:
            published = pd.read_csv(
                folder / "data.csv", dtype=str, keep_default_na=False, usecols=[*qis, sa]
            )
            results[r.name] = _table_attacks(
                published, raw, plan, hierarchies, doc.get("guarantee"), reference
            )
        elif r.kind in DP_KINDS:
            results[r.name] = _dp_attacks(folder, doc, raw, plan)
    knowledge = knowledge_of(cfg)
    audit = {
        "attacker": {
            "targets": cfg.targets,
            "records": len(raw),
            "known": list(knowledge.known_qis(qis)),
            "background_knowledge": knowledge.background,
            "background_mode": knowledge.background_mode,
            "tau": knowledge.tau,
            "seed": knowledge.seed,
        },
        "releases": {
            name: {
                "guarantee": guarantees[name],
                "attacks": {a: publishable(res.as_dict()) for a, res in attacks.items()},
            }
            for name, attacks in results.items()
        },
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json(str(staging / "audit.json"), audit)
    return audit


# details keyed by raw sensitive values (the whole table's distribution p of the skewness
# attack): the audit is itself a publication, and a rare value's share would reveal it
_RAW_VALUE_DETAILS = ("p",)


def publishable(result: dict[str, Any]) -> dict[str, Any]:
    """An attack result without details that name raw values."""
    details = {k: v for k, v in result.get("details", {}).items() if k not in _RAW_VALUE_DETAILS}
    return {**result, "details": details}


def headline(audit: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per release: each attack's headline rate (for the manifest and the console)."""
    return {
        name: {a: float(r["rate"]) for a, r in entry["attacks"].items()}
        for name, entry in audit["releases"].items()
    }
