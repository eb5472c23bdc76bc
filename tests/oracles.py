"""Shared test helpers: random hierarchies for Hypothesis, and naive per-class checks of
the privacy models written straight from REFERENCE.md (independent of anonymity/)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.models import (
    DistinctLDiversity,
    EntropyLDiversity,
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
)

SLACK = 1e-12


@st.composite
def tree_hierarchy(draw: st.DrawFn, attribute: str, repeat: bool) -> Hierarchy:
    """A random tree over 1-6 raw values; with ``repeat``, singleton groups keep their
    child's label (a label repeated across levels), as real hierarchies often do."""
    size = draw(st.integers(1, 6))
    rows = [[f"{attribute}{i}"] for i in range(size)]
    for depth in range(draw(st.integers(0, 2))):
        current = list(dict.fromkeys(row[-1] for row in rows))
        n_groups = draw(st.integers(1, len(current)))
        group = {c: draw(st.integers(0, n_groups - 1)) for c in current}
        members = Counter(group.values())
        for row in rows:
            g = group[row[-1]]
            row.append(row[-1] if repeat and members[g] == 1 else f"{attribute}L{depth}g{g}")
    if len({row[-1] for row in rows}) > 1 or len(rows[0]) == 1:
        for row in rows:
            row.append("*")
    return Hierarchy(attribute, np.array(rows, dtype=object))


def naive_violates_k_or_l(model: PrivacyModel, values: list[str]) -> bool | None:
    """Whether one class (its SA values) violates a k or l model; None for other models."""
    counts = Counter(values)
    n = len(values)
    if isinstance(model, KAnonymity):
        return n < model.k
    if isinstance(model, DistinctLDiversity):
        return len(counts) < model.l
    if isinstance(model, EntropyLDiversity):
        entropy = -sum(c / n * math.log(c / n) for c in counts.values())
        return entropy < math.log(model.l) - SLACK
    if isinstance(model, RecursiveCLDiversity):
        r = sorted(counts.values(), reverse=True)
        return not r[0] < model.c * sum(r[model.l - 1 :])
    return None
