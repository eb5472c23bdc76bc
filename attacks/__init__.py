"""Pure core (no Beam): attacker knowledge and attacks on each kind of release.

Anonymised tables: ``attack_table`` (or ``match_targets`` once, then ``homogeneity``,
``background_knowledge``, ``skewness``, ``similarity``, ``linkage``, ``proximity`` on
the view); the raw table through ``baseline_table`` is the no-protection baseline.
DP releases: ``histogram_attribute_inference``, ``membership_inference``,
``differencing_attack``. Local DP: ``report_attack``. Every attack returns an
``AttackResult``; ``audit_attacks`` turns a list of them into audit.json's ``attacks``.
"""

from privpipe.attacks.dp import (
    NoNoise,
    difference_histograms,
    differencing_attack,
    dp_success_bound,
    histogram_attribute_inference,
    membership_inference,
    optimal_success,
    person_contribution,
)
from privpipe.attacks.knowledge import AttackerKnowledge
from privpipe.attacks.ldp import grr_posterior, grr_success_bound, report_attack
from privpipe.attacks.matching import TargetView, match_targets
from privpipe.attacks.result import AttackResult, audit_attacks
from privpipe.attacks.stats import wilson_interval
from privpipe.attacks.table import (
    TABLE_ATTACKS,
    attack_table,
    background_knowledge,
    baseline_table,
    candidate_ranges,
    homogeneity,
    linkage,
    proximity,
    similarity,
    skewness,
)

__all__ = [
    "TABLE_ATTACKS",
    "AttackResult",
    "AttackerKnowledge",
    "NoNoise",
    "TargetView",
    "attack_table",
    "audit_attacks",
    "background_knowledge",
    "baseline_table",
    "candidate_ranges",
    "difference_histograms",
    "differencing_attack",
    "dp_success_bound",
    "grr_posterior",
    "grr_success_bound",
    "histogram_attribute_inference",
    "homogeneity",
    "linkage",
    "match_targets",
    "membership_inference",
    "optimal_success",
    "person_contribution",
    "proximity",
    "report_attack",
    "similarity",
    "skewness",
    "wilson_interval",
]
