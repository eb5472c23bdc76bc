"""The generalisation lattice: transformations (one level per QI), ordered componentwise.

A node (transformation) is a tuple of levels, level ``j`` in ``[min_levels[j],
max_levels[j]]`` (by default ``0..height`` of QI ``j``'s hierarchy). Node ``a`` is a
generalisation of ``b`` when ``a >= b`` componentwise; successors raise one QI by one
level, predecessors lower one. The deterministic order used everywhere (enumeration,
tie-breaking) is: lower sum of levels first, then lexicographically smaller level vector.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.errors import ConfigError

__all__ = ["MAX_OPTIMAL_NODES", "Lattice", "Node", "node_key"]

IntArray: TypeAlias = npt.NDArray[np.int64]
Node: TypeAlias = tuple[int, ...]

MAX_OPTIMAL_NODES: Final = 10**6
"""Largest lattice the optimal (exhaustive with pruning) search accepts."""


def node_key(node: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """Sort key of the deterministic node order: (sum of levels, levels)."""
    levels = tuple(int(x) for x in node)
    return sum(levels), levels


@dataclass(frozen=True)
class Lattice:
    """Product of level ranges ``[min_levels[j], max_levels[j]]``, one per QI."""

    min_levels: tuple[int, ...]
    max_levels: tuple[int, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        low = tuple(int(x) for x in self.min_levels)
        high = tuple(int(x) for x in self.max_levels)
        if len(low) != len(high) or not low:
            raise ConfigError("a lattice needs one min and one max level per quasi-identifier")
        names = tuple(self.names) or tuple(f"qi{j}" for j in range(len(low)))
        if len(names) != len(low):
            raise ConfigError("a lattice needs one name per quasi-identifier")
        for name, a, b in zip(names, low, high, strict=True):
            if a < 0 or b < a:
                raise ConfigError(
                    f"levels of {name!r}: min {a} / max {b} must satisfy 0 <= min <= max"
                )
        object.__setattr__(self, "min_levels", low)
        object.__setattr__(self, "max_levels", high)
        object.__setattr__(self, "names", names)

    @classmethod
    def from_hierarchies(
        cls,
        hierarchies: Sequence[Hierarchy],
        min_levels: Sequence[int] | None = None,
        max_levels: Sequence[int] | None = None,
        names: Sequence[str] | None = None,
    ) -> Lattice:
        """The lattice of the hierarchies (levels ``0..height`` unless restricted)."""
        heights = [h.height for h in hierarchies]
        names = tuple(names) if names is not None else tuple(h.attribute for h in hierarchies)
        low = tuple(min_levels) if min_levels is not None else (0,) * len(heights)
        high = tuple(max_levels) if max_levels is not None else tuple(heights)
        if len(low) != len(heights) or len(high) != len(heights):
            raise ConfigError("give one min and one max level per quasi-identifier")
        for name, b, height in zip(names, high, heights, strict=True):
            if b > height:
                raise ConfigError(
                    f"max level {b} of {name!r} is above its hierarchy's top level {height}"
                )
        return cls(low, high, names)

    # ----------------------------------------------------------------- shape

    @property
    def n_qi(self) -> int:
        """Number of quasi-identifiers (dimensions)."""
        return len(self.min_levels)

    @property
    def ranges(self) -> tuple[int, ...]:
        """Number of levels per QI in the lattice."""
        return tuple(b - a + 1 for a, b in zip(self.min_levels, self.max_levels, strict=True))

    @property
    def size(self) -> int:
        """Number of nodes (transformations)."""
        return math.prod(self.ranges)

    @property
    def height(self) -> int:
        """Number of layers minus one (the longest chain from bottom to top)."""
        return sum(self.max_levels) - sum(self.min_levels)

    def too_large(self, limit: int = MAX_OPTIMAL_NODES) -> bool:
        """Whether the lattice has more than ``limit`` nodes (the optimal search refuses)."""
        return self.size > limit

    @property
    def bottom(self) -> Node:
        """The least generalised node."""
        return self.min_levels

    @property
    def top(self) -> Node:
        """The most generalised node."""
        return self.max_levels

    # ----------------------------------------------------------------- nodes

    def contains(self, node: Sequence[int]) -> bool:
        """Whether ``node`` is a node of this lattice."""
        return len(node) == self.n_qi and all(
            a <= int(x) <= b for x, a, b in zip(node, self.min_levels, self.max_levels, strict=True)
        )

    def check(self, node: Sequence[int]) -> Node:
        """``node`` as a tuple of ints; ValueError if it is not in the lattice."""
        levels = tuple(int(x) for x in node)
        if not self.contains(levels):
            raise ValueError(
                f"{levels} is not a node of the lattice {self.min_levels}..{self.max_levels}"
            )
        return levels

    def nodes(self) -> IntArray:
        """All nodes as an (size, n_qi) array, in the deterministic order (sum, then levels).

        Refuses lattices above ``MAX_OPTIMAL_NODES`` (they are searched heuristically,
        node by node, never enumerated).
        """
        if self.too_large():
            raise ConfigError(
                f"the lattice has {self.size:,} transformations, too many to enumerate "
                f"(limit {MAX_OPTIMAL_NODES:,}); use algorithm: heuristic or restrict levels"
            )
        grids = np.indices(self.ranges, dtype=np.int64).reshape(self.n_qi, -1).T
        nodes = grids + np.asarray(self.min_levels, dtype=np.int64)
        keys = [nodes[:, j] for j in range(self.n_qi - 1, -1, -1)]
        order = np.lexsort((*keys, nodes.sum(axis=1)))
        return nodes[order]

    def __iter__(self) -> Iterator[Node]:
        for row in self.nodes():
            yield tuple(int(x) for x in row)

    def __len__(self) -> int:
        return self.size

    def index(self, node: Sequence[int]) -> int:
        """Mixed-radix index of a node (C order over the level ranges)."""
        levels = self.check(node)
        index = 0
        for level, low, span in zip(levels, self.min_levels, self.ranges, strict=True):
            index = index * span + (level - low)
        return index

    def successors(self, node: Sequence[int]) -> list[Node]:
        """Nodes that raise one QI by one level, in QI order."""
        levels = self.check(node)
        out = []
        for j, (level, high) in enumerate(zip(levels, self.max_levels, strict=True)):
            if level < high:
                out.append((*levels[:j], level + 1, *levels[j + 1 :]))
        return out

    def predecessors(self, node: Sequence[int]) -> list[Node]:
        """Nodes that lower one QI by one level, in QI order."""
        levels = self.check(node)
        out = []
        for j, (level, low) in enumerate(zip(levels, self.min_levels, strict=True)):
            if level > low:
                out.append((*levels[:j], level - 1, *levels[j + 1 :]))
        return out

    @staticmethod
    def generalizes(a: Sequence[int], b: Sequence[int]) -> bool:
        """Whether ``a`` is ``b`` or a generalisation of it (componentwise ``a >= b``)."""
        return len(a) == len(b) and all(int(x) >= int(y) for x, y in zip(a, b, strict=True))
