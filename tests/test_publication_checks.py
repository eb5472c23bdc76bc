"""The publication-level attacks (attacks/publication.py) and release.json's public split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.publication import reproduced_cells, row_order_alignment
from privpipe.pipelines.publication import split_document

AGE = Hierarchy(
    "age",
    np.array([[str(a), f"{a // 10 * 10}-{a // 10 * 10 + 9}", "*"] for a in range(20, 60)]),
)
SEX = Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object))
HIER = {"age": AGE, "sex": SEX}


def _records(n: int = 600, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)  # test data only (no released noise here)
    return pd.DataFrame(
        {
            "age": rng.integers(20, 60, n).astype(str),
            "sex": rng.choice(["F", "M"], n),
            "dx": rng.choice(["flu", "cold", "gout", "acne"], n),
        }
    )


def _decade(ages: pd.Series) -> pd.Series:
    return ages.map(lambda a: f"{int(a) // 10 * 10}-{int(a) // 10 * 10 + 9}")


def test_unshuffled_pair_is_aligned_and_a_shuffled_pair_is_not() -> None:
    raw = _records()
    fine = raw.assign(age=_decade(raw["age"]), sex="*")  # one generalisation
    coarse = raw.assign(age="*")  # another, of the same records in the same order
    same = row_order_alignment(fine, coarse, HIER, names=("a", "b"))
    assert same.aligned, same
    assert "same row order" in same.message() and same.agreement == 1.0
    order = np.random.default_rng(9).permutation(len(raw))
    shuffled = coarse.iloc[order].reset_index(drop=True)
    other = row_order_alignment(fine, shuffled, HIER, names=("a", "b"))
    assert not other.aligned, other
    assert abs(other.agreement - other.chance) < 0.1


def test_table_keeping_the_dp_keys_reproduces_every_cell() -> None:
    raw = _records()
    table = raw.assign(age=_decade(raw["age"]))  # sex and dx as they are
    cells = raw.groupby(["sex", "dx"]).size().reset_index()[["sex", "dx"]]
    none = np.zeros(len(table), dtype=bool)
    found = reproduced_cells(table, cells, raw, ["sex", "dx"], {}, HIER, none)
    assert found.linked and found.exact_cells == found.cells == 8
    # the DP release at the decade level of age: the table at that level reproduces it too
    by_decade = pd.DataFrame({"age": sorted(_decade(raw["age"]).unique())})
    assert reproduced_cells(table, by_decade, raw, ["age"], {"age": 1}, HIER, none).linked


def test_table_coarser_than_the_dp_release_does_not_reproduce_it() -> None:
    raw = _records()
    table = raw.assign(age=_decade(raw["age"]), sex="*")
    cells = raw.groupby(["sex", "dx"]).size().reset_index()[["sex", "dx"]]
    none = np.zeros(len(table), dtype=bool)
    found = reproduced_cells(table, cells, raw, ["sex", "dx"], {}, HIER, none)
    assert not found.linked and found.coarse == len(table)
    ages = pd.DataFrame({"age": sorted(raw["age"].unique())})  # raw ages, table has decades
    assert not reproduced_cells(table, ages, raw, ["age"], {}, HIER, none).linked
    missing = reproduced_cells(table, cells, raw, ["sex", "zip"], {}, HIER, none)
    assert not missing.linked and missing.missing_columns == ("zip",)


def test_suppressed_rows_are_named_in_the_message() -> None:
    raw = _records()
    table = raw.copy()
    table.loc[:9, ["age", "sex"]] = "*"
    suppressed = np.zeros(len(table), dtype=bool)
    suppressed[:10] = True
    cells = raw.groupby(["sex"]).size().reset_index()[["sex"]]
    found = reproduced_cells(table, cells, raw, ["sex"], {}, HIER, suppressed)
    assert found.linked and found.suppressed == 10
    assert "10 suppressed row(s)" in found.message()
    assert found.exact_cells < found.cells  # the suppressed rows are missing from the counts


def test_public_release_json_keeps_no_exact_figure() -> None:
    dp_doc = {
        "name": "d",
        "kind": "dp_count",
        "parameters": {"epsilon": 1.0},
        "guarantee": {"epsilon": 1.0},
        "charged": {"epsilon": 1.0, "delta": 0.0},
        "metrics": {"seconds": 12.5, "cells_published": {"d": 3}},
        "verification": {"epsilon": 1.0, "delta": 0.0, "method": "basic"},
        "verified": True,
    }
    public, internal = split_document(dp_doc)
    assert public["metrics"] == {"cells_published": {"d": 3}}
    assert internal["metrics"]["seconds"] == 12.5 and public["verified"] is True
    ldp_doc = {
        "name": "l",
        "kind": "local_dp",
        "parameters": {"epsilon": 1.0},
        "guarantee": {"epsilon": 1.0},
        "metrics": {"reports": 2011},
        "verification": {"ok": True, "n": 2011},
        "seconds": 3.0,
        "verified": True,
    }
    public, internal = split_document(ldp_doc)
    assert "2011" not in str(public) and "seconds" not in public
    assert internal["metrics"]["reports"] == 2011
    table_doc = {
        "name": "k",
        "kind": "k_anonymity",
        "parameters": {"k": 5},
        "guarantee": {"k": 5},
        "transformation": {"levels": {"age": 1}},
        "search": {"seconds": 0.2, "nodes_checked": 17},
        "records": {"input": 4321, "published": 4300, "suppressed": 21, "suppressed_as": "drop"},
        "metrics": {"input": {"x": 1}, "output": {"x": 2}},
        "verification": {"checked": ["records: 4300 published + 21 dropped = 4321 input"]},
        "verified": True,
    }
    public, internal = split_document(table_doc)
    assert "4321" not in str(public) and "search" not in public
    # 4300 + 21 would be the 4321 the line above keeps out: a dropped block's size stays in
    assert public["records"] == {"published": 4300, "suppressed_as": "drop"}


def test_one_cell_read_off_exactly_is_linked_even_if_other_rows_are_coarse() -> None:
    raw = _records()
    table = raw.copy()
    table.loc[table["dx"] != "flu", "sex"] = "*"  # sex kept only beside flu
    cells = raw.groupby(["sex", "dx"]).size().reset_index()[["sex", "dx"]]
    none = np.zeros(len(table), dtype=bool)
    found = reproduced_cells(table, cells, raw, ["sex", "dx"], {}, HIER, none)
    assert not found.structural and found.linked
    assert found.exact_cells == 2  # (F, flu) and (M, flu)
    assert "not for every row" in found.message()


def test_a_dropped_block_size_stays_internal() -> None:
    """With suppressed: drop, the table's length plus the dropped count is the exact input
    size: only a starred block (visible in the table anyway) is counted in public."""
    doc = {"name": "t", "kind": "k_anonymity", "guarantee": {"k": 5}, "verified": True}
    dropped = {**doc, "records": {"input": 1000, "published": 977, "suppressed": 23,
                                  "suppressed_as": "drop"}}  # fmt: skip
    public, internal = split_document(dropped)
    assert public["records"] == {"published": 977, "suppressed_as": "drop"}
    assert internal["records"]["suppressed"] == 23
    starred = {**doc, "records": {**dropped["records"], "published": 1000, "suppressed_as": "star"}}
    public, _ = split_document(starred)
    assert public["records"] == {"published": 1000, "suppressed": 23, "suppressed_as": "star"}


def test_a_dp_mean_is_checked_like_a_count() -> None:
    """dp_mean publishes the noisy count of each cell beside the mean: a table that gives
    that count exactly voids the noise on it, so its keys enter the combination check."""
    from types import SimpleNamespace

    from privpipe.pipelines.publication import dp_count_keys

    query = SimpleNamespace(name="mean_salary", group_by=("dx",), levels={"dx": 1})
    jobs = [
        SimpleNamespace(name=n, spec=SimpleNamespace(kind=k, queries=[query], partition_by=()))
        for n, k in (("m", "dp_mean"), ("s", "dp_sum"))
    ]
    assert dp_count_keys(jobs) == {"m": [("mean_salary", ["dx"], {"dx": 1})]}


def test_publication_attacks_reuse_the_runs_row_order_check() -> None:
    """The audit's row linking of a published pair is the run's publication check
    (manifest["publication"]["row_order"]), not recomputed: the same entry when the check
    is given, and the check's figures (not a new alignment) when they differ."""
    from types import SimpleNamespace

    from privpipe.pipelines.pubattacks import _tables_pairwise

    raw = _records()
    fine = raw.assign(age=_decade(raw["age"]), sex="*")
    coarse = raw.assign(age="*")
    schema = SimpleNamespace(quasi_identifiers=["age", "sex"], sensitive=None)
    plan = SimpleNamespace(config=SimpleNamespace(schema_=schema))
    releases = {"a": SimpleNamespace(data=fine), "b": SimpleNamespace(data=coarse)}
    args = (plan, releases, ["a", "b"], raw, HIER, {"a", "b"}, None)
    fresh, _ = _tables_pairwise(*args)  # type: ignore[arg-type]
    check = row_order_alignment(fine, coarse, HIER, names=("a", "b")).as_dict()
    reused, _ = _tables_pairwise(*args, [check])  # type: ignore[arg-type]
    assert reused == fresh and fresh[0]["breach"]
    other = check | {"agreement": 0.0, "aligned": False}
    read, _ = _tables_pairwise(*args, [other])  # type: ignore[arg-type]
    assert read[0]["agreement"] == 0.0 and not read[0]["breach"]


def test_distinct_counts_are_checked_like_counts() -> None:
    """A dp_count_distinct beside a table that keeps its keys: without a privacy unit the
    table's rows per cell are the exact persons per cell, so the check must see it."""
    from types import SimpleNamespace

    from privpipe.pipelines.publication import dp_count_keys

    query = SimpleNamespace(name="q", group_by=("sex", "dx"), levels=(("sex", 0),))
    for kind, checked in (("dp_count_distinct", True), ("dp_count", True), ("dp_quantile", False)):
        job = SimpleNamespace(
            name="r", spec=SimpleNamespace(kind=kind, partition_by=(), queries=(query,))
        )
        keys = dp_count_keys([job])
        assert (keys == {"r": [("q", ["sex", "dx"], {"sex": 0})]}) is checked, kind


def _aligned_by_strings(
    first: pd.DataFrame, second: pd.DataFrame, shifts: int = 8
) -> tuple[int, tuple[str, ...], float, float]:
    """The row-order attack as it was computed on strings (common_level per pair, one
    factorisation of both mapped columns): the oracle of the coded one."""
    from privpipe.attacks.publication import _agree, _codes, common_level

    n = min(len(first), len(second))
    a_cols, b_cols, used = [], [], []
    for c in [c for c in first.columns if c in second.columns]:
        a, b = common_level(first[c].iloc[:n], second[c].iloc[:n], HIER.get(c))
        if a.notna().any() and b.notna().any() and a.nunique() + b.nunique() > 2:
            x, y = _codes(a.reset_index(drop=True), b.reset_index(drop=True))
            a_cols.append(x)
            b_cols.append(y)
            used.append(c)
    agreement = float(_agree(a_cols, b_cols).mean())
    offsets = sorted({max(1, (n * (j + 1)) // (shifts + 1)) % n or 1 for j in range(shifts)})
    chance = float(np.mean([_agree(a_cols, [np.roll(y, s) for y in b_cols]).mean()
                            for s in offsets]))  # fmt: skip
    return n, tuple(used), agreement, chance


def test_the_coded_row_order_attack_is_the_string_one() -> None:
    """Tables encoded once (``encode_rows``) and compared pairwise give the figures the
    string comparison gave: mixed levels, suppressed rows, tables of different lengths,
    a column that is one label, aligned and shuffled pairs."""
    from privpipe.attacks.publication import encode_rows

    raw = _records(500)
    fine = raw.assign(age=_decade(raw["age"]))
    fine.loc[::7, ["age", "sex"]] = "*"
    mixed = raw.assign(sex="*", age=raw["age"].where(raw.index % 3 > 0, _decade(raw["age"])))
    shuffled = mixed.iloc[np.random.default_rng(4).permutation(len(mixed))].head(430)
    for a, b in ((fine, mixed), (fine, shuffled), (mixed.head(77), fine)):
        want = _aligned_by_strings(a, b)
        for x, y in ((a, b), (encode_rows(a), encode_rows(b))):
            got = row_order_alignment(x, y, HIER)
            assert (got.rows, got.columns) == want[:2]
            assert got.agreement == pytest.approx(want[2]) and got.chance == pytest.approx(want[3])
