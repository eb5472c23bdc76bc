"""dp.bounding: per-unit limits hold, one unit moves cells within the bound, choices uniform."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from privpipe.dp.bounding import (
    bound_contributions,
    bound_ids,
    bounding_rng,
    dense_ids,
    sensitivities,
)
from privpipe.errors import ConfigError, InputDataError


def _crowd(n_units: int, seed: int) -> pd.DataFrame:
    """Units with a random number of rows over a random subset of 12 partitions."""
    gen = np.random.default_rng(seed)
    rows = gen.integers(1, 30, size=n_units)
    unit = np.repeat(np.arange(n_units), rows)
    return pd.DataFrame(
        {
            "pid": unit,
            "region": gen.integers(0, 4, size=unit.size),
            "age": gen.choice(["young", "old", None], size=unit.size),
            "v": gen.normal(size=unit.size),
        }
    )


@pytest.mark.parametrize(("l0", "linf"), [(1, 1), (2, 3), (5, 1), (50, 50)])
def test_every_unit_within_bounds_and_kept_maximally(l0: int, linf: int) -> None:
    frame = _crowd(400, seed=l0 * 7 + linf)
    parts = ["region", "age"]
    out = bound_contributions(frame, "pid", parts, l0, linf, rng=1)
    per_cell = out.groupby(["pid", *parts], dropna=False).size()
    assert per_cell.max() <= linf
    assert out.groupby("pid")[parts].apply(lambda g: len(g.drop_duplicates())).max() <= l0
    # Maximal: a unit keeps min(L0, #partitions) partitions, min(Linf, rows) rows in each.
    before = frame.groupby(["pid", *parts], dropna=False).size()
    kept_parts = per_cell.groupby(level="pid").size()
    assert (kept_parts == before.groupby(level="pid").size().clip(upper=l0)).all()
    assert (per_cell == before.loc[per_cell.index].clip(upper=linf)).all()
    # Rows are kept untouched, in order, with their index.
    pd.testing.assert_frame_equal(out, frame.loc[out.index])
    assert out.index.is_monotonic_increasing


def test_heavy_unit_moves_counts_by_at_most_the_sensitivity() -> None:
    l0, linf = 3, 2
    gen = np.random.default_rng(5)
    # Light units stay inside the bounds, so their rows do not depend on the random choice.
    light = pd.DataFrame({"pid": np.arange(500), "cell": gen.integers(0, 20, size=500)})
    heavy = pd.DataFrame({"pid": -1, "cell": gen.integers(0, 20, size=1000)})
    with_heavy = pd.concat([light, heavy], ignore_index=True)
    l1, l2 = sensitivities(l0, linf)
    for seed in range(20):
        a = bound_contributions(with_heavy, "pid", ["cell"], l0, linf, rng=seed)
        b = bound_contributions(light, "pid", ["cell"], l0, linf, rng=seed)
        ca = a["cell"].value_counts().reindex(range(20), fill_value=0)
        cb = b["cell"].value_counts().reindex(range(20), fill_value=0)
        diff = (ca - cb).to_numpy()
        assert (diff >= 0).all() and diff.max() <= linf
        assert diff.sum() <= l1 and math.sqrt((diff**2).sum()) <= l2 + 1e-12
        assert diff.sum() == l0 * linf  # 1,000 rows over 20 cells: it fills both bounds


def test_partition_choice_is_uniform() -> None:
    # 3,000 independent copies of a unit with 10 partitions × 5 rows, L0 = 3, Linf = 1.
    n, k, l0 = 3000, 10, 3
    frame = pd.DataFrame(
        {"pid": np.repeat(np.arange(n), k * 5), "cell": np.tile(np.repeat(np.arange(k), 5), n)}
    )
    out = bound_contributions(frame, "pid", ["cell"], l0, 1, rng=2024)
    kept = out["cell"].value_counts().reindex(range(k), fill_value=0).to_numpy()
    assert kept.sum() == n * l0
    # Each partition is kept with probability L0/k; chi-square against the uniform split.
    assert chisquare(kept, np.full(k, n * l0 / k)).pvalue > 1e-4
    # Rows within a kept partition: each of the 5 chosen with probability 1/5.
    row_pos = out.index.to_numpy() % 5
    assert chisquare(np.bincount(row_pos, minlength=5)).pvalue > 1e-4


def test_subsets_are_uniform_not_just_marginals() -> None:
    # 4 partitions, L0 = 2: each of the 6 pairs should appear equally often.
    n = 6000
    frame = pd.DataFrame({"pid": np.repeat(np.arange(n), 4), "cell": np.tile(np.arange(4), n)})
    out = bound_contributions(frame, "pid", ["cell"], 2, 1, rng=7)
    pairs = out.groupby("pid")["cell"].apply(lambda s: tuple(sorted(s))).value_counts()
    assert len(pairs) == 6
    assert chisquare(pairs.to_numpy()).pvalue > 1e-4


def test_batches_of_whole_units_obey_the_same_bounds() -> None:
    frame = _crowd(300, seed=3)
    batches = [frame[frame["pid"] % 3 == r] for r in range(3)]
    out = pd.concat([bound_contributions(b, "pid", ["region"], 2, 2) for b in batches])
    assert out.groupby("pid")["region"].nunique().max() <= 2
    assert out.groupby(["pid", "region"]).size().max() <= 2


def test_unit_none_keeps_every_row() -> None:
    frame = _crowd(50, seed=1)
    out = bound_contributions(frame, None, ["region"], 1, 1)
    pd.testing.assert_frame_equal(out, frame)


def test_seeded_reproducible_and_default_rng_unpredictable() -> None:
    frame = _crowd(200, seed=9)
    a = bound_contributions(frame, "pid", ["region", "age"], 1, 1, rng=11)
    b = bound_contributions(frame, "pid", ["region", "age"], 1, 1, rng=11)
    pd.testing.assert_frame_equal(a, b)
    c = bound_contributions(frame, "pid", ["region", "age"], 1, 1)
    d = bound_contributions(frame, "pid", ["region", "age"], 1, 1)
    assert not c.index.equals(d.index)  # fresh secrets-seeded generators differ
    gen = np.random.default_rng(0)
    assert bounding_rng(gen) is gen


def test_no_partition_columns_and_empty_frame() -> None:
    frame = _crowd(100, seed=4)
    out = bound_contributions(frame, "pid", [], 1, 3)
    assert (out.groupby("pid").size() == frame.groupby("pid").size().clip(upper=3)).all()
    empty = frame.iloc[:0]
    assert bound_contributions(empty, "pid", ["region"], 1, 1).empty


def test_refusals() -> None:
    frame = pd.DataFrame({"pid": [1.0, None], "cell": [1, 2]})
    with pytest.raises(InputDataError, match="missing values"):
        bound_contributions(frame, "pid", ["cell"], 1, 1)
    with pytest.raises(InputDataError, match="not in the data"):
        bound_contributions(frame, "person", ["cell"], 1, 1)
    for l0, linf in [(0, 1), (1, 0), (1.5, 1), (True, 1)]:
        with pytest.raises(ConfigError):
            bound_contributions(frame, "pid", ["cell"], l0, linf)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        bounding_rng("seed")  # type: ignore[arg-type]


def test_sensitivities() -> None:
    assert sensitivities(4, 3) == (12.0, 6.0)
    assert sensitivities(4, 3, clamp=(-5.0, 2.0)) == (60.0, 30.0)
    assert sensitivities(1, 1, clamp=(0.0, 7.5)) == (7.5, 7.5)
    with pytest.raises(ConfigError):
        sensitivities(1, 1, clamp=(3.0, 1.0))
    with pytest.raises(ConfigError):
        sensitivities(1, 1, clamp=(0.0, 0.0))


def test_rank_within_one_key_sort_equals_the_pair_sort() -> None:
    """The single int64 key ``group·n + key`` ranks exactly as lexsort of (group, key) did:
    the same kept rows for the same random keys (so the sampling stays uniform), also for
    ids outside 0..n-1, which take the general sort."""
    from privpipe.dp.bounding import _rank_within

    def reference(groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
        order = np.lexsort((keys, groups))
        ranks = np.empty(groups.size, dtype=np.int64)
        sorted_groups = groups[order]
        for pos, i in enumerate(order):  # plain loop: rank = position - start of its group
            start = pos
            while start > 0 and sorted_groups[start - 1] == sorted_groups[pos]:
                start -= 1
            ranks[i] = pos - start
        return ranks

    gen = np.random.default_rng(7)
    for n, n_groups in [(0, 1), (1, 1), (9, 1), (200, 3), (500, 500)]:
        groups = gen.integers(0, n_groups, n).astype(np.int64)
        keys = gen.permutation(n).astype(np.int64)
        assert np.array_equal(_rank_within(groups, keys), reference(groups, keys))
    groups = np.array([5, 10**12, 5, 10**12], dtype=np.int64)  # ids beyond n
    keys = np.array([3, 1, 2, 0], dtype=np.int64)
    assert np.array_equal(_rank_within(groups, keys), reference(groups, keys))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 9), max_size=300))
def test_dense_ids_number_the_distinct_values_in_order(values: list[int]) -> None:
    """``dense_ids``: equal values share an id, different ones do not, ids run 0..n-1 in
    order of first appearance (64-bit person hashes included)."""
    array = np.array(values, dtype=np.uint64)
    ids, n = dense_ids(array)
    distinct = list(dict.fromkeys(values))
    assert n == len(distinct)
    assert ids.dtype == np.int64
    assert ids.tolist() == [distinct.index(v) for v in values]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 6), st.integers(0, 5)), max_size=300
    ),
    l0=st.integers(1, 3),
    linf=st.integers(1, 3),
)
def test_bound_ids_keeps_each_person_within_bounds_and_maximally(
    rows: list[tuple[int, int]], l0: int, linf: int
) -> None:
    """``bound_ids`` on ``dense_ids``' persons keeps ≤ L0 cells per person and ≤ Linf rows
    per (person, cell), and no fewer than the person has up to those bounds."""
    unit = np.array([u for u, _ in rows], dtype=np.uint64)
    cell = np.array([c for _, c in rows], dtype=np.uint64)
    person, n = dense_ids(unit)
    keep = bound_ids(person, n, cell, l0, linf, np.random.default_rng(0))
    frame = pd.DataFrame({"u": unit, "c": cell})
    kept = frame[keep]
    per_pair = kept.groupby(["u", "c"]).size()
    assert len(kept) == 0 or per_pair.max() <= linf
    before = frame.groupby(["u", "c"]).size()
    assert (per_pair == before.loc[per_pair.index].clip(upper=linf)).all()
    cells_kept = kept.groupby("u")["c"].nunique()
    cells_before = frame.groupby("u")["c"].nunique().clip(upper=l0)
    assert cells_kept.reindex(cells_before.index, fill_value=0).equals(cells_before)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 6), st.integers(0, 3)), max_size=200
    )
)
def test_persons_in_several_groups_are_counted(rows: list[tuple[int, int]]) -> None:
    """The persons with rows in more than one partition_by group, as pandas counts them."""
    from privpipe.dp.cells import _units_in_several_groups

    unit = np.array([u for u, _ in rows], dtype=np.uint64)
    group = np.array([g for _, g in rows], dtype=np.uint64)
    person, n = dense_ids(unit)
    expected = int((pd.DataFrame({"u": unit, "g": group}).groupby("u")["g"].nunique() > 1).sum())
    assert _units_in_several_groups(person, n, group) == expected
