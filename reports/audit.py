"""The comparative audit: one JSON document per run (DESIGN.md "Outputs": audit.json).

Shape (stable keys; more may be added)::

    {"format": "privpipe-audit/1",
     "run": {run_id, name, finished, privpipe_version, config_sha256},
     "dataset": {rows, quasi_identifiers, sensitive, columns: {c: {distinct}},
                 qi_combinations: {distinct, unique, unique_share_of_rows, ...}},
     "releases": {<name>: {kind, guarantee, guarantee_text, verified, records,
                           utility: {...metrics...}, information_loss: {...} | None,
                           attacks: {<attack>: {rate, ..., targets, interval, bound}},
                           summary: {error, attack, attack_success, bound}}},
     "baseline": {... same as a release, kind "raw" ...}        (when given)
     "sweeps": {<sweep>: [release names in order]},
     "findings": ["plain words", ...],
     "methodology": {workload, utility, attacker_model, attacks, report_privacy}}

The report is a publication, so the audit holds aggregates only: rates, errors, counts
of rows/classes/queries, column names and parameters. Attack ``details`` are copied
through a whitelist of aggregate keys (an attack may keep e.g. a true cell count there
for its own use); nothing is read from the raw data except through
``reports.utility``/``reports.workload``, which return aggregates.

Pure core: pandas, numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.result import AttackResult, plain
from privpipe.attacks.stats import wilson_interval
from privpipe.reports.distributions import distributions, generalisation_levels
from privpipe.reports.run import ANONYMISED_KINDS, Release, Run
from privpipe.reports.utility import (
    COMMON_RULE,
    UtilityOptions,
    answerer_of,
    raw_release,
    release_utility,
)
from privpipe.reports.workload import Workload, build_workload, true_answers

__all__ = [
    "AUDIT_FORMAT",
    "COMMON_DEFINITIONS",
    "COMMON_METHODOLOGY",
    "audit_run",
    "build_audit",
    "common_summary",
    "compare_runs",
    "comparison_findings",
    "findings",
    "guarantee_text",
    "normalise_attacks",
    "release_entry",
]

AUDIT_FORMAT: Final = "privpipe-audit/1"
BASELINE: Final = "raw data (no protection)"
COMMON_BASELINE: Final = "raw"  # the baseline's key in audit_run's ``common``

SAFE_DETAILS: Final = frozenset(
    {
        "tau",
        "known_qis",
        "published_rows",
        "suppressed_rows",
        "targets_without_candidates",
        "mean_candidate_rows",
        "mean_candidate_classes",
        "b",
        "mode",
        "seed",
        "epsilon",
        "delta",
        "mechanism",
        "scale",
        "expected_success",
        "level",
        "risk_threshold",
        "width_threshold",
        "domain_size",
        "odds_bound",
        "trials",
        "shift",
        "uniform_prior_bound",
        "prior",
    }
)

ATTACK_DEFINITIONS: Final = {
    "homogeneity": "share of targets whose candidate rows (the published classes matching "
    "their known quasi-identifiers) all share one sensitive value",
    "background_knowledge": "homogeneity after the attacker rules out b sensitive values "
    "per target; bounded by c/(c+1) under recursive (c,l)-diversity",
    "skewness": "how far a target's class distribution of the sensitive attribute departs "
    "from the table's (bounded by t under t-closeness)",
    "similarity": "share of targets whose candidates share one semantic category of the "
    "sensitive attribute (its hierarchy)",
    "linkage": "re-identification: average prosecutor success 1/|candidate rows| over the "
    "targets (each at most 1/k under k-anonymity); 'uniques' is the share matched to one row",
    "proximity": "share of targets whose candidate numeric sensitive values lie in a narrow range",
    "dp_attribute_inference": "attribute inference from a noisy (QI x SA) histogram; "
    "per-person success is bounded by e^ε/(1+e^ε) (+δ)",
    "membership_inference": "likelihood-ratio test on a released count: was the target in?",
    "differencing": "difference of two releases that differ by one person",
    # the same attacks under the names a config uses (`attacks.run`)
    "attribute_inference": "attribute inference from a noisy (QI x SA) histogram; "
    "per-person success is bounded by e^ε/(1+e^ε) (+δ)",
    "membership": "likelihood-ratio test on a released count: was the target in? "
    "(simulated with the release's own noise)",
    "ldp_report": "guessing a person's value from their own local-DP report",
}

COMMON_DEFINITIONS: Final = {
    "attribute_accuracy": "common attacker: share of targets whose sensitive value it guesses "
    "right (MAP of its posterior given the release, the target's known quasi-identifiers and "
    "b ruled-out values); the same attack and scoring for every release and the raw table",
    "prior_accuracy": "the same guess rule from the public prior alone (the sensitive "
    "attribute's distribution over the input): what population statistics give",
    "attribute_advantage": "(accuracy - prior accuracy) / (1 - prior accuracy): the share of "
    "the prior's wrong guesses the release turns right",
    "control_accuracy": "the same attack on control records (same population, not in the "
    "input): what the release teaches about everyone",
    "attribute_risk": "anonymeter risk (accuracy - control accuracy) / (1 - control "
    "accuracy): what the release leaks about its members beyond what it teaches about anyone",
    "membership_advantage": "TPR - FPR of the common membership test (members vs control "
    "records, threshold chosen on one half, measured on the other); bounded by "
    "(e^ε - 1 + 2δ)/(e^ε + 1) under (ε,δ)-DP",
    "attribute_bound": "for DP releases: the MAP accuracy the guarantee allows from the real "
    "prior, e^ε'π*/(e^ε'π* + 1 - π*) (+δ), ε' bounding the likelihood ratio between two "
    "values of one record and π* the largest prior share left after elimination",
}
"""Glossary of the common attacker's rates (the report renders it)."""

COMMON_METHODOLOGY: Final = {
    "knowledge": "each target's known quasi-identifiers and b sensitive values it rules out "
    "(worst case: the b wrong values most likely under its posterior; or b random true "
    "negatives), the same for every release",
    "guess": "the most likely sensitive value (MAP) of the posterior given the published "
    "artefact, after elimination: raw table - the rows with the target's exact known "
    "quasi-identifiers; anonymised tables - the sensitive counts of the classes covering them "
    "(suppressed block: the block's); DP counts with sensitive cells - the noisy cells "
    "(clamped at 0) of the target's cell; DP releases without sensitive cells - the public "
    "prior; local DP - P(own report | value) x prior; no evidence - the prior",
    "scoring": "a guess counts only if it equals the target's true value; accuracy with a "
    "Wilson 95% interval",
    "baselines": "the public prior (the input's sensitive distribution, same guess rule, same "
    "b) and, when attacks.control gives held-out records, the same attack on them "
    "(anonymeter risk)",
    "bound": "DP and local DP: a record's value changes the output's likelihood by at most "
    "e^ε' (2/scale per discrete-Laplace count query, else 2ε; local DP: the oracle's ε), so "
    "the accuracy is at most e^ε'π/(e^ε'π + 1 - π) (+δ), π the prior mass of the b+1 most "
    "common values; population correlations a DP table publishes can exceed it (the control "
    "baseline separates the two); none for anonymised tables",
    "membership": "score = published evidence for the record (matching published rows, the "
    "noisy count of its cell, the estimate of its value); threshold chosen on one half of "
    "members and controls, TPR - FPR measured on the other half (Newcombe interval)",
}
"""methodology.common_attacker of audit.json."""

HEADLINE_ATTACKS: Final = (
    "homogeneity",
    "dp_attribute_inference",
    "attribute_inference",
    "ldp_report",
    "background_knowledge",
    "linkage",
    "membership_inference",
    "membership",
    "differencing",
    "similarity",
    "proximity",
    "skewness",
)
"""Order in which an attack becomes a release's headline (attribute disclosure first, so
anonymised and DP releases are compared on the same kind of harm); unlisted attacks
come after, by name."""

_LOSS_KEYS: Final = (
    "loss",
    "discernibility",
    "average_class_size",
    "precision",
    "non_uniform_entropy",
    "kl_divergence",
    "classes",
    "suppressed_records",
)


# --------------------------------------------------------------------------- pieces


def _num(value: float) -> str:
    return f"{value:g}"


def guarantee_text(kind: str, guarantee: Mapping[str, Any]) -> str:
    """``k=5, l=3 (recursive, c=4)``, ``ε=1, δ=1e-06`` ... (``no protection`` for raw)."""
    if kind == "raw":
        return "no protection"
    parts: list[str] = []
    if guarantee.get("epsilon") is not None:
        eps = f"ε={_num(float(guarantee['epsilon']))}"
        delta = guarantee.get("delta")
        parts.append(eps + (f", δ={_num(float(delta))}" if delta else ""))
    if guarantee.get("k") is not None and int(guarantee["k"]) > 1:
        parts.append(f"k={int(guarantee['k'])}")
    if guarantee.get("l") is not None:
        extra = [str(guarantee.get("variant") or "distinct")]
        if guarantee.get("c") is not None:
            extra.append(f"c={_num(float(guarantee['c']))}")
        parts.append(f"l={_num(float(guarantee['l']))} ({', '.join(extra)})")
    if guarantee.get("t") is not None:
        parts.append(f"t={_num(float(guarantee['t']))} ({guarantee.get('distance') or 'equal'})")
    return ", ".join(parts) if parts else kind


def normalise_attacks(
    attacks: Mapping[str, Any] | Sequence[AttackResult] | None,
) -> dict[str, dict[str, Any]]:
    """``{name: dict}`` from AttackResults or their dicts; details whitelisted."""
    if attacks is None:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(attacks, Mapping):
        items = [(str(k), v) for k, v in attacks.items()]
    else:
        items = [(a.name, a) for a in attacks]
    out: dict[str, dict[str, Any]] = {}
    for name, value in items:
        d: dict[str, Any] = dict(
            value.as_dict() if isinstance(value, AttackResult) else plain(value)
        )
        details = dict(d.get("details") or {})
        d["details"] = {k: v for k, v in details.items() if k in SAFE_DETAILS}
        withheld = sorted(k for k in details if k not in SAFE_DETAILS)
        if withheld:
            d["details_withheld"] = withheld
        out[name] = d
    return out


def _information_loss(release: Release) -> dict[str, Any] | None:
    if release.kind not in ANONYMISED_KINDS:
        return None
    metrics = dict(release.document.get("metrics") or {})
    output = dict(metrics.get("output") or {})
    if not output:
        return None
    out = {k: output[k] for k in _LOSS_KEYS if k in output}
    if "loss_per_attribute" in output:
        out["loss_per_attribute"] = output["loss_per_attribute"]
    risk = dict((release.document.get("risk") or {}).get("output") or {})
    prosecutor = risk.get("prosecutor")
    if isinstance(prosecutor, Mapping):
        out["prosecutor_risk"] = {
            k: prosecutor[k] for k in ("average", "highest", "records_at_risk") if k in prosecutor
        }
    return plain(out)  # type: ignore[no-any-return]


def _records(release: Release) -> dict[str, Any] | None:
    rec = dict(release.document.get("records") or {})
    if not rec:
        return None
    out = {k: rec[k] for k in ("input", "published", "suppressed", "suppressed_as") if k in rec}
    if rec.get("input"):
        out["suppressed_share"] = float(rec.get("suppressed") or 0) / float(rec["input"])
    return plain(out)  # type: ignore[no-any-return]


def _headline_order(name: str, headline: Sequence[str]) -> tuple[int, str]:
    return (headline.index(name) if name in headline else len(headline), name)


def _summary(
    utility: Mapping[str, Any],
    attacks: Mapping[str, Mapping[str, Any]],
    headline: Sequence[str] = HEADLINE_ATTACKS,
) -> dict[str, Any]:
    """The headline numbers of a release: workload error, its headline attack (the first
    of ``headline`` it was measured on) and its most successful attack."""
    rated = [n for n, a in attacks.items() if a.get("rate") is not None]
    head = min(rated, key=lambda n: _headline_order(n, headline)) if rated else None
    worst = max(rated, key=lambda n: (float(attacks[n]["rate"]), n)) if rated else None
    common = utility.get("common") or {}
    own = utility.get("own") or {}
    return {
        # the error on the ONE common workload (the same queries for every release)
        "error": common.get("error", utility.get("mean_relative_error")),
        # the error on the release's own estimand (means, bounded counts, ...)
        "own_error": own.get("mean_relative_error", utility.get("mean_relative_error")),
        "within_10pct": utility.get("within_10pct"),
        "full_workload": not utility.get("marginals_not_answerable")
        and bool(utility.get("queries")),
        "attack": head,
        "attack_success": None if head is None else attacks[head]["rate"],
        "bound": None if head is None else attacks[head].get("bound"),
        "max_attack": worst,
        "max_attack_rate": None if worst is None else attacks[worst]["rate"],
    }


def common_summary(common: Mapping[str, Any] | None) -> dict[str, Any]:
    """The common attacker's headline numbers for ``summary`` (contract §2)."""
    ai = (common or {}).get("attribute_inference") or {}
    mi = (common or {}).get("membership") or {}
    return {
        "attribute_accuracy": ai.get("accuracy"),
        "attribute_advantage": ai.get("advantage_prior"),
        "attribute_risk": ai.get("risk"),
        "membership_advantage": mi.get("advantage"),
    }


def release_entry(
    release: Release,
    utility: Mapping[str, Any],
    attacks: Mapping[str, Any] | Sequence[AttackResult] | None = None,
    headline: Sequence[str] = HEADLINE_ATTACKS,
    common: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``releases.<name>`` entry of audit.json (``common``: the common attacker's
    results, ``attacks.common``)."""
    guarantee = {k: v for k, v in release.guarantee.items() if k != "accounting"}
    acc = normalise_attacks(attacks)
    entry: dict[str, Any] = {
        "kind": release.kind,
        "guarantee": plain(guarantee),
        "guarantee_text": guarantee_text(release.kind, guarantee),
        "verified": release.document.get("verified") if release.kind != "raw" else None,
        "records": _records(release),
        "utility": plain(dict(utility)),
        "information_loss": _information_loss(release),
        "attacks": acc,
    }
    models = (release.document.get("metrics") or {}).get("error_by_model")
    if models:  # local DP: the same histogram's error under central, multiparty, local noise
        entry["error_by_model"] = plain(list(models))
    if common is not None:
        entry["common"] = plain(dict(common))
    entry["summary"] = plain({**_summary(utility, acc, headline), **common_summary(common)})
    return entry


def _dataset(
    manifest: Mapping[str, Any], columns: Sequence[str], sensitive: str | None, rows: int
) -> dict[str, Any]:
    profile = dict(manifest.get("profile") or {})
    cols = dict(profile.get("columns") or {})
    qis = [
        str(q) for q in profile.get("quasi_identifiers") or [c for c in columns if c != sensitive]
    ]
    return plain(
        {
            "rows": int(profile.get("rows") or manifest.get("rows_accepted") or rows),
            "rows_rejected": manifest.get("rows_rejected"),
            "quasi_identifiers": qis,
            "sensitive": sensitive,
            "columns": {c: {"distinct": (cols.get(c) or {}).get("distinct")} for c in columns},
            "qi_combinations": dict(profile.get("qi_combinations") or {}),
        }
    )  # type: ignore[no-any-return]


def _methodology(
    workload: Workload | None,
    rows: int,
    options: UtilityOptions,
    attacks: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    known: set[str] = set()
    taus: set[float] = set()
    for a in attacks.values():
        det = a.get("details") or {}
        known.update(str(q) for q in det.get("known_qis") or [])
        if det.get("tau") is not None:
            taus.add(float(det["tau"]))
    return {
        "workload": {
            **(workload.describe() if workload is not None else {}),
            "definition": (
                "the marginals the config declares (report.marginals)"
                if workload is not None and workload.declared
                else "every 1-way and 2-way marginal count over the columns"
            )
            + "; each cell (value combination present in the raw data) is one count query",
        },
        "utility": {
            **options.describe(rows),
            "anonymised": "each published row spreads one record uniformly over the public "
            "domain its generalised labels cover, independently per column ('*' = whole "
            "domain, '[lo, hi]' = the domain's numbers inside, a hierarchy label = every "
            "leaf under it in the public hierarchy, whether or not it occurs in the data); "
            "suppressed rows are kept and spread over the whole domain",
            "common": "summary.error and utility.common: every release is scored on the "
            "same queries (the config's report.queries when declared, else every cell of "
            "the declared report.marginals or of the default marginals); "
            + COMMON_RULE
            + ". A release publishing nothing "
            "about a query gives the analyst nothing for it; crediting it with a share of "
            "its total would reward it for data it does not publish",
            "own": "summary.own_error and utility.own: each release against the truth of "
            "what it estimates: a dp_mean's means against the true means, a DP count or "
            "histogram's cells against the raw counts, split into utility.bias (the run's "
            "exact person-bounded counts, before noise, against the raw counts: bounding, "
            "not noise) and utility.noise (the noisy against the bounded counts); tables "
            "and local DP: the workload error",
            "dp": "noisy cells (clamped at 0) summed over the other key columns; marginals "
            "not covered by a query's key columns are not answerable and left out of its "
            "score (counted as marginals_not_answerable)",
            "local_dp": "frequency estimates answer the 1-way marginal of their attribute",
            "metrics": "mean absolute error, mean relative error (floored), max absolute "
            "error, share of queries within 10%, over the answered queries",
        },
        "attacker_model": {
            "description": "the attacker knows the quasi-identifiers of each target and that "
            "the target is in the data; guesses the most frequent candidate sensitive value; "
            "a guess counts only if it equals the target's true value",
            "known_quasi_identifiers": sorted(known),
            "tau": sorted(taus),
            "intervals": "Wilson 95% intervals on each headline rate",
            "bounds": "the theoretical bound a release's guarantee implies for an attack, "
            "when there is one (l-diversity: homogeneity 0; recursive (c,l): c/(c+1); "
            "k-anonymity: 1/k; ε-DP: e^ε/(1+e^ε), plus δ)",
        },
        "attacks": {k: v for k, v in ATTACK_DEFINITIONS.items() if k in attacks},
        "headline": "a release's attack success (summary, trade-off plot) is the headline "
        "rate of the first of these attacks it was measured on: "
        + ", ".join(HEADLINE_ATTACKS)
        + "; summary.max_attack names its most successful attack. These kind-specific "
        "rates are detail: releases are compared (findings, trade-off plot, recommendation) "
        "only on the common measures, summary.error and summary.attribute_advantage",
        "report_privacy": "this report shows aggregates only (rates, errors, counts of rows, "
        "classes and queries), column names and release parameters; never a raw record, a "
        "raw value or a single cell count",
    }


# --------------------------------------------------------------------------- findings


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * float(x):.1f}%"


def _exceeds(attack: Mapping[str, Any], rate: str, bound: float) -> bool:
    """Whether the measured ``rate`` exceeds ``bound`` beyond sampling error: the lower
    end of its Wilson 95% interval lies above the bound (a point estimate above a bound
    its interval contains is what an attack at the bound measures half the time)."""
    measured = attack.get(rate)
    if measured is None:
        return False
    interval = attack.get("interval")
    if rate == "rate" and interval:
        low = float(interval[0])
    else:  # the recorded interval is the headline rate's: this rate's own, on as many targets
        n = int(attack.get("targets") or 0)
        low = wilson_interval(min(max(float(measured), 0.0), 1.0) * n, n)[0]
    return low > bound + 1e-9


def _release_finding(name: str, e: Mapping[str, Any], sensitive: str | None) -> list[str]:
    out: list[str] = []
    attacks: Mapping[str, Mapping[str, Any]] = e.get("attacks") or {}
    u: Mapping[str, Any] = e.get("utility") or {}
    label = name if e.get("kind") == "raw" else f"{name} ({e.get('guarantee_text')}"
    rec = e.get("records") or {}
    if rec.get("suppressed_share") is not None:
        label += f", {_pct(rec['suppressed_share'])} suppressed"
    label += "" if e.get("kind") == "raw" else ")"
    what = sensitive or "sensitive value"
    parts: list[str] = []
    homog = attacks.get("homogeneity")
    if homog is not None:
        lo, hi = (homog.get("interval") or [None, None])[:2]
        parts.append(
            f"{_pct(homog.get('rate'))} of records disclose their {what} by homogeneity "
            f"(95% CI {_pct(lo)}–{_pct(hi)})"
        )
    for aname, a in attacks.items():
        if aname == "homogeneity":
            continue
        bound = a.get("bound")
        br = str(a.get("bound_rate") or "rate")
        measured = a.get(br)
        if bound is not None and e.get("kind", "").startswith(("dp_", "local")):
            if measured is not None:
                parts.append(
                    f"at most {_pct(bound)} attack success by the guarantee, "
                    f"measured {_pct(measured)} ({aname})"
                )
            else:
                parts.append(
                    f"at most {_pct(bound)} attack success by the guarantee ({br} not "
                    f"measured); {aname} {_pct(a.get('rate'))}"
                )
        elif bound is not None and br != "rate":
            parts.append(
                f"{aname} {_pct(a.get('rate'))} ({br} {_pct(measured)}, bound {_pct(bound)})"
            )
        elif bound is not None:
            parts.append(f"{aname} {_pct(measured)} (bound {_pct(bound)})")
        else:
            parts.append(f"{aname} {_pct(a.get('rate'))}")
        if bound is not None and measured is not None and _exceeds(a, br, float(bound)):
            parts.append(f"WARNING: {aname} exceeds its theoretical bound")
    if u.get("withheld"):
        parts.append(f"workload metrics withheld ({u.get('queries')} queries only)")
    elif u.get("queries"):
        text = (
            f"workload mean relative error {_pct(u.get('mean_relative_error'))}, "
            f"{_pct(u.get('within_10pct'))} of {int(u['queries']):,} queries within 10%"
        )
        if u.get("marginals_not_answerable"):
            text += f" ({u['marginals_not_answerable']} marginals not answerable)"
        parts.append(text)
    elif "queries" in u:
        parts.append("answers none of the workload's queries")
    models = e.get("error_by_model") or []
    if models:
        parts.append(
            "standard error per count "
            + ", ".join(f"{m['model']} {float(m['std_error']):.3g}" for m in models)
            + " (the same histogram under each trust model)"
        )
    if parts:
        out.append(f"{label}: " + "; ".join(parts) + ".")
    return out


def findings(audit: Mapping[str, Any]) -> list[str]:
    """Plain-words findings generated from the audit's numbers."""
    out: list[str] = []
    ds = audit.get("dataset") or {}
    combos = ds.get("qi_combinations") or {}
    if ds.get("rows") is not None and combos.get("unique_share_of_rows") is not None:
        n_qis = len(ds.get("quasi_identifiers") or [])
        out.append(
            f"The input has {int(ds['rows']):,} rows; {_pct(combos['unique_share_of_rows'])} "
            f"of them are unique on the {n_qis} quasi-identifiers."
        )
    sensitive = ds.get("sensitive")
    base = audit.get("baseline")
    if base:
        out += _release_finding(BASELINE, base, sensitive)
    releases: Mapping[str, Mapping[str, Any]] = audit.get("releases") or {}
    for name, e in releases.items():
        out += _release_finding(name, e, sensitive)
    out += comparison_findings(releases)
    return out


def comparison_findings(releases: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Findings that compare releases, on the common measures only (contract §2–§3): the
    common workload error and the common attacker's advantage over the prior."""
    out: list[str] = []
    summaries = {n: e.get("summary") or {} for n, e in releases.items()}
    workload = next(
        (
            str(((e.get("utility") or {}).get("common") or {}).get("workload"))
            for e in releases.values()
            if ((e.get("utility") or {}).get("common") or {}).get("workload")
        ),
        None,
    )
    on = f"the common workload ({workload})" if workload else "the common workload"
    scored = [(float(s["error"]), n) for n, s in summaries.items() if s.get("error") is not None]
    if len(scored) > 1:
        err, best = min(scored)
        worst_err, worst = max(scored)
        out.append(
            f"Most useful release on {on}: {best} (mean relative error {_pct(err)}; "
            f"least useful {worst}, {_pct(worst_err)})."
        )
    adv = [
        (float(s["attribute_advantage"]), n)
        for n, s in summaries.items()
        if s.get("attribute_advantage") is not None
    ]
    if len(adv) > 1:
        (lo, safest), (hi, leakiest) = min(adv), max(adv)
        out.append(
            f"The common attacker (same knowledge, MAP guess, scored correct only on the true "
            f"value) gains least over the public prior on {safest} (advantage {_pct(lo)}) and "
            f"most on {leakiest} ({_pct(hi)})."
        )
    elif summaries and not adv:
        out.append(
            "No release has the common attacker's measures (summary.attribute_advantage), so "
            "releases are not compared on attack success; the per-release attacks above "
            "measure different things and are not comparable across methods."
        )
    mem = [
        (float(s["membership_advantage"]), n)
        for n, s in summaries.items()
        if s.get("membership_advantage") is not None
    ]
    if len(mem) > 1:
        hi_m, most = max(mem)
        out.append(
            f"Highest membership advantage (true minus false positive rate, members vs "
            f"control records): {most} ({_pct(hi_m)})."
        )
    return out


# --------------------------------------------------------------------------- audits


def build_audit(
    manifest: Mapping[str, Any],
    entries: Mapping[str, Mapping[str, Any]],
    *,
    baseline: Mapping[str, Any] | None = None,
    workload: Workload | None = None,
    sensitive: str | None = None,
    sweeps: Mapping[str, Sequence[str]] | None = None,
    options: UtilityOptions | None = None,
    rows: int = 0,
) -> dict[str, Any]:
    """Assemble audit.json from release entries (``release_entry``) and the manifest."""
    o = options or UtilityOptions()
    columns = list(workload.columns) if workload is not None else []
    dataset = _dataset(manifest, columns, sensitive, rows)
    all_attacks: dict[str, Mapping[str, Any]] = {}
    for e in [*entries.values(), *([baseline] if baseline else [])]:
        all_attacks.update(e.get("attacks") or {})
    unknown = {n: list(s) for n, s in (sweeps or {}).items() if any(r not in entries for r in s)}
    if unknown:
        raise ValueError(f"sweeps name releases that are not in the audit: {unknown}")
    audit: dict[str, Any] = {
        "format": AUDIT_FORMAT,
        "run": {
            k: manifest.get(k)
            for k in ("run_id", "name", "finished", "privpipe_version", "config_sha256", "status")
        },
        "dataset": dataset,
        "releases": {n: dict(e) for n, e in entries.items()},
    }
    if baseline is not None:
        audit["baseline"] = dict(baseline)
    audit["sweeps"] = {n: list(s) for n, s in (sweeps or {}).items()}
    audit["methodology"] = _methodology(workload, int(dataset.get("rows") or rows), o, all_attacks)
    if any("common" in e for e in [*entries.values(), *([baseline] if baseline else [])]):
        audit["methodology"]["common_attacker"] = dict(COMMON_METHODOLOGY)
    audit["findings"] = findings(audit)
    return plain(audit)  # type: ignore[no-any-return]


def audit_run(
    run: Run,
    raw: pd.DataFrame,
    *,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    attacks: Mapping[str, Mapping[str, Any] | Sequence[AttackResult]] | None = None,
    baseline_attacks: Mapping[str, Any] | Sequence[AttackResult] | None = None,
    columns: Sequence[str] | None = None,
    sensitive: str | None = None,
    queries: Sequence[Mapping[str, Any]] = (),
    marginals: Sequence[Sequence[str]] | None = None,
    sweeps: Mapping[str, Sequence[str]] | None = None,
    options: UtilityOptions | None = None,
    common: Mapping[str, Mapping[str, Any]] | None = None,
    bounded: Mapping[str, Mapping[str, pd.DataFrame]] | None = None,
) -> dict[str, Any]:
    """The whole audit of a finished run: utility of every release, attacks, findings.

    ``raw`` is the accepted input (the truth; never copied into the audit). ``columns``
    default to the manifest's quasi-identifiers plus the sensitive attribute (from
    ``sensitive`` or the anonymised releases' parameters). ``attacks`` maps release
    names to their attack results; ``baseline_attacks`` (attacks on the raw table) adds a
    ``baseline`` entry. ``common`` maps release names (and ``"raw"`` for the baseline) to
    the common attacker's results (``releases.<name>.common``). ``bounded``: per DP
    release, its exact bounded cells per query (``pipelines.dp_release.bounded_truth``),
    for the bias/noise split of its utility.
    """
    manifest = run.manifest
    if sensitive is None:
        for r in run.releases.values():
            if r.parameters.get("sensitive"):
                sensitive = str(r.parameters["sensitive"])
                break
    if columns is None:
        qis = [str(q) for q in (manifest.get("profile") or {}).get("quasi_identifiers") or []]
        columns = [*qis, *([sensitive] if sensitive and sensitive not in qis else [])]
    workload = build_workload(columns, queries=queries, marginals=marginals)
    truth = true_answers(raw, workload)
    answerers = {
        name: answerer_of(r, truth, hierarchies, options) for name, r in run.releases.items()
    }  # the utility's and the distributions' answers from the same covers
    entries = {
        name: release_entry(
            r,
            release_utility(
                r,
                truth,
                hierarchies,
                options,
                raw=raw,
                bounded=(bounded or {}).get(name),
                answerer=answerers[name],
            ),
            (attacks or {}).get(name),
            common=(common or {}).get(name),
        )
        for name, r in run.releases.items()
    }
    baseline = None
    if baseline_attacks is not None:
        base = raw_release(raw, list(workload.columns))
        baseline = release_entry(
            base,
            release_utility(base, truth, hierarchies, options),
            baseline_attacks,
            common=(common or {}).get(COMMON_BASELINE),
        )
    audit = build_audit(
        manifest,
        entries,
        baseline=baseline,
        workload=workload,
        sensitive=sensitive,
        sweeps=sweeps,
        options=options,
        rows=truth.rows,
    )
    audit["generalisation"] = generalisation_levels(run.releases, hierarchies)
    audit["distributions"] = distributions(
        run.releases, truth, hierarchies, options, answerers=answerers
    )
    return plain(audit)  # type: ignore[no-any-return]


def compare_runs(
    audits: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """Several runs' audits as one: releases named ``<run>/<release>``, one sweep per
    release name across the runs (in the given order, e.g. nightly runs over time)."""
    if not audits:
        raise ValueError("compare_runs needs at least one audit")
    names = (
        list(labels)
        if labels is not None
        else [
            str((a.get("run") or {}).get("run_id") or f"run{i + 1}") for i, a in enumerate(audits)
        ]
    )
    if len(names) != len(audits) or len(set(names)) != len(names):
        raise ValueError(f"labels must be one distinct name per audit, got {names}")
    releases: dict[str, Any] = {}
    series: dict[str, list[str]] = {}
    for label, a in zip(names, audits, strict=True):
        for rname, entry in (a.get("releases") or {}).items():
            key = f"{label}/{rname}"
            releases[key] = entry
            series.setdefault(rname, []).append(key)
    first = audits[0]
    combined: dict[str, Any] = {
        "format": AUDIT_FORMAT,
        "run": {"compared": names},
        "runs": [
            {"label": lab, **dict(a.get("run") or {})} for lab, a in zip(names, audits, strict=True)
        ],
        "dataset": first.get("dataset") or {},
        **({"baseline": first["baseline"]} if first.get("baseline") else {}),
        "releases": releases,
        "sweeps": {k: v for k, v in series.items() if len(v) > 1},
        "methodology": first.get("methodology") or {},
    }
    combined["generalisation"] = {
        f"{label}/{r}": levels
        for label, a in zip(names, audits, strict=True)
        for r, levels in (a.get("generalisation") or {}).items()
    }
    combined["findings"] = findings(combined) + _drift(names, audits)
    return plain(combined)  # type: ignore[no-any-return]


def _drift(names: Sequence[str], audits: Sequence[Mapping[str, Any]]) -> list[str]:
    """Findings on how each release's headline numbers moved from the first run to the last."""
    if len(audits) < 2:
        return []
    first = audits[0].get("releases") or {}
    last = audits[-1].get("releases") or {}
    out: list[str] = []
    for rname in first:
        if rname not in last:
            continue
        a, b = first[rname].get("summary") or {}, last[rname].get("summary") or {}
        ea, eb = a.get("error"), b.get("error")
        sa, sb = a.get("attribute_advantage"), b.get("attribute_advantage")
        bits = []
        if ea is not None and eb is not None and not math.isclose(ea, eb):
            bits.append(f"workload error {_pct(ea)} → {_pct(eb)}")
        if sa is not None and sb is not None and not math.isclose(sa, sb):
            bits.append(f"common attribute advantage {_pct(sa)} → {_pct(sb)}")
        if bits:
            out.append(f"{rname} from {names[0]} to {names[-1]}: " + ", ".join(bits) + ".")
    return out
