"""Reconstruction attack: microdata consistent with every published table.

Dinur & Nissim (2003) showed that enough exact or lightly noised counts determine the
data; the US Census Bureau reconstructed the 2010 census's block-level records from its
published tables. The attacker here holds published counts over a small set of columns
(a *domain*: the cartesian product of each column's labels) and solves for a table of
integer record counts per domain cell that agrees with them:

- ``exact`` counts are equalities (an anonymised table with no suppressed row, a total);
- ``lower`` counts are lower bounds (a table's kept rows: suppressed rows are somewhere);
- ``noisy`` counts (DP cells, local-DP estimates) are met as closely as possible: the
  program minimises the total absolute deviation from them, each weighted by 1/scale.

An integer program (scipy's HiGHS, ``milp``) within a time limit; past it, the linear
relaxation (``linprog``) rounded to records. Among the tables that fit the counts equally
well, a second program picks the one nearest the product of the first one's margins (a
vertex of the first program piles records into few cells; the split the counts leave
open is best guessed from the margins). The reconstruction is scored by the share of
its records that equal a real record exactly (Σ_c min(recon_c, true_c) / Σ_c recon_c),
beside the same score of *chance* reconstructions built from the reconstruction's own
one-way margins: their independence product, and a uniform spread.

The domain is capped (:data:`MAX_CELLS`): the program has one variable per cell.

Pure core: numpy and scipy only (no Beam).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # scipy is imported where used: a run without attacks skips it
    from scipy import sparse

__all__ = [
    "MAX_CELLS",
    "Marginal",
    "Reconstruction",
    "independence",
    "match_share",
    "reconstruct",
    "round_to",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Kind = Literal["exact", "lower", "noisy"]

# one LP variable per cell; HiGHS solves a few thousand variables with a few thousand
# constraints in well under a second, the integer program within its time limit
MAX_CELLS = 4096
INTEGER_CELLS = 512  # the tie-break's last program in integers up to this many cells
# ... within this many branch-and-bound nodes: a budget of work, not of seconds, so that the
# same counts give the same table on a busy machine too (a 2 s limit gave two processes
# of one run two tables); the demo's programs need 0-1 nodes
INTEGER_NODES = 200


@dataclass(frozen=True)
class Marginal:
    """A published table of counts over the domain.

    ``maps[j]``: per label of domain column j, the index of the marginal's label covering
    it (-1: the label is not counted in any cell of this table); a column the table does
    not have maps every label to 0 (``sizes[j]`` = 1). ``counts``: the published count
    per marginal cell, C order over ``sizes``.
    """

    name: str
    maps: tuple[IntArray, ...]
    sizes: tuple[int, ...]
    counts: FloatArray
    kind: Kind = "noisy"
    scale: float = 1.0  # the noise's scale (noisy counts only): weight 1/scale

    def matrix(self, domain: Sequence[int]) -> sparse.csr_matrix:
        """(marginal cells x domain cells) 0/1 matrix: which domain cells each cell sums."""
        from scipy import sparse

        grids = np.meshgrid(*[np.arange(d) for d in domain], indexing="ij")
        labels = [self.maps[j][g.ravel()] for j, g in enumerate(grids)]
        ok = np.all(np.stack(labels) >= 0, axis=0) if labels else np.ones(1, dtype=bool)
        n = int(np.prod(domain)) if domain else 1
        rows = (
            np.ravel_multi_index([lab[ok] for lab in labels], self.sizes)
            if labels
            else np.zeros(1, dtype=np.int64)
        )
        cols = np.arange(n)[ok]
        m = int(np.prod(self.sizes)) if self.sizes else 1
        data = np.ones(cols.shape[0], dtype=np.float64)
        return sparse.csr_matrix((data, (rows, cols)), shape=(m, n))


@dataclass(frozen=True)
class Reconstruction:
    """Records per domain cell consistent with the marginals, and how it was found."""

    counts: IntArray
    method: str  # "integer program" | "linear relaxation, rounded"
    deviation: float  # weighted total absolute deviation from the noisy counts
    marginals: tuple[str, ...] = field(default=())


def round_to(values: FloatArray, total: int) -> IntArray:
    """Non-negative integers summing to ``total``, closest to ``values`` (largest remainder)."""
    v = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    if v.sum() <= 0 or total <= 0:
        return np.zeros(v.shape, dtype=np.int64)
    v = v * (total / v.sum())
    base: IntArray = np.floor(v).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        order = np.argsort(-(v - base), kind="stable")[:short]
        base[order] += 1
    return base


def reconstruct(
    domain: Sequence[int],
    marginals: Sequence[Marginal],
    *,
    time_limit: float = 20.0,
) -> Reconstruction:
    """Integer records per cell of ``domain`` (sizes per column) meeting the exact and
    lower-bound counts and closest (weighted L1) to the noisy ones. ``time_limit``:
    seconds for the whole reconstruction (the program and its tie-breaks together)."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp

    deadline = time.monotonic() + time_limit
    n = int(np.prod(domain)) if domain else 1
    if n > MAX_CELLS:
        raise ValueError(f"the domain has {n} cells; at most {MAX_CELLS} fit the program")
    noisy = [m for m in marginals if m.kind == "noisy"]
    blocks_a: list[sparse.csr_matrix] = []
    lo: list[FloatArray] = []
    hi: list[FloatArray] = []
    n_noise = sum(int(np.prod(m.sizes)) for m in noisy)
    weights: list[FloatArray] = []
    offset = 0
    for m in marginals:
        a = m.matrix(domain)
        y = np.asarray(m.counts, dtype=np.float64).ravel()
        if m.kind == "noisy":
            k = a.shape[0]
            eye = sparse.csr_matrix(
                (np.ones(k), (np.arange(k), offset + np.arange(k))), shape=(k, n_noise)
            )
            blocks_a.append(sparse.hstack([a, -eye, eye], format="csr"))
            lo.append(y)
            hi.append(y)
            weights.append(np.full(k, 1.0 / max(m.scale, 1e-9)))
            offset += k
        else:
            blocks_a.append(sparse.hstack([a, sparse.csr_matrix((a.shape[0], 2 * n_noise))]))
            lo.append(y)
            hi.append(y if m.kind == "exact" else np.full(y.shape, np.inf))
    w = np.concatenate(weights) if weights else np.zeros(0)
    c = np.concatenate([np.zeros(n), w, w])
    if not blocks_a:
        return Reconstruction(np.zeros(n, dtype=np.int64), "no counts", 0.0, ())
    a_all = sparse.vstack(blocks_a, format="csr")
    lo_all, hi_all = np.concatenate(lo), np.concatenate(hi)
    names = tuple(m.name for m in marginals)
    integrality = np.concatenate([np.ones(n), np.zeros(2 * n_noise)])
    result = milp(
        c,
        constraints=LinearConstraint(a_all, lo_all, hi_all),
        integrality=integrality,
        bounds=Bounds(0, np.inf),
        options={"time_limit": time_limit, "disp": False},
    )
    if result.x is not None:
        x = np.maximum(np.rint(result.x[:n]), 0).astype(np.int64)
        fun = float(result.fun or 0.0)
        x = _tie_break(a_all, lo_all, hi_all, c, fun, x, domain, deadline)
        return Reconstruction(x, "integer program", fun, names)
    # no integer solution in time (or none exists): the relaxation, rounded
    a_eq = a_all[np.isfinite(hi_all) & (lo_all == hi_all)]
    b_eq = lo_all[np.isfinite(hi_all) & (lo_all == hi_all)]
    a_ub = -a_all[~(np.isfinite(hi_all) & (lo_all == hi_all))]
    b_ub = -lo_all[~(np.isfinite(hi_all) & (lo_all == hi_all))]
    relaxed = linprog(
        c,
        A_ub=a_ub if a_ub.shape[0] else None,
        b_ub=b_ub if a_ub.shape[0] else None,
        A_eq=a_eq if a_eq.shape[0] else None,
        b_eq=b_eq if a_eq.shape[0] else None,
        bounds=(0, None),
        method="highs",
    )
    if relaxed.x is None:
        raise ValueError(f"the published counts admit no table: {relaxed.message}")
    x = np.asarray(relaxed.x[:n], dtype=np.float64)
    fun = float(relaxed.fun or 0.0)
    x = _tie_break(a_all, lo_all, hi_all, c, fun, x, domain, deadline).astype(np.float64)
    return Reconstruction(
        round_to(x, round(x.sum())),
        "linear relaxation, rounded",
        float(relaxed.fun or 0.0),
        names,
    )


def _tie_break(
    a_all: sparse.csr_matrix,
    lo_all: FloatArray,
    hi_all: FloatArray,
    c: FloatArray,
    fun: float,
    x: npt.ArrayLike,
    domain: Sequence[int],
    deadline: float,
) -> IntArray:
    """The optimal table nearest a uniform spread, then nearest the product of that one's
    margins (linear programs, rounded to records by largest remainder; the last one in
    integers for domains of at most INTEGER_CELLS cells when the solver finds them
    within INTEGER_NODES nodes); each within what is left before ``deadline``
    (time.monotonic)."""
    first = np.asarray(x, dtype=np.float64)
    best = round_to(first, round(float(first.sum())))
    prior = np.full(first.shape[0], first.sum() / max(first.shape[0], 1))
    for _ in range(2):
        left = deadline - time.monotonic()
        if left <= 0:  # out of time: the best table so far
            return best
        found = _closest(a_all, lo_all, hi_all, c, fun, prior, left, False)
        if found is None:
            break
        best = round_to(found.astype(np.float64), round(float(found.sum())))
        prior = _product(best, domain)
    # in integers if the program manages it quickly (rounding may cut a bound by a record)
    left = deadline - time.monotonic()
    if len(prior) > INTEGER_CELLS or left <= 0:
        return best
    exact = _closest(a_all, lo_all, hi_all, c, fun, prior, left, True, INTEGER_NODES)
    return best if exact is None else np.asarray(exact, dtype=np.int64)


def _closest(
    a_all: sparse.csr_matrix,
    lo_all: FloatArray,
    hi_all: FloatArray,
    c: FloatArray,
    fun: float,
    prior: FloatArray,
    time_limit: float,
    integer: bool,
    node_limit: int | None = None,
) -> npt.NDArray[Any] | None:
    """Among the tables as close to the noisy counts as the optimum (``fun``), the one
    nearest (L1) to ``prior``: the LP's vertex piles records into few cells, while any
    split the counts leave open is best guessed from the margins' product (the attacker
    of the census reconstruction likewise chose the most likely of the consistent tables).
    None if the program finds nothing in time."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, rows = prior.shape[0], a_all.shape[0]
    k2 = c.shape[0] - n
    eye = sparse.identity(n, format="csr")
    a = sparse.vstack(
        [
            sparse.hstack([a_all, sparse.csr_matrix((rows, 2 * n))]),
            sparse.hstack([sparse.csr_matrix(c[None, :]), sparse.csr_matrix((1, 2 * n))]),
            sparse.hstack([eye, sparse.csr_matrix((n, k2)), -eye, eye]),
        ],
        format="csr",
    )
    tol = 1e-6 * max(1.0, abs(fun)) + 1e-6
    lo = np.concatenate([lo_all, [-np.inf], prior])
    hi = np.concatenate([hi_all, [fun + tol], prior])
    objective = np.concatenate([np.zeros(n + k2), np.ones(2 * n)])
    integrality = np.concatenate([np.full(n, 1 if integer else 0), np.zeros(k2 + 2 * n)])
    result = milp(
        objective,
        constraints=LinearConstraint(a, lo, hi),
        integrality=integrality,
        bounds=Bounds(0, np.inf),
        options={
            "time_limit": time_limit,
            "disp": False,
            **({} if node_limit is None else {"node_limit": node_limit}),
        },
    )
    if result.x is None:
        return None
    x = np.maximum(np.asarray(result.x[:n], dtype=np.float64), 0.0)
    return np.rint(x).astype(np.int64) if integer else x


def _product(counts: npt.ArrayLike, domain: Sequence[int]) -> FloatArray:
    """The independence product of a table's one-way margins, as records per cell."""
    table = np.asarray(counts, dtype=np.float64).reshape(tuple(domain))
    total = float(table.sum())
    product = np.full(tuple(domain), total, dtype=np.float64)
    if total <= 0:
        return product.ravel()
    for j in range(len(domain)):
        axes = tuple(i for i in range(len(domain)) if i != j)
        shape = [1] * len(domain)
        shape[j] = domain[j]
        product = product * (table.sum(axis=axes) / total).reshape(shape)
    return product.ravel()


def match_share(reconstructed: IntArray, truth: IntArray) -> float:
    """Share of reconstructed records equal to a real record: Σ min(r, t) / Σ r."""
    r = np.asarray(reconstructed, dtype=np.int64)
    total = int(r.sum())
    if total <= 0:
        return 0.0
    return float(np.minimum(r, np.asarray(truth, dtype=np.int64)).sum() / total)


def independence(counts: IntArray, domain: Sequence[int]) -> IntArray:
    """The chance reconstruction from one-way margins: their product, rounded to records."""
    total = int(np.asarray(counts, dtype=np.int64).sum())
    return round_to(_product(counts, domain), total)
