"""Attacks on differentially private releases: histograms and counts.

REFERENCE.md: an ε-DP release lets the posterior odds of any statement about one person
exceed the prior odds by at most e^ε, so from a uniform prior a membership or attribute
guess succeeds with probability at most e^ε/(1+e^ε) ((e^ε+δ)/(1+e^ε) for (ε, δ)-DP).
Differencing two releases that differ by one person is exact without noise and bounded
with it.

- ``histogram_attribute_inference``: the attacker reads the noisy (QI x SA) cells of the
  target's QI cell, clamps at 0 and guesses the most frequent SA value. Its accuracy
  mixes population-level inference (which DP does not hide) with per-person leakage, so
  it is reported beside the prior's accuracy; the per-person leakage is measured, when
  the true histogram is given, by the strongest DP adversary (it knows every other
  record): a membership game per target, compared with the bound.
- ``membership_inference``: the optimal (likelihood ratio) test between neighbouring
  counts c and c+1, simulated R times with a ``NoiseSampler`` and compared with the bound.
- ``differencing_attack``: q(D) - q(D without t), simulated the same way; with
  ``NoNoise`` it is exact.

Trials are vectorised: one sampler call for all R trials. World bits come from a seeded
``np.random.default_rng`` (the experiment's coin, not released noise). Pure core: numpy,
pandas, scipy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.attacks.knowledge import AttackerKnowledge
from privpipe.attacks.matching import canonical_strings, unique_rows
from privpipe.attacks.result import AttackResult
from privpipe.attacks.stats import wilson_interval
from privpipe.dp.noise import NoiseSampler, rho_to_epsilon

__all__ = [
    "NoNoise",
    "difference_histograms",
    "differencing_attack",
    "dp_success_bound",
    "histogram_attribute_inference",
    "membership_inference",
    "optimal_success",
    "person_contribution",
]

IntArray: TypeAlias = npt.NDArray[np.int64]
Mechanism: TypeAlias = Literal["discrete_laplace", "discrete_gaussian"]


class NoNoise:
    """A ``NoiseSampler`` that adds nothing: the "no noise" seam that shows what DP buys."""

    def discrete_laplace(self, values: IntArray, scale: float) -> IntArray:
        """The values unchanged."""
        return np.asarray(values, dtype=np.int64).copy()

    def discrete_gaussian(self, values: IntArray, sigma: float) -> IntArray:
        """The values unchanged."""
        return np.asarray(values, dtype=np.int64).copy()


def dp_success_bound(epsilon: float, delta: float = 0.0) -> float:
    """Highest success of any guess about one person from a uniform prior: (e^ε+δ)/(1+e^ε).

    Written as (1+δe^-ε)/(1+e^-ε) so large ε does not overflow; capped at 1.
    """
    if epsilon < 0 or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon!r}, {delta!r}")
    shrink = math.exp(-epsilon)  # in (0, 1]: no overflow
    return min(1.0, (1.0 + delta * shrink) / (1.0 + shrink))


def _zero_mass(mechanism: Mechanism, scale: float) -> float:
    """P[Z = 0] of the integer noise."""
    if mechanism == "discrete_laplace":
        p = math.exp(-1.0 / scale)
        return (1.0 - p) / (1.0 + p)
    k = np.arange(1, math.ceil(40.0 * scale) + 2, dtype=np.float64)
    return 1.0 / (1.0 + 2.0 * float(np.exp(-(k**2) / (2.0 * scale * scale)).sum()))


def _cdf(mechanism: Mechanism, scale: float, at: int) -> float:
    """P[Z <= at] of the symmetric integer noise, ``at`` >= -1."""
    if at < 0:
        return 1.0 - _cdf(mechanism, scale, -at - 1)
    if mechanism == "discrete_laplace":
        p = math.exp(-1.0 / scale)
        return 1.0 - p ** (at + 1) / (1.0 + p)
    k = np.arange(at + 1, at + math.ceil(40.0 * scale) + 2, dtype=np.float64)
    tail = float(np.exp(-(k**2) / (2.0 * scale * scale)).sum())  # P[Z > at] / P[Z = 0]
    return 1.0 - tail * _zero_mass(mechanism, scale)


def optimal_success(mechanism: Mechanism, scale: float, shift: int = 1) -> float:
    """Exact success of the optimal test between counts c and c+``shift`` (uniform prior).

    ``shift`` is what one person changes the count by (their full contribution). For
    symmetric unimodal integer noise the test is "y >= c + ⌈shift/2⌉", right with
    probability ½(P[Z <= ⌊shift/2⌋] + P[Z <= ⌈shift/2⌉ - 1]); for shift 1 that is
    ½ + ½·P[Z = 0], for discrete Laplace with b = shift/ε exactly e^ε/(1+e^ε).
    """
    if shift < 1:
        raise ValueError(f"shift must be an integer >= 1, got {shift!r}")
    if scale <= 0:
        return 1.0
    return 0.5 * (_cdf(mechanism, scale, shift // 2) + _cdf(mechanism, scale, (shift + 1) // 2 - 1))


def _epsilon_delta(
    mechanism: Mechanism,
    scale: float,
    epsilon: float | None,
    delta: float,
    sensitivity: float,
) -> tuple[float | None, float]:
    """The guarantee the bound is computed from: given, or derived from the scale."""
    if epsilon is not None:
        return epsilon, delta
    if mechanism == "discrete_laplace":
        return sensitivity / scale, 0.0
    if delta <= 0.0:
        return None, delta  # a discrete Gaussian has no pure-ε bound
    return rho_to_epsilon(sensitivity**2 / (2.0 * scale * scale), delta), delta


def _noise(sampler: NoiseSampler, mechanism: Mechanism, values: IntArray, scale: float) -> IntArray:
    if mechanism == "discrete_laplace":
        return sampler.discrete_laplace(values, scale)
    if mechanism == "discrete_gaussian":
        return sampler.discrete_gaussian(values, scale)
    raise ValueError(f"mechanism must be discrete_laplace or discrete_gaussian, got {mechanism!r}")


def _shift(shift: int) -> int:
    """A person's contribution to one count: an integer >= 1."""
    if isinstance(shift, bool) or int(shift) != shift or shift < 1:
        raise ValueError(f"shift must be an integer >= 1, got {shift!r}")
    return int(shift)


def person_contribution(parameters: Mapping[str, Any], noise: Mapping[str, Any]) -> int:
    """How much one person can move one released count: the L1 sensitivity the count's
    noise was calibrated to (release.json ``count_noise.sensitivity`` for discrete
    Laplace), else max_partitions × max_contributions_per_partition (a Gaussian's
    recorded sensitivity is L2), else 1."""
    if noise.get("mechanism") == "discrete_laplace" and noise.get("sensitivity"):
        return max(1, round(float(noise["sensitivity"])))
    l0 = parameters.get("max_partitions")
    linf = parameters.get("max_contributions_per_partition")
    if l0 and linf:
        return max(1, int(l0) * int(linf))
    return max(1, round(float(noise.get("sensitivity") or 1)))


def _coin_flips(seed: int, trials: int) -> npt.NDArray[np.bool_]:
    """The target's in/out bit per trial (the attacker's experiment, not released noise)."""
    return np.random.default_rng(seed).integers(0, 2, size=trials).astype(bool)


def _bound_and_details(
    mechanism: Mechanism,
    scale: float,
    epsilon: float | None,
    delta: float,
    sensitivity: float,
    count: int,
    seed: int,
) -> tuple[float | None, dict[str, Any]]:
    """The success bound (e^ε+δ)/(1+e^ε) of a trial attack and its recorded parameters."""
    eps, dlt = _epsilon_delta(mechanism, scale, epsilon, delta, sensitivity)
    bound = dp_success_bound(eps, dlt) if eps is not None else None
    details: dict[str, Any] = {
        "mechanism": mechanism,
        "scale": scale,
        "epsilon": eps,
        "delta": dlt,
        "count": count,
        "seed": seed,
    }
    return bound, details


def _trial_result(
    name: str,
    guess: npt.NDArray[np.bool_],
    bits: npt.NDArray[np.bool_],
    bound: float | None,
    details: Mapping[str, Any],
) -> AttackResult:
    trials = int(bits.shape[0])
    right = guess == bits
    successes = int(right.sum())
    rate = successes / trials if trials else 0.0
    ins, outs = bits.sum(), (~bits).sum()
    rates = {
        "rate": rate,
        "advantage": 2.0 * rate - 1.0,
        "true_positive_rate": float((guess & bits).sum() / ins) if ins else 0.0,
        "false_positive_rate": float((guess & ~bits).sum() / outs) if outs else 0.0,
    }
    return AttackResult(
        name=name,
        rates=rates,
        targets=trials,
        interval=wilson_interval(successes, trials),
        bound=bound,
        details=dict(details),
    )


def membership_inference(
    count: int,
    *,
    scale: float,
    sampler: NoiseSampler,
    mechanism: Mechanism = "discrete_laplace",
    trials: int = 10_000,
    epsilon: float | None = None,
    delta: float = 0.0,
    sensitivity: float = 1.0,
    seed: int = 0,
    shift: int = 1,
) -> AttackResult:
    """Membership inference on one released count by the likelihood-ratio test.

    Each trial flips a fair coin: the target is in (true count ``count`` + ``shift``, the
    person's full contribution to the release) or out (``count``); the attacker, who
    knows ``count`` (everyone else), sees the noisy count y and says "in" iff
    y >= count + ⌈shift/2⌉, the optimal test for symmetric unimodal noise. ``scale`` is
    b (Laplace) or σ (Gaussian). Bound (e^ε+δ)/(1+e^ε), ε from the arguments or b =
    sensitivity/ε; ``expected_success`` is the exact theoretical value.
    """
    step = _shift(shift)
    bits = _coin_flips(seed, trials)
    noisy = _noise(sampler, mechanism, count + step * bits.astype(np.int64), scale)
    guess = noisy >= count + (step + 1) // 2
    bound, details = _bound_and_details(mechanism, scale, epsilon, delta, sensitivity, count, seed)
    details["expected_success"] = optimal_success(mechanism, scale, step)
    details["shift"] = step
    return _trial_result("membership_inference", guess, bits, bound, details)


def differencing_attack(
    count: int,
    *,
    scale: float,
    sampler: NoiseSampler,
    mechanism: Mechanism = "discrete_laplace",
    trials: int = 10_000,
    epsilon: float | None = None,
    delta: float = 0.0,
    sensitivity: float = 1.0,
    seed: int = 0,
    shift: int = 1,
) -> AttackResult:
    """Differencing attack: q(D) - q(D without t) reveals t's bit (has the attribute or not).

    Each trial: the target's bit x is a fair coin; q(D) = ``count`` + ``shift``·x (the
    person's full contribution) and q(D - t) = ``count`` are released, each with its own
    noise; the attacker guesses x = 1 iff the difference is >= ⌈shift/2⌉. Exact with
    ``NoNoise``; with noise bounded by (e^ε+δ)/(1+e^ε), ε being the guarantee of the
    release that contains t.
    """
    step = _shift(shift)
    bits = _coin_flips(seed, trials)
    values = np.concatenate(
        [count + step * bits.astype(np.int64), np.full(trials, count, dtype=np.int64)]
    )
    noisy = _noise(sampler, mechanism, values, scale)
    guess = (noisy[:trials] - noisy[trials:]) >= (step + 1) // 2
    bound, details = _bound_and_details(mechanism, scale, epsilon, delta, sensitivity, count, seed)
    details["shift"] = step
    return _trial_result("differencing", guess, bits, bound, details)


def difference_histograms(
    with_target: pd.DataFrame,
    without_target: pd.DataFrame,
    keys: Sequence[str],
    count_col: str = "count",
) -> pd.DataFrame:
    """Cells of two releases with their count difference, largest first.

    On exact counts the first row is the removed person's cell, with difference 1.
    """
    keys = list(keys)
    a = with_target.set_index(keys)[count_col].astype(np.int64)
    b = without_target.set_index(keys)[count_col].astype(np.int64)
    diff = a.sub(b, fill_value=0).astype(np.int64).rename("difference")
    return diff.sort_values(ascending=False, kind="stable").reset_index()


def _joint_ids(*tables: Sequence[npt.NDArray[Any]]) -> tuple[list[IntArray], int]:
    """Dense ids of value tuples over the rows of several tables (same tuple, same id).

    Each table is a list of columns (one per key, the same keys in every table).
    """
    sizes = [t[0].shape[0] if t else 0 for t in tables]
    bounds = np.cumsum([0, *sizes])
    if not tables or not tables[0]:
        return [np.zeros(n, dtype=np.int64) for n in sizes], 1
    cols = []
    for j in range(len(tables[0])):
        codes, _ = canonical_strings(np.concatenate([t[j].astype(object) for t in tables]))
        cols.append(codes)
    uniq, ids = unique_rows(np.stack(cols, axis=1))
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return [ids[bounds[i] : bounds[i + 1]] for i in range(len(tables))], int(uniq.shape[0])


def histogram_attribute_inference(
    histogram: pd.DataFrame,
    targets: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    *,
    epsilon: float,
    delta: float = 0.0,
    knowledge: AttackerKnowledge | None = None,
    count_col: str = "count",
    true_histogram: pd.DataFrame | None = None,
) -> AttackResult:
    """Attribute inference from a noisy (QI x SA) histogram.

    For each target the attacker reads the noisy counts of its QI cell (``qis``: the
    histogram's group-by columns other than ``sa``), clamps them at 0, forms the posterior
    over SA values and guesses the argmax. ``rate`` = disclosure (posterior >= tau);
    ``accuracy`` = guess right; ``correct_disclosure``; ``prior_accuracy`` = always
    guessing the most frequent value of the noisy SA marginal (what population statistics
    alone give). With ``true_histogram`` (the exact counts, same cells), the per-person
    leakage is measured as ``per_person_success``: a strong adversary knowing every other
    record decides "in" (y >= c+1) vs "out" for the target from its own cell, the real
    noise Z of that cell serving as the noise of both worlds (each a valid draw); it is
    the quantity the bound e^ε/(1+e^ε) ((e^ε+δ)/(1+e^ε)) holds for. Cells left out of
    the release count as a coin flip (½).
    """
    knowledge = knowledge or AttackerKnowledge()
    qis = list(qis)
    sa_codes, sa_names = canonical_strings(
        np.concatenate([histogram[sa].to_numpy(dtype=object), targets[sa].to_numpy(dtype=object)])
    )
    m = sa_names.shape[0]
    h_sa, t_sa = sa_codes[: len(histogram)], sa_codes[len(histogram) :]
    (h_ids, t_ids), n_cells = _joint_ids(
        [histogram[q].to_numpy(dtype=object) for q in qis],
        [targets[q].to_numpy(dtype=object) for q in qis],
    )
    noisy = np.clip(histogram[count_col].to_numpy(dtype=np.float64), 0.0, None)
    cells = np.zeros((n_cells, m), dtype=np.float64)
    np.add.at(cells, (h_ids, h_sa), noisy)
    seen = cells[t_ids]
    total = seen.sum(axis=1)
    guess = np.argmax(seen, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(total > 0, seen.max(axis=1) / np.where(total > 0, total, 1.0), 0.0)
    n = len(targets)
    right = (guess == t_sa) & (total > 0)
    confident = conf >= knowledge.tau
    marginal = cells.sum(axis=0)
    prior_guess = int(np.argmax(marginal)) if m else -1
    rates: dict[str, float] = {
        "rate": float(confident.sum()) / n if n else 0.0,
        "accuracy": float(right.sum()) / n if n else 0.0,
        "correct_disclosure": float((confident & right).sum()) / n if n else 0.0,
        "prior_accuracy": float((t_sa == prior_guess).sum()) / n if n else 0.0,
    }
    details: dict[str, Any] = {"epsilon": epsilon, "delta": delta, "tau": knowledge.tau}
    if true_histogram is not None:
        rates["per_person_success"] = _per_person_success(
            histogram, true_histogram, targets, qis, sa, count_col
        )
    rates["advantage_over_prior"] = rates["accuracy"] - rates["prior_accuracy"]
    return AttackResult(
        name="dp_attribute_inference",
        rates=rates,
        targets=n,
        interval=wilson_interval(int(confident.sum()), n),
        bound=dp_success_bound(epsilon, delta),
        bound_rate="per_person_success",
        details=details,
    )


def _per_person_success(
    noisy: pd.DataFrame,
    exact: pd.DataFrame,
    targets: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    count_col: str,
) -> float:
    """Mean over targets of ½([Z >= 0] + [Z <= 0]), Z the real noise of the target's cell."""
    keys = [*qis, sa]
    (n_ids, e_ids, t_ids), size = _joint_ids(
        *([frame[k].to_numpy(dtype=object) for k in keys] for frame in (noisy, exact, targets))
    )
    released = np.full(size, np.nan)
    released[n_ids] = noisy[count_col].to_numpy(dtype=np.float64)
    truth = np.zeros(size)
    truth[e_ids] = exact[count_col].to_numpy(dtype=np.float64)
    z = released[t_ids] - truth[t_ids]
    # a target whose cell was not released: nothing to read, the adversary flips a coin
    score = np.where(np.isnan(z), 0.5, 0.5 * ((z >= 0).astype(float) + (z <= 0).astype(float)))
    return float(score.mean()) if score.size else 0.0
