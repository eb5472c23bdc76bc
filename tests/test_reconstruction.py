"""The reconstruction attack (attacks/reconstruction.py): exact marginals that determine a
table give it back; DP marginals at small epsilon (the real noise path) give chance."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from privpipe.attacks.reconstruction import (
    Marginal,
    independence,
    match_share,
    reconstruct,
    round_to,
)
from privpipe.dp.noise import SecureSampler, laplace_scale
from privpipe.pipelines.pubattacks import reconstruction_entry
from privpipe.reports import Release

DOMAIN = (4, 3, 3)  # three small columns: 36 cells


def _table() -> np.ndarray:
    """A sparse, strongly dependent table of 162 records over DOMAIN (records per cell):
    c is a function of a, so the (a, c) marginal's zeros pin every cell the (a, b) one
    leaves free (as zeros in the census's tables pinned its blocks)."""
    counts = np.zeros(DOMAIN, dtype=np.int64)
    for a, b in itertools.product(range(4), range(3)):
        counts[a, b, min(a, 2)] = 5 + 3 * a + 2 * b
    return counts


def _pair(
    table: np.ndarray, keep: tuple[int, int]
) -> tuple[tuple[np.ndarray, ...], tuple[int, ...], np.ndarray]:
    maps, sizes = [], []
    for j, d in enumerate(DOMAIN):
        if j in keep:
            maps.append(np.arange(d, dtype=np.int64))
            sizes.append(d)
        else:
            maps.append(np.zeros(d, dtype=np.int64))
            sizes.append(1)
    drop = tuple(j for j in range(3) if j not in keep)
    return tuple(maps), tuple(sizes), table.sum(axis=drop, keepdims=True).ravel()


def _marginals(
    table: np.ndarray,
    kind: str = "exact",
    noisy: list[np.ndarray] | None = None,
    scale: float = 1.0,
) -> list[Marginal]:
    out = []
    for i, keep in enumerate(((0, 1), (1, 2), (0, 2))):
        maps, sizes, counts = _pair(table, keep)
        values = counts if noisy is None else noisy[i]
        out.append(Marginal(f"m{keep}", maps, sizes, values.astype(np.float64), kind, scale))  # type: ignore[arg-type]
    return out


def _determined(marginals: list[Marginal]) -> bool:
    """Every cell's count is pinned by the exact marginals: its min and max over all
    non-negative tables meeting them agree."""
    a = np.vstack([m.matrix(DOMAIN).toarray() for m in marginals])
    b = np.concatenate([m.counts for m in marginals])
    n = a.shape[1]
    for cell in range(n):
        c = np.zeros(n)
        c[cell] = 1.0
        low = linprog(c, A_eq=a, b_eq=b, bounds=(0, None), method="highs").fun
        high = -linprog(-c, A_eq=a, b_eq=b, bounds=(0, None), method="highs").fun
        if high - low > 1e-6:
            return False
    return True


def test_exact_marginals_that_determine_the_table_give_it_back() -> None:
    table = _table()
    marginals = _marginals(table)
    assert _determined(marginals)  # the premise: these marginals leave one table
    found = reconstruct(DOMAIN, marginals)
    assert found.method == "integer program"
    assert np.array_equal(found.counts, table.ravel())
    assert match_share(found.counts, table.ravel()) == 1.0
    chance = match_share(independence(found.counts, DOMAIN), table.ravel())
    assert chance < 0.6  # the chance reconstruction is far from the data


def test_one_marginal_alone_does_not_determine_it() -> None:
    table = _table()
    one = _marginals(table)[:1]  # (a, b) only: c is free
    assert not _determined(one)
    found = reconstruct(DOMAIN, one)
    assert match_share(found.counts, table.ravel()) < 1.0


def test_dp_marginals_at_small_epsilon_reconstruct_near_chance() -> None:
    table = _table()
    exact = _marginals(table)
    scale = laplace_scale(1.0, 0.02)  # each marginal at epsilon 0.02: scale 50
    sampler = SecureSampler()  # the release's noise path (OpenDP)
    noisy = [sampler.discrete_laplace(m.counts.astype(np.int64), scale) for m in exact]
    found = reconstruct(DOMAIN, _marginals(table, "noisy", noisy, scale), time_limit=10)
    truth = table.ravel()
    score = match_share(found.counts, truth)
    uniform = match_share(round_to(np.ones(truth.size), int(truth.sum())), truth)
    chance = max(uniform, match_share(independence(found.counts, DOMAIN), truth))
    assert score < chance + 0.25, (score, chance)
    assert score < 0.8


def test_lower_bounds_and_the_domain_cap() -> None:
    table = _table()
    maps, sizes, counts = _pair(table, (0, 1))
    lower = Marginal("kept", maps, sizes, counts.astype(np.float64) - 1, "lower")
    found = reconstruct(DOMAIN, [lower])
    assert (found.counts.reshape(DOMAIN).sum(axis=2).ravel() >= counts - 1).all()
    with pytest.raises(ValueError, match="at most"):
        reconstruct((100, 100), [])


# --------------------------------------------------------------------------- the audit's entry


def _histograms(table: np.ndarray, scale: float, sampler: SecureSampler) -> dict[str, Release]:
    """The three two-way marginals of ``table`` as published DP histograms (the noise
    from the release path's sampler, at ``scale``)."""
    names = ("a", "b", "c")
    out = {}
    for keep in ((0, 1), (1, 2), (0, 2)):
        keys = [names[j] for j in keep]
        drop = tuple(j for j in range(3) if j not in keep)
        counts = table.sum(axis=drop)
        cells = pd.DataFrame(
            [(f"{keys[0]}{i}", f"{keys[1]}{j}") for i in range(counts.shape[0])
             for j in range(counts.shape[1])], columns=keys,
        )  # fmt: skip
        cells["count"] = sampler.discrete_laplace(counts.ravel().astype(np.int64), scale)
        query = "".join(keys)
        params = {
            "partition_by": [],
            "queries": {query: {"group_by": keys, "levels": {}, "count_noise": {"scale": scale}}},
        }
        doc = {"name": query, "kind": "dp_histogram", "parameters": params}
        out[query] = Release(query, "dp_histogram", cells, doc)
    return out


def _records(table: np.ndarray) -> pd.DataFrame:
    a, b, c = np.nonzero(table)
    reps = table[a, b, c]
    return pd.DataFrame(
        {"a": np.repeat([f"a{i}" for i in a], reps), "b": np.repeat([f"b{i}" for i in b], reps),
         "c": np.repeat([f"c{i}" for i in c], reps)}
    )  # fmt: skip


@pytest.mark.parametrize(("epsilon", "breach"), [(50.0, True), (0.02, False)])
def test_the_audit_entry_says_yes_for_light_noise_and_no_for_heavy(
    epsilon: float, breach: bool
) -> None:
    table = _table()
    releases = _histograms(table, laplace_scale(1.0, epsilon), SecureSampler())
    entry = reconstruction_entry(
        list(releases), releases, _records(table), {}, ["a", "b"], ["a", "b", "c"], set(releases)
    )
    assert entry is not None and entry["cells"] == 36 and not entry["hypothetical"]
    assert entry["breach"] is breach, entry
    if breach:
        assert entry["matched"] > 0.95 and "determine the microdata" in entry["finding"]


def test_programs_solved_on_the_solver_thread_give_the_same_entries() -> None:
    """publication_attacks solves the programs on a thread beside the other attacks
    (``_Reconstructions(..., solver)``): the entries equal those solved in the caller's thread, the
    programs shared by two sets are solved once, and a program no table fits gives the
    same "no table fits" entry from either thread."""
    from concurrent.futures import ThreadPoolExecutor

    from privpipe.pipelines import pubattacks

    table = _table()
    releases = _histograms(table, laplace_scale(1.0, 5.0), SecureSampler())
    raw = _records(table)
    names = list(releases)
    args = (releases, raw, {}, ["a", "b"], ["a", "b", "c"], set(names))
    alone = [pubattacks.reconstruction_entry(n, *args) for n in (names, names[:2])]
    solver = ThreadPoolExecutor(1)
    try:
        runs = pubattacks._Reconstructions(*args, solver)
        programs = [runs.prepare(n) for n in (names, names[:2], names)]
        assert all(p is not None for p in programs)
        assert len(runs.solved) == 2  # the third set is the first again
        threaded = [runs.score(p) for p in programs if p]
    finally:
        solver.shutdown(wait=True)
    assert threaded[:2] == alone and threaded[2] == alone[0]
    # a program that fails on the solver thread is scored as none fitting, as before
    broken = pubattacks._Reconstructions(*args, ThreadPoolExecutor(1))
    prepared = broken.prepare(names)
    assert prepared is not None

    def failing(*_: object) -> object:
        raise ValueError("the exact counts contradict each other")

    for key in list(broken.solved):
        broken.solved[key] = broken.solver.submit(failing)  # type: ignore[union-attr]
    entry = broken.score(prepared)
    assert entry["method"] == "none" and "no table fits" in entry["finding"]
    broken.solver.shutdown(wait=True)  # type: ignore[union-attr]
