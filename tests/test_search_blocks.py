"""Nodes refused from part of their rows (``Evaluator.classes_by_block``, the optimal
search's ``_by_block``): the blocks join to the node's classes, what the models find in
the blocks adds up to what they find in the node, and the search finds the same optimum
with and without blocks while counting fewer rows with them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privpipe.anonymity import search, transformation
from privpipe.anonymity.hierarchy import Hierarchy, build_grouping
from privpipe.anonymity.models import (
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
    TCloseness,
    assess,
)
from privpipe.anonymity.search import optimal
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from privpipe.errors import PrivacyRefusal
from tests.test_anonymity_properties import cases, lattice_nodes, model_lists
from tests.test_anonymity_rollup import same_classes

ZIP = build_grouping(
    "zip",
    [
        {f"z{i:02d}": f"z{i // 5}/2" for i in range(40)},
        {f"z{i}/2": f"z{i // 2}*" for i in range(8)},
    ],
)
AGE = build_grouping(
    "age",
    [{f"a{i}": f"a{i // 2}/2" for i in range(10)}, {f"a{i}/2": f"a{i // 3}/3" for i in range(5)}],
)
SEX = build_grouping("sex", [{"m": "*", "f": "*"}])
DIAGNOSIS = build_grouping(
    "diagnosis", [{f"d{i}": f"c{i // 3}" for i in range(8)}, {f"c{i}": "*" for i in range(3)}]
)
HIERARCHIES: dict[str, Hierarchy] = {"zip": ZIP, "age": AGE, "sex": SEX}
QIS = ["zip", "age", "sex"]


@pytest.fixture(autouse=True)
def small_blocks() -> Iterator[None]:
    """Blocks of a few rows (at scale they need ``BLOCK_ROWS`` rows each)."""
    with patch.object(transformation, "BLOCK_ROWS", 64):
        yield


def visits(moving: int = 0) -> pd.DataFrame:
    """4,000 persons with 1-3 visits each, one QI tuple per person (``moving`` persons
    get a second zip code), a diagnosis per visit; skewed so that most nodes fail."""
    rng = np.random.default_rng(7)  # test data, not a release
    n = 4_000
    visits_of = rng.integers(1, 4, n)
    person = np.repeat(np.arange(n), visits_of)
    zips = rng.zipf(1.6, n) % 40
    frame = pd.DataFrame(
        {
            "pid": [f"p{i}" for i in person],
            "zip": [f"z{z:02d}" for z in zips[person]],
            "age": [f"a{a}" for a in rng.integers(0, 10, n)[person]],
            "sex": np.where(rng.random(n) < 0.5, "m", "f")[person],
            "diagnosis": [f"d{d}" for d in rng.choice(8, person.shape[0], p=PROBABILITIES)],
        }
    )
    if moving:
        first = np.flatnonzero(np.r_[True, person[1:] != person[:-1]])
        first_rows = first[visits_of[person[first]] > 1][:moving]
        frame.loc[first_rows, "zip"] = "z39"  # their other visits keep their own zip
    return frame


PROBABILITIES = [0.4, 0.2, 0.1, 0.1, 0.08, 0.06, 0.04, 0.02]


def evaluator(frame: pd.DataFrame, unit: str | None) -> Evaluator:
    summary = Summary.from_frame(frame, QIS, "diagnosis", HIERARCHIES, DIAGNOSIS, unit=unit)
    return Evaluator(summary, HIERARCHIES)


def models() -> list[PrivacyModel]:
    return [KAnonymity(5), TCloseness(0.1, "hierarchical", DIAGNOSIS)]


@pytest.mark.parametrize("unit", [None, "pid"])
def test_the_blocks_join_to_the_node_and_their_violations_add_up(unit: str | None) -> None:
    ev = evaluator(visits(), unit)
    cut = 0
    for node in lattice_nodes_of(ev):
        # the class sizes k needs, counted without SA cells: the node's, as multisets
        sizes = ev.class_sizes(node)
        assert sizes is not None  # no person has several QI tuples
        records, units = sizes
        whole = ev.classes(node)
        view = ev.in_units(whole)
        assert sorted(zip(records.tolist(), units.tolist(), strict=True)) == sorted(
            zip(whole.sizes.tolist(), view.sizes.tolist(), strict=True)
        )
        blocks = ev.classes_by_block(node)
        if blocks is None:
            assert ev.n_blocks(node) == 0
            continue
        parts = dict(blocks)
        assert len(parts) == ev.n_blocks(node) >= 2
        cut += 1
        joined = ev.joined([parts[i] for i in sorted(parts)])
        carried = ("cell_sa", "cell_single", "cell_first")
        same_classes(joined, whole, carried)
        same_classes(ev.in_units(joined), ev.in_units(whole), carried)
        # records in violating classes, block by block, add up to the node's
        full = assess(whole, models(), 1.0)
        for model in models():
            in_blocks = sum(
                int(part.sizes[model.violating(ev.in_units(part))].sum()) for part in parts.values()
            )
            assert in_blocks == full.violations[model.describe()]
    assert cut >= 6  # nodes with the first QI below its top, on enough rows, are cut


def lattice_nodes_of(ev: Evaluator) -> list[tuple[int, ...]]:
    lattice = ev.lattice()
    return [tuple(int(x) for x in node) for node in lattice.nodes()]


def test_persons_with_rows_in_several_tuples_are_not_cut() -> None:
    ev = evaluator(visits(moving=50), "pid")
    assert all(ev.classes_by_block(node) is None for node in lattice_nodes_of(ev))
    # nor are their class sizes summed from first rows: a person would count twice
    assert all(ev.class_sizes(node) is None for node in lattice_nodes_of(ev))
    assert evaluator(visits(), "pid").n_blocks((0, 0, 0)) >= 2


def test_a_base_is_cut_into_blocks_by_the_square_root_of_its_rows() -> None:
    """``isqrt(n_rows // BLOCK_ROWS)`` blocks (fewer where a label of the first QI spans a
    cut; at most ``BLOCKS``); a base too small for two is not cut."""
    node = (0, 0, 0)
    n_rows = evaluator(visits(), "pid")._base_for(node).n_rows

    def blocks(rows: int) -> int:
        with patch.object(transformation, "BLOCK_ROWS", rows):
            return evaluator(visits(), "pid").n_blocks(node)

    assert n_rows > 1_000
    assert blocks(n_rows // 4) == 2
    assert 4 < blocks(n_rows // 64) <= 8
    assert blocks(n_rows // 3) == 0
    assert 16 < blocks(1) <= min(transformation.BLOCKS, math.isqrt(n_rows))


def test_the_tables_kept_for_the_last_nodes_count_as_fresh_ones() -> None:
    """Blocks and nodes counted in any order with the last nodes' joint-coding and
    key-packing tables kept (``NODE_TABLES``) give the classes an evaluator keeping none
    gives; at most ``NODE_TABLES`` are kept."""
    nodes = lattice_nodes_of(evaluator(visits(), "pid"))
    order = np.random.default_rng(3).permutation(len(nodes))  # test order, not a release
    kept = evaluator(visits(), "pid")
    assert kept._joint_qis  # the SA and sex are coded jointly
    for index in [*order.tolist(), *order.tolist()[::-1]]:
        node = nodes[index]
        with patch.object(transformation, "NODE_TABLES", 0):
            fresh = evaluator(visits(), "pid")
            expected = fresh.classes(node)
            blocks = fresh.classes_by_block(node)
            expected_parts = [] if blocks is None else [part for _, part in blocks]
        carried = ("cell_sa", "cell_single", "cell_first")
        same_classes(kept.classes(node), expected, carried)
        blocks = kept.classes_by_block(node)
        parts = [] if blocks is None else [part for _, part in blocks]
        assert len(parts) == len(expected_parts)
        for part, reference in zip(parts, expected_parts, strict=True):
            same_classes(part, reference, carried)
        assert len(kept._joint_tables) <= transformation.NODE_TABLES
        assert len(kept._packings) <= transformation.NODE_TABLES
    assert kept._joint_tables and kept._packings


def counting_rows(ev: Evaluator) -> list[int]:
    """Rows counted by ``ev`` (every call of its counting), appended per call."""
    counted: list[int] = []
    count = ev._count

    def spy(base: object, node: object, rows: slice | None = None) -> EquivalenceClasses:
        classes = count(base, node, rows)  # type: ignore[arg-type]
        n = base.n_rows if rows is None else rows.stop - rows.start  # type: ignore[attr-defined]
        counted.append(int(n))
        return classes

    ev._count = spy  # type: ignore[method-assign]
    return counted


@pytest.mark.parametrize("unit", [None, "pid"])
@pytest.mark.parametrize(
    "chosen",
    [models(), [KAnonymity(5), RecursiveCLDiversity(3.0, 2)]],
    ids=["t-closeness", "recursive-l"],
)
def test_the_search_finds_the_same_optimum_with_and_without_blocks(
    unit: str | None, chosen: list[PrivacyModel]
) -> None:
    with_blocks, without = (
        optimal(evaluator(visits(), unit), chosen, suppression_limit=0.05, blocks=blocks)
        for blocks in (True, False)
    )
    assert with_blocks.transformation == without.transformation
    assert with_blocks.value == without.value
    assert with_blocks.suppressed_records == without.suppressed_records
    assert with_blocks.nodes_checked == without.nodes_checked >= 5


@pytest.mark.parametrize("unit", [None, "pid"])
def test_nodes_are_refused_from_part_of_their_rows(unit: str | None) -> None:
    """Without roll-ups (nothing cached), every node is counted from a base: with blocks,
    the nodes refused early leave rows uncounted."""
    rows = []
    with patch.object(search, "CACHE_CELLS", 0):
        for blocks in (True, False):
            ev = evaluator(visits(), unit)
            counted = counting_rows(ev)
            optimal(ev, models(), suppression_limit=0.05, blocks=blocks)
            rows.append(sum(counted))
    assert rows[0] < 0.9 * rows[1], rows


def test_a_refusal_names_the_least_suppression_of_nodes_counted_in_full() -> None:
    ev = evaluator(visits(), "pid")
    # the most frequent diagnosis outweighs half of the rest even in the whole table
    strict = [KAnonymity(5), RecursiveCLDiversity(0.5, 2)]
    with pytest.raises(PrivacyRefusal, match="the least any transformation counted in full"):
        optimal(ev, strict, suppression_limit=0.01)
    with pytest.raises(PrivacyRefusal, match="the least any transformation needs"):
        optimal(evaluator(visits(), "pid"), strict, suppression_limit=0.01, blocks=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_blocks_never_change_the_optimum(data: st.DataObject) -> None:
    case = data.draw(cases(max_rows=40))
    chosen = data.draw(model_lists(case.sa_hierarchy))
    limit = data.draw(st.sampled_from([0.0, 0.1, 0.2, 0.5]))
    metric = data.draw(st.sampled_from(["loss", "discernibility", "entropy"]))
    outcomes: list[tuple[tuple[int, ...], float, int] | None] = []
    with patch.object(transformation, "BLOCK_ROWS", 1):
        for blocks in (True, False):
            try:
                found = optimal(
                    case.evaluator(), chosen, suppression_limit=limit, metric=metric, blocks=blocks
                )
            except PrivacyRefusal:
                outcomes.append(None)
            else:
                outcomes.append((found.transformation, found.value, found.suppressed_records))
    assert outcomes[0] == outcomes[1]
    assert lattice_nodes(case)  # the case has a lattice
