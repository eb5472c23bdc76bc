"""The common attacker (attacks/common.py): one attack, the same on every release."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.attacks import AttackerKnowledge
from privpipe.attacks.common import (
    CellModel,
    LocalReportModel,
    RawRowsModel,
    TableModel,
    accuracy_bound,
    advantage_over,
    attribute_inference,
    common_attack,
    membership,
    membership_bound,
    public_prior,
    risk_interval,
)
from privpipe.dp.local import parameters
from privpipe.dp.noise import SeededTestSampler

B0 = AttackerKnowledge()


def frame(rows: list[tuple[str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["q", "s"])


# a published table of two classes: q=a holds s1, s1, s2; q=b holds s2, s3, s3
PUBLISHED = frame([("a", "s1"), ("a", "s1"), ("a", "s2"), ("b", "s2"), ("b", "s3"), ("b", "s3")])
TARGETS = frame([("a", "s1"), ("a", "s2"), ("b", "s3"), ("b", "s2")])


def table_model() -> TableModel:
    return TableModel(PUBLISHED, ("q",), "s", {}, ("q",))


def test_class_posteriors_and_map_on_a_hand_checked_table() -> None:
    w, labels = table_model().weights(TARGETS, np.empty(0, object), np.empty(0), members=True)
    got = pd.DataFrame(w, columns=labels)[["s1", "s2", "s3"]].to_numpy()
    assert got.tolist() == [[2, 1, 0], [2, 1, 0], [0, 1, 2], [0, 1, 2]]
    res = attribute_inference(table_model(), TARGETS, PUBLISHED["s"], "s", B0)
    # MAP: a -> s1 (right for target 0), b -> s3 (right for target 2)
    assert res["accuracy"] == 0.5 and res["targets"] == 4
    # prior over the input: s1, s2, s3 a third each; ties go to the first (s1): 1 of 4
    assert res["prior_accuracy"] == 0.25
    assert res["advantage_prior"] == pytest.approx((0.5 - 0.25) / 0.75)
    assert res["method"] == "class posterior" and res["bound"] is None
    assert res["control_accuracy"] is None and "attacks.control" in res["note"]
    lo, hi = res["interval"]
    assert lo < 0.5 < hi


def test_eliminating_one_value_changes_the_guess() -> None:
    b1 = AttackerKnowledge(background=1)
    res = attribute_inference(table_model(), TARGETS, PUBLISHED["s"], "s", b1)
    # (a, s2): s1 ruled out -> s2; (b, s2): s3 ruled out -> s2; the others keep their guess
    assert res["accuracy"] == 1.0
    assert attribute_inference(table_model(), TARGETS, PUBLISHED["s"], "s", B0)["accuracy"] == 0.5


def test_noisy_histogram_by_hand() -> None:
    cells = pd.DataFrame(
        {
            "sex": ["F", "F", "F", "M", "M", "M"],
            "d": ["x", "y", "z", "x", "y", "z"],
            "count": [5, -3, 7, 0, 0, 0],
        }
    )
    model = CellModel(cells, ("sex", "d"), {}, ("sex",), "d", {})
    targets = pd.DataFrame({"sex": ["F", "F", "M", "M"], "d": ["z", "x", "x", "y"]})
    raw_sa = pd.Series(["x", "x", "x", "y", "z"])  # prior: x 0.6
    w, labels = model.weights(targets, *public_prior(raw_sa, targets["d"]), members=True)
    assert dict(zip(labels, w[0], strict=True)) == {"x": 5.0, "y": 0.0, "z": 7.0}  # clamped
    res = attribute_inference(model, targets, raw_sa, "d", B0, epsilon=1.0)
    # F -> z (right, wrong); M: all cells 0 -> the prior's x (right, wrong)
    assert res["accuracy"] == 0.5 and res["prior_accuracy"] == 0.5
    assert res["method"] == "noisy cells"
    assert res["bound"] == pytest.approx(math.e * 0.6 / (math.e * 0.6 + 0.4))
    no_sa = CellModel(cells, ("sex",), {}, ("sex",), "d", {})
    assert no_sa.method.startswith("public prior only")
    # membership evidence: the noisy count of the record's own cell
    assert model.scores(targets, members=True).tolist() == [7.0, 5.0, 0.0, 0.0]


def test_cells_at_coarser_levels_map_the_target_and_share_a_category_by_the_prior() -> None:
    from privpipe.anonymity.hierarchy import Hierarchy

    hq = Hierarchy("q", np.array([["a1", "A", "*"], ["a2", "A", "*"], ["b1", "B", "*"]], object))
    hs = Hierarchy("s", np.array([["x1", "X", "*"], ["x2", "X", "*"], ["y1", "Y", "*"]], object))
    cells = pd.DataFrame(
        {"q": ["A", "A", "B", "B"], "s": ["X", "Y", "X", "Y"], "count": [10, 2, 0, 5]}
    )
    model = CellModel(cells, ("q", "s"), {"q": 1, "s": 1}, ("q",), "s", {"q": hq, "s": hs})
    raw_sa = pd.Series(["x1"] * 3 + ["x2"] + ["y1"] * 6)  # prior x1 .3, x2 .1, y1 .6
    targets = pd.DataFrame({"q": ["a1", "b1", "a2"], "s": ["x1", "y1", "x2"]})
    domain, prior = public_prior(raw_sa, targets["s"])
    w, labels = model.weights(targets, domain, prior, members=True)
    assert list(labels) == ["x1", "x2", "y1"]
    assert np.allclose(w, [[7.5, 2.5, 2.0], [0.0, 0.0, 5.0], [7.5, 2.5, 2.0]])
    res = attribute_inference(model, targets, raw_sa, "s", B0)
    assert res["accuracy"] == pytest.approx(2 / 3)  # x1 right, y1 right, x2 wrong
    assert model.scores(targets, members=True).tolist() == [10.0, 5.0, 10.0]


def test_raw_table_with_unique_quasi_identifiers_is_fully_disclosed() -> None:
    raw = pd.DataFrame({"q": [f"r{i}" for i in range(50)], "s": ["u", "v"] * 25})
    res = attribute_inference(RawRowsModel(raw, ("q",), "s"), raw, raw["s"], "s", B0)
    assert res["accuracy"] == 1.0 and res["method"] == "exact rows"
    assert res["prior_accuracy"] == 0.5


def test_map_beats_always_the_most_common_value_and_both_are_reported() -> None:
    # s = "common" for 60% overall, but q predicts s exactly
    rows = [("a", "common")] * 60 + [("b", "rare")] * 40
    raw = frame(rows)
    res = attribute_inference(RawRowsModel(raw, ("q",), "s"), raw, raw["s"], "s", B0)
    assert res["prior_accuracy"] == pytest.approx(0.6)
    assert res["accuracy"] == 1.0 > res["prior_accuracy"]
    assert res["advantage_prior"] == 1.0


def test_control_baseline_is_the_attack_on_the_held_out_records() -> None:
    rng = np.random.default_rng(5)
    q = rng.choice(["a", "b", "c"], 300)
    s = np.where(rng.random(300) < 0.7, np.char.add("s_", q), rng.choice(["s_a", "s_b"], 300))
    pop = frame(list(zip(q, s, strict=True)))
    members, held_out = pop.iloc[:200], pop.iloc[200:].reset_index(drop=True)
    published = members.copy()
    model = TableModel(published, ("q",), "s", {}, ("q",))
    population = public_prior(members["s"], members["s"], held_out["s"])
    with_control = attribute_inference(
        model, members, members["s"], "s", B0, control=held_out, population=population
    )
    direct = attribute_inference(model, held_out, members["s"], "s", B0, population=population)
    assert with_control["control_accuracy"] == direct["accuracy"]
    assert with_control["control_targets"] == 100
    a, c = with_control["accuracy"], with_control["control_accuracy"]
    assert with_control["risk"] == pytest.approx((a - c) / (1 - c))
    lo, hi = with_control["risk_interval"]
    assert lo <= with_control["risk"] <= hi


def test_advantage_and_risk_formulas() -> None:
    assert advantage_over(0.6, 0.2) == pytest.approx(0.5)
    assert advantage_over(0.2, 0.2) == 0.0
    assert advantage_over(0.9, 1.0) is None
    lo, hi = risk_interval(60, 100, 20, 100) or (0.0, 0.0)
    assert lo < 0.5 < hi and hi - lo < 0.5
    assert risk_interval(1, 1, 5, 5) is None  # the control is always right
    assert membership_bound(1.0) == pytest.approx((math.e - 1) / (math.e + 1))
    assert membership_bound(1.0, 0.01) == pytest.approx((math.e - 1 + 0.02) / (math.e + 1))


def _simulated_release(noised: bool, epsilon: float) -> tuple[float, float]:
    """Unique QIs, a sensitive value independent of them: only a leak of each person's own
    cell can beat the prior. Returns (accuracy, bound) of the common attack."""
    rng = np.random.default_rng(11)
    n = 2000
    raw = pd.DataFrame({"q": [f"p{i}" for i in range(n)], "s": rng.choice(["u", "v"], n)})
    cells = pd.DataFrame({"q": np.repeat(raw["q"].to_numpy(), 2), "s": np.tile(["u", "v"], n)})
    truth = (cells["s"].to_numpy() == np.repeat(raw["s"].to_numpy(), 2)).astype(np.int64)
    scale = 2.0 / epsilon  # a record's value moves one unit between two cells: L1 = 2
    counts = SeededTestSampler(3).discrete_laplace(truth, scale) if noised else truth
    model = CellModel(cells.assign(count=counts), ("q", "s"), {}, ("q",), "s", {})
    res = attribute_inference(model, raw, raw["s"], "s", B0, epsilon=2.0 / scale)
    return float(res["accuracy"]), float(res["bound"])


def test_dp_accuracy_stays_under_its_bound_and_an_unnoised_release_exceeds_it() -> None:
    acc, bound = _simulated_release(True, 0.1)
    assert acc <= bound < 0.6
    acc, bound = _simulated_release(False, 0.1)
    assert acc == 1.0 > bound


def test_bound_grows_with_eliminations_in_the_worst_case() -> None:
    prior = np.array([0.5, 0.3, 0.2])
    none = np.zeros((1, 3), dtype=bool)
    b0 = accuracy_bound(prior, none, 0.0, knowledge=B0)
    b1 = accuracy_bound(prior, none, 0.0, knowledge=AttackerKnowledge(background=1))
    assert b0 == pytest.approx(0.5) and b1 == pytest.approx(0.8)


def test_local_reports_give_the_map_posterior_and_control_records_the_prior() -> None:
    rng = np.random.default_rng(2)
    domain = ("a", "b", "c", "d")
    members = pd.DataFrame({"s": rng.choice(list(domain), 3000, p=[0.55, 0.25, 0.1, 0.1])})
    raw_sa = members["s"]
    for protocol in ("grr", "oue", "olh"):
        oracle = parameters(protocol, 3.0, 4).as_dict()
        model = LocalReportModel(domain, oracle, "s", seed=1)
        res = attribute_inference(model, members, raw_sa, "s", B0, epsilon=3.0)
        assert res["prior_accuracy"] < res["accuracy"] <= res["bound"], protocol
        ctrl = attribute_inference(model, members, raw_sa, "s", B0, control=members.iloc[:500])
        assert ctrl["control_accuracy"] == pytest.approx((members["s"][:500] == "a").mean())


def test_membership_on_the_raw_table_and_without_controls() -> None:
    pop = pd.DataFrame({"q": [f"r{i}" for i in range(400)], "s": ["u", "v"] * 200})
    members, held_out = pop.iloc[:300], pop.iloc[300:]
    model = RawRowsModel(members, ("q",), "s")
    res = membership(model, members, B0, control=held_out)
    assert res["advantage"] == 1.0 and res["tpr"] == 1.0 and res["fpr"] == 0.0
    assert res["members"] == 300 and res["controls"] == 100
    assert res["interval"][0] > 0.9 and res["bound"] is None
    # a release that publishes nothing about the records: no advantage
    table = TableModel(members.assign(q="*"), ("q",), "s", {}, ("q",))
    flat = membership(table, members, B0, control=held_out, epsilon=1.0)
    assert flat["interval"][0] <= 0.0 <= flat["interval"][1]
    assert flat["bound"] == pytest.approx(membership_bound(1.0))
    alone = common_attack(model, members, members["s"], "s", B0)["membership"]
    assert alone["advantage"] is None and alone["note"] == "no control set (attacks.control)"


# --------------------------------------------------------------------------- pipeline

ATTRIBUTE_KEYS = {
    "accuracy", "interval", "targets", "prior_accuracy", "advantage_prior",
    "control_accuracy", "control_interval", "control_targets", "risk", "risk_interval",
    "bound", "method", "note",
}  # fmt: skip
MEMBERSHIP_KEYS = {
    "advantage", "interval", "tpr", "fpr", "members", "controls", "bound", "method", "note"
}  # fmt: skip
SUMMARY_KEYS = {
    "attribute_accuracy", "attribute_advantage", "attribute_risk", "membership_advantage"
}  # fmt: skip


@pytest.mark.slow
def test_audit_has_the_common_attacker_for_every_release_and_the_baseline(
    tmp_path: Path,
) -> None:
    from privpipe.pipelines.cli import main
    from tests.conftest import ADULT_SA
    from tests.layout import internal_file
    from tests.test_attacks_pipeline import adult_config

    releases: list[dict[str, Any]] = [
        {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05},
        {"name": "m5", "kind": "k_anonymity", "k": 5, "algorithm": "mondrian"},
        {"name": "dp", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["sex", ADULT_SA]},
        {"name": "ldp", "kind": "local_dp", "epsilon": 1.0, "attribute": ADULT_SA},
    ]
    attacks = {"targets": 1000, "seed": 4, "run": ["homogeneity"]}
    assert main(["run", str(adult_config(tmp_path, attacks, releases))]) == 0
    audit = json.loads(internal_file(tmp_path / "out", "audit.json").read_text())
    entries = {**audit["releases"], "baseline": audit["baseline"]}
    assert set(entries) == {"k5", "m5", "dp", "ldp", "baseline"}
    for name, entry in entries.items():
        common = entry["common"]
        assert set(common["attribute_inference"]) == ATTRIBUTE_KEYS, name
        assert set(common["membership"]) == MEMBERSHIP_KEYS, name
        assert set(entry["summary"]) >= SUMMARY_KEYS, name
        ai = common["attribute_inference"]
        assert ai["targets"] == 1000 and entry["summary"]["attribute_accuracy"] == ai["accuracy"]
    methods = {n: e["common"]["attribute_inference"]["method"] for n, e in entries.items()}
    assert methods == {
        "k5": "class posterior", "m5": "class posterior", "dp": "noisy cells",
        "ldp": "own report", "baseline": "exact rows",
    }  # fmt: skip
    base = entries["baseline"]["common"]["attribute_inference"]
    assert base["accuracy"] > entries["k5"]["common"]["attribute_inference"]["accuracy"]
    assert entries["dp"]["common"]["attribute_inference"]["bound"] is not None
    assert "common_attacker" in audit["methodology"]
    # `privpipe report` rebuilds the audit and keeps the common attacker's results
    assert main(["report", str(tmp_path / "out")]) == 0
    rebuilt = json.loads(internal_file(tmp_path / "out", "audit.json").read_text())
    assert rebuilt["releases"]["k5"]["common"] == audit["releases"]["k5"]["common"]
    assert rebuilt["baseline"]["common"] == audit["baseline"]["common"]
    assert (
        rebuilt["releases"]["dp"]["summary"]["attribute_accuracy"]
        == (audit["releases"]["dp"]["summary"]["attribute_accuracy"])
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab\u00e4Z9 ", max_size=3), max_size=40))
def test_sorted_distinct_is_numpys_unique(values: list[str]) -> None:
    """The sensitive domain by hashing then sorting only the distinct values is
    ``np.unique`` of the strings (same values, same order)."""
    from privpipe.attacks.common import _sorted_distinct

    array = np.asarray(values, dtype=object)
    got = _sorted_distinct(array)
    assert got.dtype == object
    assert got.tolist() == np.unique(array.astype(str)).tolist()


def test_a_table_is_hashed_once_for_its_matches_and_again_when_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``matched_view``'s key hashes a frame once per frame object; a frame that gained
    rows in place is hashed again (its match is not taken from the remembered one)."""
    from privpipe.attacks import common

    calls: list[int] = []
    real = pd.util.hash_pandas_object

    def counted(frame: Any, **kw: Any) -> Any:
        calls.append(len(frame))
        return real(frame, **kw)

    monkeypatch.setattr(pd.util, "hash_pandas_object", counted)
    table = pd.DataFrame({"zip": ["1*", "1*", "2*"], "dx": ["flu", "gout", "flu"]})
    first = common._fingerprint(table)
    assert common._fingerprint(table) == first and calls == [3]
    assert common._fingerprint(table.copy()) == first and calls == [3, 3]  # equal content
    table.loc[3] = ["2*", "gout"]
    assert common._fingerprint(table) != first and calls == [3, 3, 4]


def _raw_counts_by_rows(
    raw: pd.DataFrame, records: pd.DataFrame, known: tuple[str, ...], sa: str
) -> tuple[np.ndarray, np.ndarray]:
    """The raw rows' sensitive counts per record, the slow way: every raw row and record
    coded together, as RawRowsModel counted before it coded the raw table once."""
    from privpipe.anonymity.hierarchy import canonical_column
    from privpipe.attacks.common import _tuple_ids
    from privpipe.attacks.matching import WEIGHT

    r_ids, t_ids, _ = _tuple_ids(raw, records, known)
    values = canonical_column(raw[sa])
    labels = np.unique(values.astype(str)).astype(object)
    sa_codes = pd.Index(labels).get_indexer(values)
    table = np.zeros((len(records), labels.shape[0]))
    weights = raw[WEIGHT].to_numpy(np.float64) if WEIGHT in raw.columns else np.ones(len(raw))
    for i, t in enumerate(t_ids):
        rows = r_ids == t
        table[i] = np.bincount(sa_codes[rows], weights=weights[rows], minlength=len(labels))
    return table, labels


_VALUE = st.one_of(st.none(), st.sampled_from(["", "1", "1.0", "2", "x", "y"]), st.just(1))


@settings(max_examples=80, deadline=None)
@given(
    raw=st.lists(st.tuples(_VALUE, _VALUE, _VALUE, st.integers(1, 4)), max_size=30),
    records=st.lists(st.tuples(_VALUE, _VALUE, _VALUE), min_size=1, max_size=12),
    known=st.sampled_from([("q1",), ("q1", "q2"), ()]),
    weighted=st.booleans(),
)
def test_raw_rows_counts_are_those_of_every_raw_row(
    raw: list[tuple[Any, Any, Any, int]],
    records: list[tuple[Any, Any, Any]],
    known: tuple[str, ...],
    weighted: bool,
) -> None:
    """RawRowsModel codes the raw table once for every batch of records; its counts are
    the sensitive values of the raw rows with each record's known QIs (canonical strings:
    1 and "1.0" and "1" are one value, missing and "" another), members and controls
    alike."""
    from privpipe.attacks.matching import WEIGHT

    frame = pd.DataFrame(
        {
            "q1": pd.Series([r[0] for r in raw], dtype=object),
            "q2": pd.Series([r[1] for r in raw], dtype=object),
            "s": pd.Series([r[2] for r in raw], dtype=object),
        }
    )
    if weighted:
        frame[WEIGHT] = np.asarray([r[3] for r in raw], dtype=np.int64)
    targets = pd.DataFrame(
        {
            c: pd.Series([r[j] for r in records], dtype=object)
            for j, c in enumerate(["q1", "q2", "s"])
        }
    )
    model = RawRowsModel(frame, known, "s")
    for batch in (targets, targets.iloc[::-1]):  # a second batch: the raw side kept
        got, labels = model.weights(batch, np.empty(0, object), np.empty(0), members=True)
        want, want_labels = _raw_counts_by_rows(frame, batch, known, "s")
        assert labels.tolist() == want_labels.tolist()
        np.testing.assert_array_equal(got, want)
