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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from anonymity.hierarchy import Hierarchy, canonical_column
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
from dp.noise import SeededTestSampler, planned_guarantee
from pipelines.config import ANONYMITY_KINDS, DP_KINDS, TABLE_ATTACK_NAMES, AttacksConfig
from pipelines.plan import Plan
from privpipe.errors import InputDataError

if TYPE_CHECKING:  # reports (matplotlib) is imported only when a report is written
    from reports import Release

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


def _dp_attacks(release: Release, raw: pd.DataFrame, plan: Plan) -> dict[str, AttackResult]:
    """Attacks on one DP release: attribute inference where the histogram allows it, and
    membership/differencing simulated with the noise of its (first) count query."""
    cfg = plan.config.attacks
    assert cfg is not None
    wanted = cfg.attacks()
    s = plan.config.schema_
    sa = str(s.sensitive)
    doc = release.document
    params = doc["parameters"]
    planned = planned_guarantee(doc)  # an insecure-seed run claims none; attack the plan
    eps, delta = float(planned["epsilon"]), float(planned["delta"])
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
        histogram = release.data.assign(count=pd.to_numeric(release.data["count"]))
        knowledge = knowledge_of(cfg)
        out["attribute_inference"] = histogram_attribute_inference(
            histogram, knowledge.select_targets(raw), qis_in, sa,
            epsilon=eps, delta=delta, knowledge=knowledge,
        )  # fmt: skip
    noise = first.get("count_noise")
    if noise and doc["kind"] in ("dp_count", "dp_histogram"):
        for name, fn in (
            ("membership", membership_inference),
            ("differencing", differencing_attack),
        ):
            if name in wanted:
                # the optimal test's success does not depend on the count: a simulation of
                # this query's noise against the bound of the query's own epsilon
                out[name] = fn(
                    0,
                    scale=float(noise["scale"]),
                    mechanism=noise["mechanism"],
                    sampler=SeededTestSampler(cfg.seed),  # a simulation, not a release
                    trials=int(wanted[name].get("trials", 10_000)),
                    epsilon=float(first.get("epsilon", eps)),
                    delta=delta,
                    sensitivity=float(noise["sensitivity"]),
                    seed=cfg.seed,
                )
    return out


def ml_guess(reports: Any, rng: np.random.Generator) -> np.ndarray:
    """The attacker's guess of each person's value from their own report alone: uniform
    among the values the report supports (GRR: the reported value; unary encodings: the
    set bits; local hashing: the values hashing to the reported bucket)."""
    from dp.local import keyed_hash

    n, d = reports.n, reports.d
    if reports.protocol in ("rr", "grr"):
        return np.asarray(reports.values, dtype=np.int64)
    if reports.bits is not None:
        support = reports.unpacked_bits().astype(bool)
    else:
        values = np.arange(d, dtype=np.int64)
        support = np.stack(
            [keyed_hash(reports.keys, int(v), reports.g) == reports.values for v in values], axis=1
        )
    empty = ~support.any(axis=1)
    support[empty] = True  # nothing supported: a uniform guess over the domain
    weights = rng.random((n, d)) * support  # uniform choice among supported values
    return np.asarray(weights.argmax(axis=1), dtype=np.int64)


def _local_attack(release: Release, raw: pd.DataFrame, plan: Plan) -> dict[str, AttackResult]:
    """The attacker reads a target's own local-DP report (simulated with the release's
    protocol and ε on the targets' true values) and guesses the value it supports."""
    from attacks import report_attack
    from dp.local import perturb
    from dp.secure_random import SeededRandom

    cfg = plan.config.attacks
    assert cfg is not None
    params = release.document["parameters"]
    attribute, domain = params["attribute"], [str(v) for v in params["domain"]]
    if attribute not in raw.columns:
        return {}
    targets = canonical_column(knowledge_of(cfg).select_targets(raw)[attribute])
    codes = pd.Categorical(targets, categories=domain).codes.astype(np.int64)
    codes = codes[codes >= 0]  # values outside the public domain are not reported
    oracle = params["oracle"]
    source = SeededRandom(cfg.seed)  # a simulation of the attacker's view, not a release
    reports = perturb(oracle["protocol"], codes, float(oracle["epsilon"]), len(domain), source)
    guess = ml_guess(reports, np.random.default_rng(cfg.seed))
    result = report_attack(codes, guess, epsilon=float(oracle["epsilon"]), domain_size=len(domain))
    return {"ldp_report": result}


def _reference(raw: pd.DataFrame, sa: str) -> dict[str, float]:
    """The whole table's share of each sensitive value (canonical strings, as published)."""
    shares = pd.Series(canonical_column(raw[sa])).value_counts(normalize=True)
    return {str(k): float(v) for k, v in shares.items()}


ATTACKED_KINDS = (*ANONYMITY_KINDS, *DP_KINDS, "local_dp")


def load_releases(plan: Plan, staging: Path, kinds: Sequence[str]) -> dict[str, Release]:
    """The staged releases of these kinds, each read once (data as published, release.json)."""
    from reports import load_release

    return {
        r.name: load_release(staging / "releases" / r.name)
        for r in plan.config.releases
        if r.kind in kinds
    }


def run_attacks(
    plan: Plan,
    releases: Mapping[str, Release],
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    control: pd.DataFrame | None = None,
) -> dict[str, dict[str, AttackResult]]:
    """Every configured attack on the baseline (``raw``) and on the ``releases`` (continual
    counts are published after the attacks, their state advancing last; the attacks on
    them are those of any DP count).

    ``raw`` holds the members (the published input's rows); ``control`` the control records
    of ``attacks.control`` (same columns, never in any release) or None without a control
    set: the common attacker's baseline (pipelines/control.py)."""
    s = plan.config.schema_
    qis, sa = list(s.quasi_identifiers), str(s.sensitive)
    reference = _reference(raw, sa)
    results: dict[str, dict[str, AttackResult]] = {
        BASELINE: _table_attacks(
            baseline_table(raw, qis, sa), raw, plan, hierarchies, None, reference
        )
    }
    wanted = plan.config.attacks.attacks() if plan.config.attacks else {}
    for name, release in releases.items():
        if release.kind in ANONYMITY_KINDS:
            results[name] = _table_attacks(
                release.data[[*qis, sa]], raw, plan, hierarchies,
                planned_guarantee(release.document), reference,
            )  # fmt: skip
        elif release.kind in DP_KINDS:
            results[name] = _dp_attacks(release, raw, plan)
        elif release.kind == "local_dp" and "ldp_report" in wanted:
            results[name] = _local_attack(release, raw, plan)
    return results


def attacker_summary(
    plan: Plan, records: int, control: pd.DataFrame | None = None
) -> dict[str, Any]:
    """The attacker model of the run, for audit.json (``control``: the control records)."""
    from pipelines.control import control_summary

    cfg = plan.config.attacks
    assert cfg is not None
    knowledge = knowledge_of(cfg)
    return {
        "targets": cfg.targets,
        "records": records,
        "known": list(knowledge.known_qis(plan.config.schema_.quasi_identifiers)),
        "background_knowledge": knowledge.background,
        "background_mode": knowledge.background_mode,
        "tau": knowledge.tau,
        "seed": knowledge.seed,
        "attacks": list(cfg.attacks()),
        "control": control_summary(plan, control),
    }


def audit_columns(plan: Plan) -> list[str]:
    """The columns the audit needs from the accepted rows: QIs and the sensitive attribute."""
    s = plan.config.schema_
    return [*s.quasi_identifiers, *([s.sensitive] if s.sensitive else [])]


def wants_audit(plan: Plan) -> bool:
    """A report needs releases and quasi-identifiers (its workload), unless switched off."""
    rc = plan.config.report
    enabled = rc is None or rc.enabled
    return enabled and bool(plan.config.releases) and bool(plan.config.schema_.quasi_identifiers)


def write_audit(
    plan: Plan,
    staging: Path,
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    attacks: Mapping[str, Mapping[str, AttackResult]] | None,
    manifest: Mapping[str, Any],
    loaded: Mapping[str, Release],
    into: Path | None = None,
    control: pd.DataFrame | None = None,
) -> dict[str, Path]:
    """audit.json, report.md and report.html of the staged run (into ``into``, default the
    staging folder); releases already read for the attacks are not read again."""
    from reports import Run, audit_run, load_release, write_reports

    rc = plan.config.report
    s = plan.config.schema_
    releases = {
        r.name: loaded.get(r.name) or load_release(staging / "releases" / r.name)
        for r in plan.config.releases
    }
    run = Run(staging, manifest, releases)
    per_release = None
    baseline = None
    if attacks is not None:
        # plain dicts; reports.normalise_attacks keeps only whitelisted details (never the
        # raw values, e.g. the skewness attack's whole-table distribution)
        per_release = {
            name: {a: res.as_dict() for a, res in found.items()}
            for name, found in attacks.items()
            if name != BASELINE
        }
        baseline = {a: res.as_dict() for a, res in attacks[BASELINE].items()}
    audit = audit_run(
        run,
        raw,
        hierarchies=hierarchies,
        attacks=per_release,
        baseline_attacks=baseline,
        columns=list(rc.columns) if rc and rc.columns else audit_columns(plan),
        sensitive=s.sensitive,
        queries=[q.model_dump() for q in rc.queries] if rc else (),
        sweeps=plan.sweeps or None,
    )
    if attacks is not None:
        audit["attacker"] = attacker_summary(plan, len(raw), control)
    published = list(manifest.get("published") or [])
    candidates = list(manifest.get("candidates") or [])
    b = plan.config.budget
    audit_ledger = str(plan.resolve(b.audit_ledger)) if b is not None and b.audit_ledger else None
    note = (
        f"Published: {', '.join(published) or 'nothing'}. Candidates (computed and compared, "
        f"never published): {', '.join(candidates) or 'none'}. Every published DP release is "
        f"charged to the dataset's ledger {plan.ledger_path}; DP candidates are "
        + (f"charged to the separate audit ledger {audit_ledger}." if audit_ledger else
           "not charged to any ledger, as they never leave the operator.")
    )  # fmt: skip
    audit["budget"] = {"ledger": str(plan.ledger_path), "audit_ledger": audit_ledger, "note": note}
    audit.setdefault("methodology", {})["publication"] = note
    pub = dict(manifest.get("publication") or {})
    audit["publication"] = pub
    if pub.get("linked"):
        for problem in pub["linked"]:
            audit.setdefault("findings", []).append(
                f"LINKED RELEASES PUBLISHED (accept_linked_releases: true): {problem}"
            )
    return write_reports(into or staging, audit)


def headline(results: Mapping[str, Mapping[str, AttackResult]]) -> dict[str, dict[str, float]]:
    """Per release: each attack's headline rate (for the manifest and the console)."""
    return {
        name: {a: float(r.rates["rate"]) for a, r in found.items()}
        for name, found in results.items()
    }


def read_columns(plan: Plan, columns: list[str]) -> pd.DataFrame:
    """The input's ``columns`` read directly (``privpipe report`` rebuilding a finished run).

    Rows the pipeline rejected (wrong field count) are skipped here too; values are strings,
    which the audit canonicalises like the pipeline's typed values.
    """
    c = plan.config.input
    frames = []
    for path in plan.input_paths:
        if plan.input_format == "parquet":
            frames.append(pd.read_parquet(path, columns=columns).astype(str))
        elif plan.input_format == "jsonl":
            frames.append(pd.read_json(path, lines=True, dtype=False)[columns].astype(str))
        else:
            frames.append(
                pd.read_csv(
                    path,
                    sep=c.delimiter,
                    quotechar=c.quotechar,
                    encoding=c.encoding,
                    header=0 if c.header else None,
                    names=None if c.header else c.columns,
                    usecols=columns,
                    dtype=str,
                    keep_default_na=False,
                    on_bad_lines="skip",
                    encoding_errors="strict",
                )
            )
    return pd.concat(frames, ignore_index=True)


def members_columns(plan: Plan, run_dir: Path, columns: list[str]) -> pd.DataFrame:
    """The audit ``columns`` of a holdout run's members, split again with the run's key
    (``internal/holdout.key``): the input's own reader and the same holdout transform, so
    the rebuilt truth holds exactly the rows the run published from."""
    import tempfile

    import apache_beam as beam

    from pipelines.control import holdout_share, read_key
    from transforms.holdout import MEMBERS, HoldOut
    from transforms.io import ReadMicrodata
    from transforms.sink import WriteTable

    key = read_key(run_dir)
    share = holdout_share(plan)
    if share is None:
        raise InputDataError(
            f"{run_dir}: the run held persons out but its config has no "
            "attacks.control.holdout any more; rebuild with the run's config"
        )
    unit = plan.config.schema_.privacy_unit
    with tempfile.TemporaryDirectory(prefix="privpipe-report-") as work:
        with beam.Pipeline(runner="DirectRunner") as p:
            read = p | "Read" >> ReadMicrodata(plan.input_spec())
            _ = (
                (read["batches"] | "HoldOut" >> HoldOut(share, key, unit))[MEMBERS]
                | "Members" >> beam.Map(lambda df, c: df[c], columns)
                | "Write" >> (WriteTable(work, RAW_TABLE, columns, "parquet"))
            )
        return pd.read_parquet(Path(work) / f"{RAW_TABLE}.parquet")


def rebuild(run_dirs: list[Path], output: Path | None) -> Path:
    """``privpipe report``: the audit of finished runs rebuilt from their outputs and input.

    Attack results are taken from each run's audit.json (attacks are not re-run); utility
    is recomputed against the input named in the manifest. One run: its report files are
    replaced; several: a comparison (runs as series) is written to ``output``.
    """
    from pipelines.hierarchies import HierarchyResolver
    from pipelines.plan import load_plan
    from privpipe.errors import ConfigError
    from reports import audit_run, compare_runs, load_run, write_reports

    if len(run_dirs) > 1 and output is None:
        raise ConfigError("several runs are compared into a new folder: give --output DIR")
    audits = []
    labels = []
    for d in run_dirs:
        manifest_path = d / "internal" / "manifest.json"
        if not manifest_path.is_file():
            raise InputDataError(
                f"{d}: not a privpipe run folder (no internal/manifest.json); give the run's "
                "output folder (the one holding public/ and internal/)"
            )
        manifest = json.loads(manifest_path.read_text())
        config = Path(manifest["config"])
        if not config.is_file():
            raise InputDataError(f"{d}: the run's config {config} is gone; cannot rebuild")
        inputs = manifest["input"]
        plan = load_plan(
            config, output_dir=d, input_override=inputs[0] if len(inputs) == 1 else None
        )
        cols = audit_columns(plan)
        held = (manifest.get("control") or {}).get("source") == "holdout"
        raw = members_columns(plan, d, cols) if held else read_columns(plan, cols)
        counts = {c: raw[c].value_counts() for c in cols}
        hierarchies = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)(counts)
        previous = {}
        if (d / "internal" / "audit.json").is_file():
            previous = json.loads((d / "internal" / "audit.json").read_text())
        attacks = {
            name: entry["attacks"]
            for name, entry in previous.get("releases", {}).items()
            if entry.get("attacks")
        }
        baseline = (previous.get("baseline") or {}).get("attacks")
        rc = plan.config.report
        audit = audit_run(
            load_run(d),
            raw,
            hierarchies=hierarchies,
            attacks=attacks or None,
            baseline_attacks=baseline,
            columns=list(rc.columns) if rc and rc.columns else cols,
            sensitive=plan.config.schema_.sensitive,
            queries=[q.model_dump() for q in rc.queries] if rc else (),
            sweeps=plan.sweeps or None,
        )
        for key in ("attacker", "publication", "budget"):
            if key in previous:
                audit[key] = previous[key]
        note = (previous.get("methodology") or {}).get("publication")
        if note:
            audit.setdefault("methodology", {})["publication"] = note
        linked = [f for f in previous.get("findings") or [] if f.startswith("LINKED RELEASES")]
        if linked:
            audit.setdefault("findings", []).extend(linked)
        audits.append(audit)
        labels.append(str(manifest.get("run_id", d.name)))
    if len(audits) == 1:
        target = output or run_dirs[0] / "internal"
        target.mkdir(parents=True, exist_ok=True)
        return write_reports(target, audits[0])["report.html"]
    assert output is not None
    output.mkdir(parents=True, exist_ok=True)
    return write_reports(output, compare_runs(audits, labels))["report.html"]
