"""Person-level equivalence classes (``unit: person``) and the protected suppressed block.

Every check here is recomputed independently with plain Python/pandas (distinct persons
per class, distinct (person, SA value) pairs, the '*' block as one class) and compared
with the search, Mondrian, the verifier and the attacks.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.api import anonymize
from privpipe.anonymity.hierarchy import Hierarchy, build_grouping, load_arx_csv
from privpipe.anonymity.models import (
    DistinctLDiversity,
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
    assess,
)
from privpipe.anonymity.search import heuristic, optimal
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.anonymity.verify import verify_table
from privpipe.attacks.knowledge import AttackerKnowledge
from privpipe.attacks.matching import match_targets
from privpipe.attacks.table import homogeneity
from privpipe.dp.secure_random import SeededRandom
from privpipe.errors import ConfigError, PrivacyRefusal
from tests.conftest import ARX
from tests.oracles import naive_violates_k_or_l
from tests.test_anonymity_properties import lattice_nodes, naive_classes, naive_metric

TIE = 1e-9

# --------------------------------------------------------------------------- a tiny table

ZIP = build_grouping("zip", [{"z1": "z*", "z2": "z*", "z3": "z*"}])


def visits() -> pd.DataFrame:
    """Row-3-anonymous at zip level 0, but z1's three visits are two persons."""
    return pd.DataFrame(
        {
            "pid": ["p1", "p1", "p2", "p3", "p4", "p5"],
            "zip": ["z1", "z1", "z1", "z2", "z2", "z2"],
            "disease": ["flu", "cold", "flu", "flu", "cold", "hiv"],
        }
    )


def k_spec(k: int, unit: str = "person", **kw: object) -> AnonymizationSpec:
    return AnonymizationSpec(
        "k_anonymity",
        ("zip",),
        "disease",
        k=k,
        unit=unit,  # type: ignore[arg-type]
        unit_column="pid",
        **kw,  # type: ignore[arg-type]
    )


def test_person_k_fails_where_row_k_holds_and_the_search_generalises() -> None:
    df = visits()
    rows = Evaluator(Summary.from_frame(df, ["zip"], "disease", {"zip": ZIP}), {"zip": ZIP})
    persons = Evaluator(
        Summary.from_frame(df, ["zip"], "disease", {"zip": ZIP}, unit="pid"), {"zip": ZIP}
    )
    assert assess(rows.classes((0,)), KAnonymity(3)).satisfied
    person_level = assess(persons.classes((0,)), KAnonymity(3))
    assert not person_level.satisfied and person_level.unit == "person"
    assert persons.in_units(persons.classes((0,))).sizes.tolist() == [2, 3]
    assert optimal(rows, KAnonymity(3)).transformation == (0,)
    assert optimal(persons, KAnonymity(3)).transformation == (1,)
    assert heuristic(persons, KAnonymity(3), time_limit=2).transformation == (1,)
    # the verifier, on the table published at level 0: yes in rows, no in persons
    spec = k_spec(3)
    table = df[["zip", "disease"]]
    assert verify_table(table, k_spec(3, "rows"), input_records=6, suppressed_records=0).ok
    no = verify_table(table, spec, input_records=6, suppressed_records=0, units=df["pid"])
    assert not no.ok
    assert no.failures == ["class [zip=z1] has 2 persons, fewer than k=3"]
    # the release: generalised to z*, 5 persons; release.json names the unit
    release = anonymize(df, spec, {"zip": ZIP})
    assert set(release.table["zip"]) == {"z*"}
    assert release.document["guarantee"]["unit"] == "person"
    assert release.document["risk"]["output"]["prosecutor"]["highest"] == pytest.approx(1 / 5)
    assert release.document["risk"]["output"]["unit"] == "person"
    # unit: rows keeps ARX's semantics (and its optimum)
    arx = anonymize(df, k_spec(3, "rows"), {"zip": ZIP})
    assert sorted(arx.table["zip"]) == sorted(df["zip"])  # published in a random order
    assert arx.document["guarantee"]["unit"] == "rows"


def test_person_l_diversity_counts_each_person_once_per_value() -> None:
    # z1: p1 has flu twice, p2 cold; rows: flu 2, cold 1; persons: flu 1, cold 1
    # z2: three persons, each with flu (p3 also hiv) -> one value held by every person
    df = pd.DataFrame(
        {
            "pid": ["p1", "p1", "p2", "p3", "p3", "p4", "p5"],
            "zip": ["z1", "z1", "z1", "z2", "z2", "z2", "z2"],
            "disease": ["flu", "flu", "cold", "flu", "hiv", "flu", "flu"],
        }
    )
    ev = Evaluator(
        Summary.from_frame(df, ["zip"], "disease", {"zip": ZIP}, unit="pid"), {"zip": ZIP}
    )
    view = ev.in_units(ev.classes((0,)))
    assert view.sa_matrix().tolist() == [[1, 1, 0], [0, 3, 1]]  # cold, flu, hiv
    assert ev.classes((0,)).sa_matrix().tolist() == [[1, 2, 0], [0, 3, 1]]  # in rows
    outcome = assess(ev.classes((0,)), DistinctLDiversity(2), 0.9)
    # z2 has two distinct values but every one of its 3 persons has flu: certain
    assert outcome.suppressed.tolist() == [False, True]
    spec = AnonymizationSpec(
        "l_diversity", ("zip",), "disease", l=2, unit="person", unit_column="pid"
    )
    table = df[["zip", "disease"]]
    failed = verify_table(table, spec, input_records=7, suppressed_records=0, units=df["pid"])
    assert not failed.ok
    assert failed.failures == [
        "class [zip=z2]: one disease value is held by all its 3 persons (certain disclosure)"
    ]
    rows = replace(spec, unit="rows")
    assert verify_table(table, rows, input_records=7, suppressed_records=0).ok


def test_a_value_held_by_everyone_can_appear_by_merging_classes() -> None:
    """Person-level l-diversity is not monotone: in z1 p1 has flu and p2 cold, in z2 the
    other way round; each class is fine, but merged (z*, the top) both persons have both values.
    The search must not prune with it: the optimum is level 0, not a refusal."""
    df = pd.DataFrame(
        {
            "pid": ["p1", "p2", "p1", "p2"],
            "zip": ["z1", "z1", "z2", "z2"],
            "disease": ["flu", "cold", "cold", "flu"],
        }
    )
    ev = Evaluator(
        Summary.from_frame(df, ["zip"], "disease", {"zip": ZIP}, unit="pid"), {"zip": ZIP}
    )
    models = [KAnonymity(2), DistinctLDiversity(2)]
    assert assess(ev.classes((0,)), models).satisfied
    top = assess(ev.classes((1,)), models)
    assert not top.satisfied and top.violations["no SA value held by every person"] == 4
    assert optimal(ev, models).transformation == (0,)
    assert optimal(ev, models, probe=False).transformation == (0,)


def test_unit_person_needs_a_privacy_unit() -> None:
    with pytest.raises(ConfigError, match=r"schema\.privacy_unit"):
        AnonymizationSpec("k_anonymity", ("zip",), k=2, unit="person")
    with pytest.raises(ConfigError, match="unit must be one of"):
        AnonymizationSpec("k_anonymity", ("zip",), k=2, unit="visits")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="privacy unit"):
        Summary.from_frame(visits(), ["zip"], "disease", {"zip": ZIP}, unit="disease")


def test_the_config_key_and_its_default(project: object) -> None:
    from privpipe.pipelines.config import validate_config
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.run import anonymization_spec

    cfg = project.cfg  # type: ignore[attr-defined]
    cfg["releases"] = [
        {"name": "kp", "kind": "k_anonymity", "k": 2},
        {"name": "kr", "kind": "k_anonymity", "k": 2, "unit": "rows"},
    ]
    plan = load_plan(project.save())  # type: ignore[attr-defined]
    specs = [anonymization_spec(r, plan) for r in plan.config.releases]
    assert [(s.unit, s.unit_by) for s in specs] == [("person", "id"), ("rows", None)]
    cfg["schema"]["privacy_unit"] = None
    cfg["releases"] = [{"name": "kp", "kind": "k_anonymity", "k": 2, "unit": "person"}]
    with pytest.raises(ConfigError, match=r"releases\[0\]\.unit: person needs schema"):
        validate_config(cfg, "config.yaml")
    cfg["releases"] = [{"name": "kp", "kind": "k_anonymity", "k": 2}]
    plan = load_plan(project.save())  # type: ignore[attr-defined]
    assert anonymization_spec(plan.config.releases[0], plan).unit == "rows"


# --------------------------------------------------------------------------- properties


@st.composite
def person_tables(
    draw: st.DrawFn, max_rows: int = 18, n_qis: tuple[int, int] = (1, 2), max_size: int = 4
) -> tuple[pd.DataFrame, dict[str, Hierarchy]]:
    """Random visits: ``n_qis`` QIs (2-level hierarchies over 2..``max_size`` values),
    persons with one to several rows (QIs may differ)."""
    n_qi = draw(st.integers(*n_qis))
    qis = [f"q{j}" for j in range(n_qi)]
    hier = {}
    for q in qis:
        size = draw(st.integers(2, max_size))
        groups = draw(st.integers(1, size))
        first = {f"{q}{i}": f"{q}g{draw(st.integers(0, groups - 1))}" for i in range(size)}
        hier[q] = build_grouping(q, [first, dict.fromkeys(set(first.values()), "*")])
    n = draw(st.integers(1, max_rows))
    n_persons = draw(st.integers(1, n))
    data: dict[str, list[str]] = {
        "P": [f"p{draw(st.integers(0, n_persons - 1))}" for _ in range(n)],
        "S": [f"s{draw(st.integers(0, 2))}" for _ in range(n)],
    }
    for q in qis:
        size = hier[q].domain_size
        data[q] = [f"{q}{draw(st.integers(0, size - 1))}" for _ in range(n)]
    return pd.DataFrame(data), hier


def person_violates(model: PrivacyModel, rows: Sequence[int], df: pd.DataFrame) -> bool:
    """Person-level semantics written out: k distinct persons; SA values counted once per
    (person, value); an l model also fails when one value is held by every person."""
    persons = {df["P"].iloc[i] for i in rows}
    pairs = sorted({(df["P"].iloc[i], df["S"].iloc[i]) for i in rows})
    values = [s for _, s in pairs]
    if isinstance(model, KAnonymity):
        return len(persons) < model.k
    basic = naive_violates_k_or_l(model, values)
    assert basic is not None
    return basic or (model.l >= 2 and max(Counter(values).values()) >= len(persons))


def naive_person_node(
    df: pd.DataFrame, qis: list[str], hier: dict[str, Hierarchy], node: Sequence[int],
    models: Sequence[PrivacyModel], limit: float,
) -> tuple[bool, int, dict[tuple[str, ...], list[int]], dict[tuple[str, ...], bool]]:  # fmt: skip
    case = _Case(df, qis, hier)
    groups = naive_classes(case, node)  # type: ignore[arg-type]
    bad = {key: any(person_violates(m, rows, df) for m in models) for key, rows in groups.items()}
    suppressed = [i for key, rows in groups.items() if bad[key] for i in rows]
    ok = len(suppressed) <= math.floor(Fraction(str(limit)) * len(df))
    if ok and suppressed:  # the block of suppressed records is one more class
        ok = not any(person_violates(m, suppressed, df) for m in models)
    return ok, len(suppressed), groups, bad


class _Case:
    """What the property module's naive helpers read (``df``, ``qis``, ``hierarchies``)."""

    def __init__(self, df: pd.DataFrame, qis: list[str], hier: dict[str, Hierarchy]) -> None:
        self.df, self.qis, self.hierarchies = df, qis, hier


def qi_names(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("q")]


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data())
def test_person_optimum_equals_brute_force(data: st.DataObject) -> None:
    df, hier = data.draw(person_tables())
    qis = qi_names(df)
    models: list[PrivacyModel] = [KAnonymity(data.draw(st.integers(2, 4)))]
    extra = data.draw(st.sampled_from([None, DistinctLDiversity(2), RecursiveCLDiversity(2.0, 2)]))
    if extra is not None:
        models.append(extra)
    limit = data.draw(st.sampled_from([0.0, 0.2, 0.5]))
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    ev = Evaluator(summary, hier, packed=data.draw(st.booleans()))
    case = _Case(df, qis, hier)
    nodes = lattice_nodes(case)  # type: ignore[arg-type]
    naive = []
    for node in nodes:
        ok, _, groups, bad = naive_person_node(df, qis, hier, node, models, limit)
        naive.append((ok, naive_metric(case, node, groups, bad, "loss")))  # type: ignore[arg-type]
    feasible = [i for i, (ok, _) in enumerate(naive) if ok]
    if not feasible:
        with pytest.raises(PrivacyRefusal):
            optimal(ev, models, suppression_limit=limit)
        return
    best = min(naive[i][1] for i in feasible)
    winner = next(i for i in feasible if naive[i][1] <= best + TIE * max(1.0, abs(best)))
    result = optimal(ev, models, suppression_limit=limit)
    assert result.transformation == nodes[winner]
    assert result.value == pytest.approx(best, rel=TIE, abs=1e-12)
    assert optimal(ev, models, suppression_limit=limit, probe=False).transformation == nodes[winner]
    try:
        found = heuristic(ev, models, suppression_limit=limit, time_limit=2)
    except PrivacyRefusal:
        assert not naive[-1][0]
    else:
        assert naive[nodes.index(found.transformation)][0]


def recount_persons(table: pd.DataFrame, units: pd.Series, qis: list[str]) -> pd.Series:
    """Distinct persons per published class (the '*' block is one of them)."""
    frame = table[qis].astype(str).assign(_p=units.to_numpy())
    return frame.groupby(qis)["_p"].nunique()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_published_table_is_person_k_anonymous(data: st.DataObject) -> None:
    df, hier = data.draw(person_tables(max_rows=24))
    qis = qi_names(df)
    k = data.draw(st.integers(2, 4))
    algorithm = data.draw(st.sampled_from(["optimal", "heuristic", "mondrian"]))
    spec = AnonymizationSpec(
        "k_anonymity",
        tuple(qis),
        "S",
        k=k,
        suppression_limit=data.draw(st.sampled_from([0.0, 0.3])),
        algorithm=algorithm,
        unit="person",
        unit_column="P",
        time_limit_s=2.0,
    )
    seed = data.draw(st.integers(0, 2**31 - 1))  # the table's order, replayed for the persons
    try:
        release = anonymize(df, spec, hier, order=SeededRandom(seed))
    except PrivacyRefusal:
        # the top node (one class of everyone, nothing suppressed) is person-k-anonymous
        # whenever there are k persons; Mondrian likewise refuses only then
        assert df["P"].nunique() < k
        return
    order = SeededRandom(seed).permutation(len(df))
    persons = recount_persons(release.table, df["P"].iloc[order], qis)
    assert (persons >= k).all(), persons.to_dict()
    assert release.document["guarantee"]["unit"] == "person"


# --------------------------------------------------------------------------- the '*' block

adult_subset = pytest.mark.skipif(
    not (ARX / "adult_subset.csv").exists(), reason="needs ../shared/data/arx"
)


@adult_subset
def test_a_lone_suppressed_record_is_no_longer_published_unguarded() -> None:
    """adult_subset, QIs sex and workclass, k=2: one record (Male, Without-pay) is alone.
    ARX suppresses it and keeps (sex, workclass) at level 0, with highest risk 1/13; the
    one '*' row then discloses that person's occupation to anyone who knows they are in
    the table. Now the search takes the best node whose suppressed block is safe."""
    df = pd.read_csv(ARX / "adult_subset.csv", sep=";", dtype=str)
    qis = ["sex", "workclass"]
    hier = {q: load_arx_csv(ARX / f"adult_hierarchy_{q}.csv", q) for q in qis}
    spec = AnonymizationSpec("k_anonymity", tuple(qis), "occupation", k=2, suppression_limit=0.01)
    ev = Evaluator(Summary.from_frame(df, qis, "occupation", hier), hier)
    arx_node = assess(ev.classes((0, 0)), KAnonymity(2), 0.01)
    assert arx_node.suppressed_records == 1 <= arx_node.max_suppressed
    assert not arx_node.satisfied and arx_node.block_violations == ("k=2",)
    release = anonymize(df, spec, hier)
    levels = release.document["transformation"]["levels"]
    assert levels != {"sex": 0, "workclass": 0}
    block = release.table[(release.table[qis] == "*").all(axis=1)]
    assert len(block) == 0 or len(block) >= 2
    assert release.document["verified"] is True

    # the ARX table: the verifier says no, and the attacks see the block
    old = df[[*qis, "occupation"]].copy()
    lone = (old["sex"] == "Male") & (old["workclass"] == "Without-pay")
    old.loc[lone, qis] = "*"
    verdict = verify_table(old, spec, input_records=len(df), suppressed_records=1)
    assert not verdict.ok
    assert verdict.failures == ["class [sex=*, workclass=*] has 1 records, fewer than k=2"]
    view = match_targets(old, df, qis, "occupation", hier)
    assert view.block_targets == 1
    attack = homogeneity(view, AttackerKnowledge(tau=1.0))
    assert attack.rates["correct"] == pytest.approx(1 / len(df))  # the lone record
    safe = match_targets(release.table, df, qis, "occupation", hier)
    assert homogeneity(safe, AttackerKnowledge(tau=1.0)).rates["correct"] == 0.0


@adult_subset
def test_unit_rows_on_one_row_per_person_reproduces_the_arx_optimum() -> None:
    """With one row per person, person and row counting agree (the held-out ARX
    comparisons stay equal): the same node, the same suppression."""
    df = pd.read_csv(ARX / "adult_subset.csv", sep=";", dtype=str)
    df["pid"] = np.arange(len(df)).astype(str)
    qis = ["sex", "workclass", "race"]
    hier = {q: load_arx_csv(ARX / f"adult_hierarchy_{q}.csv", q) for q in qis}
    base = AnonymizationSpec(
        "k_anonymity", tuple(qis), "occupation", k=5, suppression_limit=0.05, unit_column="pid"
    )
    rows = anonymize(df, base, hier, order=SeededRandom(3))
    persons = anonymize(df, replace(base, unit="person"), hier, order=SeededRandom(3))
    # persons == records: the search counts nothing more per node (as fast as rows)
    summary = Summary.from_frame(df, qis, "occupation", hier, unit="pid")
    assert summary.has_units and Evaluator(summary, hier).units is None
    assert rows.document["transformation"] == persons.document["transformation"]
    assert rows.document["records"] == persons.document["records"]
    assert rows.table.equals(persons.table)


# --------------------------------------------------------------------------- Beam path


def _run_zips(
    project: object, tmp_path: Path, rows: list[str], releases: list[dict[str, object]]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``privpipe run`` of ``rows`` (id;zip;age;sex;disease) with ``zip`` the only QI."""
    project.write_rows(rows)  # type: ignore[attr-defined]
    cfg = project.cfg  # type: ignore[attr-defined]
    cfg["schema"]["quasi_identifiers"] = ["zip"]
    cfg["hierarchies"] = {"zip": {"mask": {"digits": 5}}}
    cfg["schema"].pop("types")
    cfg["releases"] = releases
    config = project.save()  # type: ignore[attr-defined]
    privpipe = Path(sys.executable).parent / "privpipe"
    out = tmp_path / "run"
    done = subprocess.run(
        [str(privpipe), "run", str(config), "--output", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done, out


@pytest.mark.slow
def test_the_pipeline_counts_persons_and_states_the_unit(project: object, tmp_path: Path) -> None:
    import json

    from tests.layout import release_dir

    rows = [  # zip 4767x: 3 visits of 2 persons; 4790x: 3 persons
        "1;47677;29;Female;Flu",
        "1;47677;29;Female;Cold",
        "2;47678;27;Female;Flu",
        "3;47905;43;Male;Flu",
        "4;47906;47;Male;Cold",
        "5;47909;52;Male;Flu",
    ]
    done, out = _run_zips(
        project,
        tmp_path,
        rows,
        [
            {"name": "kp", "kind": "k_anonymity", "k": 3},
            {"name": "kr", "kind": "k_anonymity", "k": 3, "unit": "rows"},
        ],
    )
    assert done.returncode == 0, done.stderr
    kp = json.loads((release_dir(out, "kp") / "release.json").read_text())
    kr = json.loads((release_dir(out, "kr") / "release.json").read_text())
    assert kp["guarantee"]["unit"] == "person" and kp["verified"] is True
    assert kr["guarantee"]["unit"] == "rows" and kr["verified"] is True
    # rows: 476** holds 3 visits; persons: 476** holds 2, so zip goes one level up
    assert kr["transformation"]["levels"]["zip"] < kp["transformation"]["levels"]["zip"]
    data = pd.read_csv(release_dir(out, "kp") / "data.csv", dtype=str)
    assert "id" not in data.columns  # the person id is never published


@pytest.mark.slow
def test_a_row_without_a_person_id_stops_the_run(project: object, tmp_path: Path) -> None:
    """The person id is hashed once for every step (after the profile): a row without one
    is a data error naming the column (exit 3), and nothing is published."""
    rows = [
        "1;47677;29;Female;Flu",
        ";47678;27;Female;Flu",
        "3;47905;43;Male;Flu",
        "4;47906;47;Male;Cold",
    ]
    done, out = _run_zips(project, tmp_path, rows, [{"name": "kp", "kind": "k_anonymity", "k": 2}])
    assert done.returncode == 3, done.stderr
    assert "schema.privacy_unit" in done.stderr and "without a person id" in done.stderr
    assert not (out / "public").exists() or not any((out / "public").iterdir())
