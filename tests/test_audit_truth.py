"""The audit's truth without every row (transforms.audit_truth, pipelines.audit.load_truth):
the keyed target sample, and the attacks on a frequency table equal to those on its rows
(and still able to find a leak)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from anonymity.hierarchy import Hierarchy
from attacks.common import public_prior
from attacks.composition import compose_tables
from attacks.control import keyed_hashes, new_holdout_key
from attacks.matching import WEIGHT, expand_rows, frequency_table, records_of
from attacks.publication import reproduced_cells
from reports.run import Release
from reports.utility import own_utility
from transforms.audit_truth import RECORDS, SmallestHashRows

KEY = "0123456789abcdef"


def _rows(n: int = 60) -> pd.DataFrame:
    person = [f"P{i // 3:03d}" for i in range(n)]  # three rows per person
    return pd.DataFrame(
        {
            "person_id": person,
            "age": [str(20 + i % 4) for i in range(n)],
            "dx": ["flu", "cold", "gout", "acne", "flu"][:5] * (n // 5),
        }
    )


def _sample(frame: pd.DataFrame, sizes: list[int], n: int, key: str = KEY) -> pd.DataFrame:
    fn = SmallestHashRows(["age", "dx"], n, key, "person_id")
    accs, start = [], 0
    for size in sizes:  # each batch its own accumulator, merged as Beam would
        acc = fn.create_accumulator()
        acc = fn.add_input(acc, frame.iloc[start : start + size])
        accs.append(acc)
        start += size
    return fn.extract_output(fn.merge_accumulators(accs))  # type: ignore[no-any-return]


def test_the_sample_is_the_same_whatever_the_batches_and_takes_whole_persons() -> None:
    rows = _rows()
    one = _sample(rows, [60], 9)
    other = _sample(rows, [7, 20, 33], 9)
    pd.testing.assert_frame_equal(one, other)
    assert len(one) == 9 and (one[RECORDS] == 60).all()
    # the persons with the smallest keyed hashes, every row of each (3 rows per person)
    first = keyed_hashes(rows["person_id"], KEY)
    chosen = rows.assign(h=first).sort_values("h", kind="stable")["person_id"].unique()[:3]
    want = rows[rows["person_id"].isin(chosen)][["age", "dx"]]
    got = one[["age", "dx"]]
    assert sorted(map(tuple, got.to_numpy())) == sorted(map(tuple, want.to_numpy()))
    # another run's key draws other persons (who is a target is not predictable)
    assert not _sample(rows, [60], 9, new_holdout_key())[["age", "dx"]].equals(got)
    small = _sample(rows.head(4), [4], 9)  # fewer rows than asked: all of them
    assert len(small) == 4 and (small[RECORDS] == 4).all()


QIS = ["age", "sex"]
RAW = pd.DataFrame(
    {
        "age": ["20", "21", "20", "21", "20", "20"],
        "sex": ["F", "F", "M", "M", "F", "M"],
        "dx": ["flu", "cold", "gout", "acne", "flu", "gout"],
    }
)
HIER = {
    "age": Hierarchy("age", np.array([["20", "20-21", "*"], ["21", "20-21", "*"]])),
    "sex": Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object)),
}
L2 = {"k": 3, "l": 2, "variant": "distinct"}


def test_composition_on_the_frequency_table_is_the_rows_and_still_finds_the_leak() -> None:
    a, b = RAW.assign(age="20-21"), RAW.assign(sex="*")  # each 2-diverse, together not
    table = frequency_table(RAW, ["age", "sex", "dx"])
    assert len(table) < len(RAW) and records_of(table) == len(RAW)
    guarantees = {"a": L2, "b": L2}
    rows = compose_tables({"a": a, "b": b}, RAW, QIS, "dx", HIER, guarantees=guarantees)
    summed = compose_tables({"a": a, "b": b}, table, QIS, "dx", HIER, guarantees=guarantees)
    assert summed.as_dict() == rows.as_dict()
    assert summed.breach and summed.targets == len(RAW) and summed.below_claim == len(RAW)


def test_reproduced_cells_count_the_frequency_table_like_the_rows() -> None:
    table = RAW.assign(age="20-21")  # sex kept: grouping it by sex gives the exact counts
    cells = pd.DataFrame({"sex": ["F", "M"]})
    none = np.zeros(len(table), dtype=bool)
    truth = frequency_table(RAW, ["sex"])
    for keys in (["sex"], []):
        rows = reproduced_cells(table, cells, RAW, keys, {}, HIER, none)
        summed = reproduced_cells(table, cells, truth, keys, {}, HIER, none)
        assert summed.as_dict() == rows.as_dict()
    found = reproduced_cells(table, cells, truth, ["sex"], {}, HIER, none)
    assert found.linked and found.exact_cells == 2  # the leak is still found
    other = frequency_table(RAW.assign(sex=["F", "F", "M", "M", "M", "M"]), ["sex"])
    assert reproduced_cells(table, cells, other, ["sex"], {}, HIER, none).exact_cells == 0


def test_prior_own_utility_and_expansion_weigh_each_distinct_row() -> None:
    table = frequency_table(RAW, ["age", "sex", "dx"])
    rows_prior = public_prior(RAW["dx"].to_numpy(dtype=object))
    table_prior = public_prior(table["dx"].to_numpy(dtype=object), weights=table[WEIGHT])
    assert np.array_equal(rows_prior[0], table_prior[0])
    assert np.allclose(rows_prior[1], table_prior[1])
    back = expand_rows(table)
    assert sorted(map(tuple, back.to_numpy())) == sorted(map(tuple, RAW.to_numpy()))
    cells = pd.DataFrame({"sex": ["F", "M"], "count": ["4", "2"]})
    dp = Release(
        name="d", kind="dp_count", data=cells,
        document={"parameters": {"queries": {"q": {"group_by": ["sex"]}}}},
    )  # fmt: skip
    assert own_utility(dp, table, HIER, None, 1.0) == own_utility(dp, RAW, HIER, None, 1.0)
    assert own_utility(dp, table, HIER, None, 1.0)  # scored (not an empty entry)
