"""Searching the lattice for the transformation that satisfies the models at least loss.

``optimal`` is an exhaustive full-domain search with pruning that never changes the
answer; ``heuristic`` is a time-limited greedy search for lattices too large to search
exhaustively (more than ``MAX_OPTIMAL_NODES``).

Optimal search. Nodes are visited in order of a lower bound of the metric (when the
metric has one: Loss, precision, non-uniform entropy), ties in the deterministic node
order. The bound is the metric without suppression, which suppression can only raise,
and it is non-decreasing along generalisation; so once a node's bound exceeds the best
value found, no later node can beat it and the search stops. Classes are rolled up from
a cached evaluated specialisation (a direct predecessor, or a farther one with far
fewer cells; see ``transformation``), else counted from the rows of the smallest base
below the node (``anonymity.bases``; the summary rows at worst).

Monotonicity is used only where it is valid (REFERENCE.md):
- Failure goes down: if a node fails the *monotone* models (k-anonymity, distinct
  l-diversity) within the suppression limit, so do all its specialisations, which are
  then never checked; this holds even when other, non-monotone models are also asked
  for, since they can only add suppression. To find such failures early, an unknown
  node is first probed by a binary search along a chain from it to the top (as Flash
  does), each failure marking a whole down-set.
- Dominance goes up: when every model is monotone and the metric is monotone without
  suppression, a node satisfying the models *with nothing suppressed* dominates all its
  generalisations (they satisfy with nothing suppressed too and their metric is not
  lower), which are skipped.
Nothing else is inferred: with suppression, metrics are not monotone, and entropy or
recursive l-diversity and t-closeness are checked on each node itself. The check of the
suppressed block (``models.assess``: a node whose block violates a model does not
satisfy) is not monotone either, so it never marks other nodes: ``fails`` and
``mono_ok`` are decided by the number of records to suppress alone, which is monotone.
With a privacy unit, classes are counted in persons (``Evaluator.in_units``); distinct
persons per class are monotone along generalisation like records, so the same pruning
holds.

Refusal from part of the rows: when some model is not monotone, nearly every node
checked fails (at the 1M demo's t=0.3 search, 4,644 of 4,649, most with 2.6-8 times the
records the limit allows). Such a node is counted block by block
(``Evaluator.classes_by_block``: ranges of the first QI's labels, which no class spans),
and each model's violations, summed over the blocks counted, are already records that
must be suppressed; once they exceed the limit the node fails, its other blocks
uncounted. Only a node that may still satisfy is counted whole (its blocks joined). A
node whose standing with the monotone models is still unknown (the probes' nodes) learns
it first: from class sizes alone when k-anonymity is the only monotone model
(``Evaluator.class_sizes``, no SA cells), else from every block. The answer is the same;
a refusal's message then names the least suppression among the nodes counted in full.

Ties: values within a relative 1e-9 are equal; the winner is then the node with the
lower sum of levels, then the lexicographically smaller level vector.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from privpipe import progress
from privpipe.anonymity.lattice import MAX_OPTIMAL_NODES, Lattice, Node, node_key
from privpipe.anonymity.metrics import Metric, Metrics, all_metrics, get_metric
from privpipe.anonymity.models import (
    CERTAIN,
    Assessment,
    KAnonymity,
    PrivacyModel,
    assess,
    check_models,
    describe_models,
    max_suppressed,
    violating_classes,
)
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator, describe_node
from privpipe.errors import ConfigError, PrivacyRefusal

NODES: Final = "nodes checked"  # what the search reports to privpipe.progress

__all__ = ["SearchResult", "heuristic", "optimal", "search"]

IntArray: TypeAlias = npt.NDArray[np.int64]
Algorithm: TypeAlias = Literal["optimal", "heuristic"]

RELATIVE_TIE: Final = 1e-9
"""Metric values closer than this (relative) are ties, broken by the node order."""
CACHE_CELLS: Final = 4_000_000
"""Cells of equivalence classes kept for roll-ups during the optimal search (~64 MB)."""
ROLLUP_SORT_FACTOR: Final = 4
"""A farther cached specialisation (regrouped with a full sort) is used instead of a
direct predecessor (merged sorted runs, near-linear) when it has this many times fewer
cells."""


def _tol(value: float) -> float:
    return RELATIVE_TIE * max(1.0, abs(value))


def _pct(share: float) -> str:
    text = f"{share * 100:.1f}".rstrip("0").rstrip(".")
    return f"{text}%"


@dataclass(frozen=True, eq=False)
class SearchResult:
    """The best transformation found and how the search went.

    ``assessment`` holds the node's equivalence classes and which are suppressed;
    ``proven_optimal`` is True for the optimal search only.
    """

    transformation: Node
    qi_names: tuple[str, ...]
    metric: str
    value: float
    assessment: Assessment
    nodes_checked: int
    lattice_size: int
    seconds: float
    algorithm: str
    proven_optimal: bool

    @property
    def levels(self) -> dict[str, int]:
        """The level of each QI."""
        return dict(zip(self.qi_names, self.transformation, strict=True))

    @property
    def classes(self) -> EquivalenceClasses:
        """The node's equivalence classes (suppressed ones included)."""
        return self.assessment.classes

    @property
    def suppressed(self) -> bool:
        """Whether any record is suppressed."""
        return self.assessment.suppressed_records > 0

    @property
    def suppressed_records(self) -> int:
        """Number of suppressed records."""
        return self.assessment.suppressed_records

    @property
    def suppressed_share(self) -> float:
        """Suppressed records over |D|."""
        return self.assessment.suppressed_share

    def metrics(self) -> Metrics:
        """Every metric of the node (with its suppression)."""
        return all_metrics(self.classes, self.assessment.suppressed)

    def describe(self) -> str:
        """One line for logs: node, metric, suppression, effort."""
        return (
            f"{describe_node(self.qi_names, self.transformation)} {self.metric}="
            f"{self.value:.6g}, suppressed {self.suppressed_records} "
            f"({_pct(self.suppressed_share)}), {self.nodes_checked} of {self.lattice_size} "
            f"nodes checked in {self.seconds:.3f}s ({self.algorithm})"
        )


def _cached_cells(classes: EquivalenceClasses) -> int:
    """What a cached node weighs: its cells and its carried (cell, person) pairs."""
    pairs = classes.multi_pairs
    return classes.n_cells + (0 if pairs is None else int(pairs.shape[0]))


class _ClassCache:
    """Equivalence classes of recently evaluated nodes, for roll-ups; at most
    ``CACHE_CELLS`` cells are kept (the oldest entries are evicted first). The levels and
    sizes of the entries are also kept in arrays (one slot per entry, freed slots reused)
    so that ``smallest_below`` is one vectorised comparison."""

    def __init__(self) -> None:
        self._items: OrderedDict[object, tuple[EquivalenceClasses, int]] = OrderedDict()
        self._cells = 0
        self._levels = np.zeros((0, 0), dtype=np.int64)
        self._sizes = np.zeros(0, dtype=np.int64)  # -1: a free slot
        self._free: list[int] = []
        self._by_slot: list[EquivalenceClasses | None] = []

    def get(self, key: object) -> EquivalenceClasses | None:
        item = self._items.get(key)
        return None if item is None else item[0]

    def put(self, key: object, classes: EquivalenceClasses) -> None:
        size = _cached_cells(classes)
        if size > CACHE_CELLS or key in self._items:
            return
        while self._items and self._cells + size > CACHE_CELLS:
            _, (_, old_slot) = self._items.popitem(last=False)
            self._cells -= int(self._sizes[old_slot])
            self._sizes[old_slot] = -1
            self._by_slot[old_slot] = None
            self._free.append(old_slot)
        slot = self._slot(len(classes.levels))
        self._levels[slot] = classes.levels
        self._sizes[slot] = size
        self._by_slot[slot] = classes
        self._items[key] = (classes, slot)
        self._cells += size

    def _slot(self, n_qi: int) -> int:
        if self._free:
            return self._free.pop()
        used = self._sizes.shape[0]
        grown = max(2 * used, 64)
        levels = np.zeros((grown, n_qi), dtype=np.int64)
        if used:
            levels[:used] = self._levels
        sizes = np.full(grown, -1, dtype=np.int64)
        sizes[:used] = self._sizes
        self._levels, self._sizes = levels, sizes
        self._by_slot.extend([None] * (grown - used))
        self._free.extend(range(grown - 1, used, -1))
        return used

    def smallest_below(self, node: Sequence[int]) -> EquivalenceClasses | None:
        """The cached classes with the fewest cells whose node is a specialisation of
        ``node`` (every level lower or equal), None if there is none."""
        if not self._items:
            return None
        below = (self._sizes >= 0) & np.all(self._levels <= np.asarray(node), axis=1)
        if not below.any():
            return None
        sizes = np.where(below, self._sizes, np.iinfo(np.int64).max)
        return self._by_slot[int(np.argmin(sizes))]


class _Watch:
    """Keeps the least suppression any checked node needed, for the refusal message."""

    def __init__(self) -> None:
        self.least: Assessment | None = None
        self.top: Assessment | None = None

    def note(self, assessment: Assessment, top: bool = False) -> None:
        if top:
            self.top = assessment
        least = self.least
        if least is None or (assessment.suppressed_records, node_key(assessment.levels)) < (
            least.suppressed_records,
            node_key(least.levels),
        ):
            self.least = assessment


def _refusal(
    models: Sequence[PrivacyModel],
    evaluator: Evaluator,
    lattice: Lattice,
    limit: float,
    watch: _Watch,
    complete: bool,
    partial: bool = False,
) -> PrivacyRefusal:
    """``complete``: every node was checked or known to fail; ``partial``: some were
    refused from part of their rows (``_OptimalState``) and their suppression is not
    known, so the least suppression named is that of the nodes counted in full."""
    top = watch.top
    if top is None:
        top = assess(evaluator.classes(lattice.top), models, limit)
    n = evaluator.n_records
    names = evaluator.qi_names
    text = (
        f"{describe_models(models)} needs {_pct(top.suppressed_share)} suppression "
        f"({top.suppressed_records} of {n} records) at the most general node "
        f"{describe_node(names, lattice.top)}; the suppression limit is {_pct(limit)} "
        f"({top.max_suppressed} records)"
    )
    if top.block_violations:
        text += (
            f", but those {top.suppressed_records} suppressed records, one class for an "
            f"attacker who knows the target is in the table, violate "
            f"{', '.join(top.block_violations)}"
        )
    least = watch.least
    if least is not None and least.suppressed_records < top.suppressed_records:
        scope = (
            "any transformation counted in full"
            if partial
            else "any transformation"
            if complete
            else "any transformation checked"
        )
        text += (
            f"; the least {scope} needs is {_pct(least.suppressed_share)} "
            f"({least.suppressed_records} records) at {describe_node(names, least.levels)}"
        )
    text += (
        ". No transformation satisfies the privacy model(s): raise suppression_limit, relax "
        "the model, or allow coarser generalisation (hierarchies, max levels)"
    )
    return PrivacyRefusal(text)


def _prepare(
    evaluator: Evaluator,
    models: Sequence[PrivacyModel] | PrivacyModel,
    metric: str | Metric,
    lattice: Lattice | None,
) -> tuple[tuple[PrivacyModel, ...], Metric, Lattice, Evaluator]:
    items = check_models(models, evaluator)
    chosen = get_metric(metric)
    lattice = lattice if lattice is not None else evaluator.lattice()
    if lattice.n_qi != len(evaluator.qi_names) or any(
        high > h for high, h in zip(lattice.max_levels, evaluator.heights, strict=True)
    ):
        raise ConfigError("the lattice does not match the evaluator's hierarchies")
    work = evaluator if any(model.needs_sa for model in items) else evaluator.without_sa()
    return items, chosen, lattice, work


def _result(
    evaluator: Evaluator,
    work: Evaluator,
    best: Assessment,
    models: tuple[PrivacyModel, ...],
    chosen: Metric,
    limit: float,
    checked: int,
    lattice: Lattice,
    started: float,
    algorithm: str,
    sa_cells: bool = True,
) -> SearchResult:
    if work is not evaluator and sa_cells:  # classes with SA cells (for attacks, reports)
        best = assess(evaluator.classes(best.levels), models, limit)
    value = chosen.value(best.classes, best.suppressed)
    return SearchResult(
        best.levels,
        evaluator.qi_names,
        chosen.name,
        value,
        best,
        checked,
        lattice.size,
        time.perf_counter() - started,
        algorithm,
        algorithm == "optimal",
    )


def optimal(
    evaluator: Evaluator,
    models: Sequence[PrivacyModel] | PrivacyModel,
    *,
    suppression_limit: float = 0.0,
    metric: str | Metric = "loss",
    lattice: Lattice | None = None,
    probe: bool = True,
    blocks: bool = True,
    sa_cells: bool = True,
) -> SearchResult:
    """The node satisfying all models with the least ``metric`` (module docstring).

    Raises ConfigError for lattices above ``MAX_OPTIMAL_NODES`` (use ``heuristic``) and
    PrivacyRefusal, with the suppression needed, when no node satisfies the models.
    ``probe=False`` disables the chain probes, ``blocks=False`` the refusals from part of
    a node's rows (same answer, for tests and benchmarks); ``sa_cells`` as in ``search``.
    """
    started = time.perf_counter()
    items, chosen, lattice, work = _prepare(evaluator, models, metric, lattice)
    if lattice.too_large():
        raise ConfigError(
            f"the lattice has {lattice.size:,} transformations, more than the "
            f"{MAX_OPTIMAL_NODES:,} algorithm: optimal searches; use algorithm: heuristic, "
            "or restrict the levels (min/max level per quasi-identifier)"
        )
    state = _OptimalState(work, items, chosen, lattice, suppression_limit, blocks)
    # if the top fails the monotone models, every node does
    if state.monotone and not state.evaluate(state.top_rank) and state.fails[-1]:
        raise _refusal(items, work, lattice, suppression_limit, state.watch, True, state.partial)
    for rank in state.order.tolist():
        if state.best is not None and state.bounds is not None:
            bound = float(state.bounds[rank])
            if bound > state.best_value + _tol(state.best_value):
                break  # bounds only grow from here
            if bound >= state.best_value - _tol(state.best_value) and rank > state.best_rank:
                continue  # at best a tie, which it would lose
        if state.known(rank):
            continue
        if probe and state.monotone:
            state.probe(rank)
            if state.known(rank):
                continue
        state.evaluate(rank)
    if state.best is None:
        raise _refusal(items, work, lattice, suppression_limit, state.watch, True, state.partial)
    return _result(
        evaluator,
        work,
        state.best,
        items,
        chosen,
        suppression_limit,
        state.checked,
        lattice,
        started,
        "optimal",
        sa_cells,
    )


class _OptimalState:
    """Bookkeeping of the optimal search over the ranks of the lattice's node order.

    ``fails``: known to fail the monotone models (a generalisation failed them), a
    down-set. ``mono_ok``: known to satisfy them (a predecessor did), an up-set.
    ``dominated``: a predecessor satisfied *all* models (all monotone) with nothing
    suppressed, and the metric is monotone without suppression: cannot win.
    ``by_block``: some model is not monotone (most nodes checked then fail), so a node is
    first counted block by block and refused as soon as its rows counted need more
    suppression than allowed (``_by_block``); ``partial`` once one was.
    """

    def __init__(
        self,
        work: Evaluator,
        models: tuple[PrivacyModel, ...],
        metric: Metric,
        lattice: Lattice,
        limit: float,
        blocks: bool = True,
    ) -> None:
        self.work = work
        self.models = models
        self.metric = metric
        self.limit = limit
        self.mono = tuple(model for model in models if model.monotone)
        self.monotone = bool(self.mono)
        self.dominance = len(self.mono) == len(models) and metric.monotone_without_suppression
        self.by_block = blocks and len(self.mono) < len(models)
        # the largest k when k-anonymity is the only monotone model (0: not so)
        self.k_only = (
            max(model.k for model in self.mono if isinstance(model, KAnonymity))
            if self.mono and all(isinstance(model, KAnonymity) for model in self.mono)
            else 0
        )
        self.partial = False
        self.cap = max_suppressed(limit, work.n_records)
        self.watch = _Watch()
        self.checked = 0
        nodes = lattice.nodes()
        self.nodes = nodes.tolist()
        n_nodes, n_qi = nodes.shape
        self.n_qi = n_qi
        self.low = lattice.min_levels
        self.high = lattice.max_levels
        self.top_rank = n_nodes - 1
        self.bounds = metric.lower_bounds(work, nodes)
        self.order = (
            np.arange(n_nodes) if self.bounds is None else np.argsort(self.bounds, kind="stable")
        )
        spans = lattice.ranges
        self.strides = [math.prod(spans[j + 1 :]) for j in range(n_qi)]
        flat = (nodes - np.asarray(lattice.min_levels)) @ np.asarray(self.strides, np.int64)
        self.flat = flat.tolist()
        rank_of_flat = np.empty(n_nodes, dtype=np.int64)
        rank_of_flat[flat] = np.arange(n_nodes)
        self.rank_of_flat = rank_of_flat.tolist()
        self.fails = np.zeros(n_nodes, dtype=bool)
        self.mono_ok = np.zeros(n_nodes, dtype=bool)
        self.dominated = np.zeros(n_nodes, dtype=bool)
        self.evaluated = np.zeros(n_nodes, dtype=bool)
        self.cache = _ClassCache()
        self.best: Assessment | None = None
        self.best_value = math.inf
        self.best_rank = -1

    def known(self, rank: int) -> bool:
        """Whether the node needs no check (evaluated, failing or dominated)."""
        return bool(self.evaluated[rank] or self.fails[rank] or self.dominated[rank])

    def _neighbours(self, rank: int, up: bool) -> list[int]:
        node = self.nodes[rank]
        flat = self.flat[rank]
        if up:
            return [
                self.rank_of_flat[flat + self.strides[j]]
                for j in range(self.n_qi)
                if node[j] < self.high[j]
            ]
        return [
            self.rank_of_flat[flat - self.strides[j]]
            for j in range(self.n_qi)
            if node[j] > self.low[j]
        ]

    def _mark(self, rank: int, flags: npt.NDArray[np.bool_], up: bool, itself: bool) -> None:
        """Flag the up-set (or down-set) of ``rank``; flagged sets are closed, so stop there."""
        stack = [rank] if itself else self._neighbours(rank, up)
        while stack:
            current = stack.pop()
            if flags[current]:
                continue
            flags[current] = True
            stack.extend(self._neighbours(current, up))

    def _classes(self, rank: int) -> EquivalenceClasses:
        """Rolled up from the cached node with the fewest cells among the node's
        specialisations (a direct predecessor merges sorted runs; any other is regrouped),
        else counted from a base (``Evaluator.classes``)."""
        node = self.nodes[rank]
        flat = self.flat[rank]
        source: tuple[int, EquivalenceClasses] | None = None
        for j in range(self.n_qi):
            if node[j] > self.low[j]:
                candidate = self.cache.get(self.rank_of_flat[flat - self.strides[j]])
                if candidate is not None and (
                    source is None or candidate.n_cells < source[1].n_cells
                ):
                    source = (j, candidate)
        farther = self.cache.smallest_below(node)
        if farther is not None and (
            source is None or farther.n_cells * ROLLUP_SORT_FACTOR < source[1].n_cells
        ):
            classes = self.work.rollup_to(farther, node)
        elif source is not None:
            classes = self.work.rollup(source[1], source[0])
        else:
            classes = self.work.classes(tuple(node))
        self.cache.put(rank, classes)
        return classes

    def _by_block(self, rank: int) -> tuple[bool, EquivalenceClasses | None]:
        """Count the node block by block (``Evaluator.classes_by_block``): refused (True)
        once the records of the blocks counted in classes violating some model exceed the
        suppression limit. A node whose standing with the monotone models is unknown is
        rolled up instead when a cached specialisation allows; else it learns that
        standing first, from class sizes when k-anonymity is the only monotone model
        (``Evaluator.class_sizes``), or by counting blocks until those models alone
        exceed the limit (its down-set fails too) or every block is counted (its up-set
        satisfies them). Not refused: the node's classes joined from every block, or None
        when it was not cut. A refused node whose every block was counted is cached."""
        known = bool(self.mono_ok[rank])
        if not known and self.cache.smallest_below(self.nodes[rank]) is not None:
            return False, None  # every block would be counted: a roll-up is cheaper
        blocks = self.work.classes_by_block(self.nodes[rank])
        if blocks is None:
            return False, None
        if not known and self.k_only:  # its standing with k first, from class sizes alone
            sizes = self.work.class_sizes(self.nodes[rank])
            if sizes is not None:
                records, units = sizes
                if int(records[units < self.k_only].sum()) > self.cap:
                    self._refused(rank, fails=True)
                    return True, None
                self._mark(rank, self.mono_ok, up=True, itself=True)
                known = True
        needed = mono = 0
        parts: dict[int, EquivalenceClasses] = {}
        joined = None
        for index, part in blocks:
            parts[index] = part
            bad, masks, _ = violating_classes(part, self.models)
            mono_bad = np.zeros(part.n_classes, dtype=bool)
            for model, model_bad in zip(self.models, masks, strict=True):
                if model.monotone:
                    mono_bad |= model_bad
            needed += int(part.sizes[bad].sum())
            mono += int(part.sizes[mono_bad].sum())
            if mono > self.cap or (known and needed > self.cap):
                break
        else:  # every block was counted: the node's classes (kept for roll-ups)
            joined = self.work.joined([parts[index] for index in sorted(parts)])
        if needed <= self.cap:  # every block was counted; it may satisfy the models
            return False, joined
        if joined is not None:
            self.cache.put(rank, joined)
        if self.monotone and mono > self.cap:
            self._refused(rank, fails=True)
        else:
            self._refused(rank, fails=False)
            if self.monotone and not known:  # every block was counted: they hold
                self._mark(rank, self.mono_ok, up=True, itself=True)
        return True, None

    def _refused(self, rank: int, fails: bool) -> None:
        """Book a node refused without its whole classes (``_by_block``); ``fails``: by
        the monotone models alone, so its down-set fails too."""
        self.checked += 1
        progress.add_rows("search", 1, NODES)
        self.evaluated[rank] = True
        self.partial = True
        if fails:
            self._mark(rank, self.fails, up=False, itself=True)

    def evaluate(self, rank: int) -> bool:
        """Check a node, record what it implies for others, and update the best node;
        whether it satisfies the models."""
        counted = None
        if self.by_block:
            refused, counted = self._by_block(rank)
            if refused:
                return False
        if counted is not None:
            classes = counted
            self.cache.put(rank, classes)
        else:
            classes = self._classes(rank)
        result = assess(classes, self.models, self.limit)
        self.checked += 1
        progress.add_rows("search", 1, NODES)
        self.evaluated[rank] = True
        self.watch.note(result, top=rank == self.top_rank)
        if self.monotone:
            needed = (
                result.suppressed_records
                if len(self.mono) == len(self.models) and CERTAIN not in result.violations
                else result.needed_for(self.mono)  # the monotone models' records alone
            )
            if needed > self.cap:
                self._mark(rank, self.fails, up=False, itself=True)
            else:
                self._mark(rank, self.mono_ok, up=True, itself=True)
        if not result.satisfied:
            return False
        if self.dominance and result.suppressed_records == 0:
            self._mark(rank, self.dominated, up=True, itself=False)
        value = self.metric.value(classes, result.suppressed)
        tol = _tol(self.best_value) if self.best is not None else 0.0
        if (
            self.best is None
            or value < self.best_value - tol
            or (value <= self.best_value + tol and rank < self.best_rank)
        ):
            self.best, self.best_value, self.best_rank = result, value, rank
        return True

    def probe(self, rank: int) -> None:
        """Binary search up a chain from ``rank`` to the top for the lowest node that
        satisfies the monotone models; every failure found marks a whole down-set."""
        chain = [rank]
        node = list(self.nodes[rank])
        j = 0
        while True:
            for _ in range(self.n_qi):
                if node[j] < self.high[j]:
                    break
                j = (j + 1) % self.n_qi
            else:
                break
            node[j] += 1
            flat = self.flat[chain[-1]] + self.strides[j]
            chain.append(self.rank_of_flat[flat])
            j = (j + 1) % self.n_qi
        low, high = 0, len(chain) - 1
        while low < high:
            mid = (low + high) // 2
            current = chain[mid]
            if self.fails[current]:
                low = mid + 1
            elif self.mono_ok[current] or self.dominated[current]:
                high = mid
            else:
                self.evaluate(current)
                if self.fails[current]:
                    low = mid + 1
                else:
                    high = mid


def heuristic(
    evaluator: Evaluator,
    models: Sequence[PrivacyModel] | PrivacyModel,
    *,
    suppression_limit: float = 0.0,
    metric: str | Metric = "loss",
    lattice: Lattice | None = None,
    time_limit: float = 10.0,
    sa_cells: bool = True,
) -> SearchResult:
    """A good satisfying node within ``time_limit`` seconds; works on any lattice size.

    1. Greedy climb from the bottom: at each step evaluate the successors (rolled up from
       the current node) and move to the one needing the least suppression (then the
       least metric, counting the violators as suppressed), until a node satisfies.
    2. Local improvement: from the best satisfying node, evaluate its neighbours (one QI
       one level lower, or one QI lower and another higher) and move to the best
       satisfying one while the metric improves.
    3. Anytime best-first search for the remaining time: nodes in order of the metric's
       lower bound (lattice order without one), expanded from the bottom, pruned by the
       best value found. If it runs out of nodes before the time limit, the result is
       optimal and ``proven_optimal`` is True.
    4. If nothing satisfied (or the time ran out first), the most general node is
       checked; if it fails too, PrivacyRefusal.
    ``nodes_checked`` counts the distinct nodes evaluated.
    """
    started = time.perf_counter()
    deadline = started + max(float(time_limit), 0.0)
    items, chosen, lattice, work = _prepare(evaluator, models, metric, lattice)
    limit = suppression_limit
    watch = _Watch()
    seen: dict[Node, tuple[Assessment, float]] = {}
    cache = _ClassCache()

    def classes_of(node: Node) -> EquivalenceClasses:
        for j, pred in enumerate(_lower_each(lattice, node)):
            source = None if pred is None else cache.get(pred)
            if source is not None:
                return work.rollup(source, j)
        return work.classes(node)

    def evaluate(node: Node, classes: EquivalenceClasses | None = None) -> tuple[Assessment, float]:
        found = seen.get(node)
        if found is not None:
            return found
        built = classes if classes is not None else classes_of(node)
        cache.put(node, built)
        result = assess(built, items, limit)
        progress.add_rows("search", 1, NODES)
        watch.note(result, top=node == lattice.top)
        value = chosen.value(built, result.suppressed)
        seen[node] = (result, value)
        return result, value

    def better(a: tuple[Assessment, float], b: tuple[Assessment, float] | None) -> bool:
        if b is None:
            return True
        if a[1] < b[1] - _tol(b[1]):
            return True
        return a[1] <= b[1] + _tol(b[1]) and node_key(a[0].levels) < node_key(b[0].levels)

    def out_of_time() -> bool:
        return time.perf_counter() >= deadline

    # 1. greedy climb
    current_classes = work.classes(lattice.bottom)
    current = evaluate(lattice.bottom, current_classes)
    best = current if current[0].satisfied else None
    while best is None and not out_of_time():
        options = []
        for j, node in enumerate(_raise_each(lattice, current[0].levels)):
            if node is None:
                continue
            rolled = work.rollup(current_classes, j)
            outcome = evaluate(node, rolled)
            score = (outcome[0].suppressed_records, outcome[1], node_key(node))
            options.append((score, outcome, rolled))
            if out_of_time():
                break
        if not options:
            break
        _, current, current_classes = min(options, key=lambda option: option[0])
        if current[0].satisfied:
            best = current

    # 2. local improvement
    improved = best is not None
    while improved and not out_of_time():
        improved = False
        assert best is not None
        for node in _neighbours(lattice, best[0].levels):
            if out_of_time():
                break
            outcome = evaluate(node)
            if outcome[0].satisfied and better(outcome, best):
                best, improved = outcome, True

    # 3. anytime best-first search by lower bound
    def bound(node: Node) -> float:
        bounds = chosen.lower_bounds(work, np.asarray([node], dtype=np.int64))
        return 0.0 if bounds is None else float(bounds[0])

    heap = [(bound(lattice.bottom), node_key(lattice.bottom), lattice.bottom)]
    pushed = {lattice.bottom}
    exhausted = False
    while not out_of_time():
        if not heap:
            exhausted = True
            break
        low, key, node = heapq.heappop(heap)
        if best is not None:
            if low > best[1] + _tol(best[1]):
                exhausted = True  # every node left has a larger bound
                break
            if low >= best[1] - _tol(best[1]) and key > node_key(best[0].levels):
                continue  # neither it nor its generalisations can win
        outcome = evaluate(node)
        if outcome[0].satisfied and better(outcome, best):
            best = outcome
        for successor in lattice.successors(node):
            if successor not in pushed:
                pushed.add(successor)
                heapq.heappush(heap, (bound(successor), node_key(successor), successor))

    for outcome in seen.values():  # anything evaluated along the way
        if outcome[0].satisfied and better(outcome, best):
            best = outcome
    if best is None:
        top = evaluate(lattice.top)
        if not top[0].satisfied:
            raise _refusal(items, work, lattice, limit, watch, complete=exhausted)
        best = top
    result = _result(
        evaluator,
        work,
        best[0],
        items,
        chosen,
        limit,
        len(seen),
        lattice,
        started,
        "heuristic",
        sa_cells,
    )
    return replace(result, proven_optimal=exhausted)


def _lower_each(lattice: Lattice, node: Node) -> list[Node | None]:
    """Per QI: the node with that QI one level lower (None at its min level)."""
    out: list[Node | None] = []
    for j, (level, low) in enumerate(zip(node, lattice.min_levels, strict=True)):
        out.append((*node[:j], level - 1, *node[j + 1 :]) if level > low else None)
    return out


def _raise_each(lattice: Lattice, node: Node) -> list[Node | None]:
    """Per QI: the node with that QI one level higher (None at its max level)."""
    out: list[Node | None] = []
    for j, (level, high) in enumerate(zip(node, lattice.max_levels, strict=True)):
        out.append((*node[:j], level + 1, *node[j + 1 :]) if level < high else None)
    return out


def _neighbours(lattice: Lattice, node: Node) -> list[Node]:
    """Predecessors, then nodes lowering one QI and raising another (deterministic order)."""
    out = list(lattice.predecessors(node))
    for lower in lattice.predecessors(node):
        for higher in lattice.successors(lower):
            if higher != node and higher not in out:
                out.append(higher)
    return out


def search(
    evaluator: Evaluator,
    models: Sequence[PrivacyModel] | PrivacyModel,
    *,
    algorithm: str = "optimal",
    suppression_limit: float = 0.0,
    metric: str | Metric = "loss",
    lattice: Lattice | None = None,
    time_limit: float = 10.0,
    sa_cells: bool = True,
) -> SearchResult:
    """Run ``optimal`` or ``heuristic`` (ConfigError for other algorithm names).
    ``sa_cells=False``: the result's classes may lack SA cells when no model needed them
    (what recoding needs; recounting them with cells took ~1 s of a k-anonymity search
    at 3M rows)."""
    if algorithm == "optimal":
        return optimal(
            evaluator,
            models,
            suppression_limit=suppression_limit,
            metric=metric,
            lattice=lattice,
            sa_cells=sa_cells,
        )
    if algorithm == "heuristic":
        return heuristic(
            evaluator,
            models,
            suppression_limit=suppression_limit,
            metric=metric,
            lattice=lattice,
            time_limit=time_limit,
            sa_cells=sa_cells,
        )
    raise ConfigError(f"unknown algorithm {algorithm!r}; use optimal or heuristic")
