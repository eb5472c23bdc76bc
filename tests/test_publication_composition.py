"""The composition attack (attacks/composition.py) on hand-made 2-diverse tables, and the
publication check that refuses a disclosing pair."""

from __future__ import annotations

import numpy as np
import pandas as pd

from anonymity.hierarchy import Hierarchy
from attacks.composition import claimed_values, compose_tables

QIS = ["age", "sex"]
RAW = pd.DataFrame(
    {
        "age": ["20", "21", "20", "21"] * 3,
        "sex": ["F", "F", "M", "M"] * 3,
        "dx": ["flu", "cold", "gout", "acne"] * 3,
    }
)
# A: ages in pairs, sex kept: (20-21, F) = {flu, cold}, (20-21, M) = {gout, acne}
A = RAW.assign(age="20-21")
# B: age kept, sex suppressed: (20, *) = {flu, gout}, (21, *) = {cold, acne}
B = RAW.assign(sex="*")
# C: age suppressed, sex kept: (*, F) = {flu, cold}, (*, M) = {gout, acne}
C = RAW.assign(age="*")
HIER = {
    "age": Hierarchy("age", np.array([["20", "20-21", "*"], ["21", "20-21", "*"]])),
    "sex": Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object)),
}
L2 = {"k": 3, "l": 2, "variant": "distinct"}


def _distinct_per_class(table: pd.DataFrame) -> int:
    return int(table.groupby(QIS)["dx"].nunique().min())


def test_each_table_is_2_diverse() -> None:
    for t in (A, B, C):
        assert _distinct_per_class(t) == 2


def test_intersecting_two_2_diverse_tables_discloses_every_target() -> None:
    found = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees={"a": L2, "b": L2})
    assert found.disclosed_alone == (0.0, 0.0)  # neither table alone discloses
    assert found.disclosed == 1.0 and found.candidates == 1.0
    assert found.claim == 2 and found.below_claim == len(RAW)
    assert found.breach
    entry = found.as_dict()
    assert entry["releases"] == ["a", "b"] and entry["breach"] is True
    assert "fewer than the 2 values" in str(entry["finding"])


def test_a_pair_whose_classes_nest_does_not_disclose() -> None:
    found = compose_tables({"a": A, "c": C}, RAW, QIS, "dx", HIER, guarantees={"a": L2, "c": L2})
    assert found.disclosed == 0.0 and found.candidates == 2.0
    assert not found.breach


def test_k_anonymity_tables_claim_nothing_a_finding_not_a_breach() -> None:
    k3 = {"k": 3}
    found = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees={"a": k3, "b": k3})
    assert found.disclosed == 1.0  # the attack works the same
    assert found.claim is None and not found.breach
    assert "not a breach" in found.message()


def test_claims() -> None:
    assert claimed_values({"k": 5}) is None
    assert claimed_values({"k": 5, "l": 3, "variant": "recursive", "c": 4}) == 3
    assert claimed_values({"k": 5, "l": 2.5, "variant": "entropy"}) == 3
    assert claimed_values(None) is None
