"""The privacy accountant: the total guarantee of a list of mechanisms, several ways.

Mechanisms run in sequence compose; a `Parallel` group runs on disjoint sets of
privacy units, so it costs its worst member (parallel composition: max, not sum).
`Accountant.report()` bounds the whole by every method that is valid for it and
chooses the smallest epsilon whose delta fits the target:

- ``pure``: sum of epsilons (only when every mechanism is pure, delta = 0).
- ``basic``: sum of (epsilon_i, delta_i); each zCDP mechanism gets delta/k.
- ``advanced``: Dwork–Rothblum–Vadhan 2010 with the worst mechanism's (epsilon, delta).
- ``pld``: privacy loss distributions (dp_accounting), pessimistic discretisation.
  Pure mechanisms enter as the (epsilon, 0) dominating pair (valid for any epsilon-DP
  mechanism, vector-valued too); a discrete Gaussian enters exactly only when it is
  scalar (`dimensions=1`) with integer sensitivity, otherwise PLD is not applicable.
- ``rdp``: Rényi DP (dp_accounting's RdpAccountant) with every mechanism as zCDP:
  epsilon-DP implies epsilon^2/2-zCDP; a discrete Gaussian is L2^2/(2 sigma^2)-zCDP.

Group privacy (a unit is a group of g people) maps (epsilon, delta) to
(g epsilon, delta (e^{g epsilon} - 1)/(e^epsilon - 1)) and is applied to every result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeAlias

from privpipe.dp.budget import Number, to_fraction
from privpipe.errors import ConfigError

# Mass the PLD library truncates from a discrete Gaussian (<= 1e-30 per side): added to delta.
_TRUNCATION_SLACK = 2e-30
_PLD_MAX_SIGMA = 1e5  # the discrete Gaussian PLD enumerates its support: keep it small


def _positive(value: Number, name: str) -> Fraction:
    frac = to_fraction(value, name)
    if frac <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return frac


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace noise of `scale` b on a query of L1 `sensitivity`: epsilon = L1/b."""

    scale: Fraction
    sensitivity: Fraction
    name: str = "discrete_laplace"

    @classmethod
    def of(
        cls, scale: Number, sensitivity: Number, name: str = "discrete_laplace"
    ) -> DiscreteLaplace:
        """Validated constructor taking any number type."""
        return cls(_positive(scale, "scale"), _positive(sensitivity, "sensitivity"), name)

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def rho(self) -> float:
        """epsilon-DP implies epsilon^2/2-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        e = float(self.epsilon)
        return e * e / 2.0  # a product, not **: overflows to inf instead of raising


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian noise with parameter `sigma` on a query of L2 `sensitivity`.

    rho = L2^2 / (2 sigma^2) (Canonne, Kamath, Steinke 2020). `dimensions=1` marks a
    scalar query, which lets the PLD accountant use the exact discrete-Gaussian PLD.
    """

    sigma: Fraction
    sensitivity: Fraction
    dimensions: int | None = None
    name: str = "discrete_gaussian"

    @classmethod
    def of(
        cls,
        sigma: Number,
        sensitivity: Number,
        dimensions: int | None = None,
        name: str = "discrete_gaussian",
    ) -> DiscreteGaussian:
        """Validated constructor taking any number type."""
        if dimensions is not None and dimensions < 1:
            raise ConfigError(f"dimensions must be >= 1, got {dimensions}")
        return cls(
            _positive(sigma, "sigma"), _positive(sensitivity, "sensitivity"), dimensions, name
        )

    @property
    def rho(self) -> float:
        return float(self.sensitivity**2 / (2 * self.sigma**2))

    def epsilon_for(self, delta: float) -> float:
        """(epsilon, delta) from zCDP: rho + 2 sqrt(rho ln(1/delta))."""
        return self.rho + 2.0 * math.sqrt(self.rho * math.log(1.0 / delta))


@dataclass(frozen=True)
class ApproxDP:
    """A mechanism known only by its (epsilon, delta) guarantee.

    Used for steps that are not additive noise: private partition selection ((epsilon,
    delta)) and the exponential mechanism (pure, delta = 0).
    """

    epsilon: Fraction
    delta: Fraction
    name: str = "approx_dp"

    @classmethod
    def of(cls, epsilon: Number, delta: Number = 0, name: str = "approx_dp") -> ApproxDP:
        """Validated constructor: epsilon > 0, 0 <= delta < 1."""
        d = to_fraction(delta, "delta")
        if not 0 <= d < 1:
            raise ConfigError(f"delta must be in [0, 1), got {delta!r}")
        return cls(_positive(epsilon, "epsilon"), d, name)

    @property
    def pure(self) -> bool:
        return self.delta == 0

    @property
    def rho(self) -> float:
        """Pure epsilon-DP implies epsilon^2/2-zCDP; approximate DP has no zCDP bound."""
        e = float(self.epsilon)
        return e * e / 2.0 if self.pure else math.inf


Mechanism: TypeAlias = DiscreteLaplace | DiscreteGaussian | ApproxDP


@dataclass(frozen=True)
class Parallel:
    """Mechanisms run on disjoint sets of privacy units: costs the worst member."""

    mechanisms: tuple[Mechanism, ...]
    name: str = "parallel"

    def __post_init__(self) -> None:
        if not self.mechanisms:
            raise ConfigError(f"parallel group {self.name!r} has no mechanisms")


Step: TypeAlias = Mechanism | Parallel


@dataclass(frozen=True)
class Guarantee:
    """One method's bound: (epsilon, delta), or why it does not apply."""

    method: str
    epsilon: float | None
    delta: float | None
    note: str = ""

    @property
    def applicable(self) -> bool:
        return self.epsilon is not None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": self.epsilon, "delta": self.delta}
        if self.note:
            out["note"] = self.note
        return out


_EXP_MAX = 700.0  # e^700 is finite in float64; beyond, work with logarithms


def log_expm1(x: float) -> float:
    """ln(e^x − 1) for x > 0 without overflow (x itself for large x) or underflow."""
    if x > _EXP_MAX:
        return x + math.log1p(-math.exp(-x))
    return math.log(math.expm1(x))


def expm1_ratio(a: float, b: float) -> float:
    """(e^a − 1)/(e^b − 1) for a ≥ b > 0, in log space when needed; math.inf if unbounded."""
    if a <= _EXP_MAX:
        return math.expm1(a) / math.expm1(b)
    diff = log_expm1(a) - log_expm1(b)
    return math.exp(diff) if diff <= _EXP_MAX else math.inf


def group_privacy(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(epsilon, delta)-DP for one unit gives (g eps, delta (e^{g eps}-1)/(e^eps-1)) for g.

    Computed in log space, so any finite epsilon works; a delta that reaches 1 is reported
    as 1.0 (the bound is then vacuous, never an overflow)."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if group_size == 1:
        return epsilon, delta
    if delta == 0:
        return group_size * epsilon, 0.0
    factor = float(group_size) if epsilon == 0 else expm1_ratio(group_size * epsilon, epsilon)
    return group_size * epsilon, min(1.0, delta * factor)


def advanced_composition(
    epsilon: float, delta: float, k: int, delta_prime: float
) -> tuple[float, float]:
    """DRV 2010: k mechanisms each (eps, delta) are (eps', k delta + d')-DP.

    eps' = sqrt(2k ln(1/d')) eps + k eps (e^eps - 1).
    """
    if k < 1 or not 0 < delta_prime < 1:
        raise ConfigError(
            f"advanced composition needs k >= 1 and 0 < delta' < 1 (k={k}, {delta_prime=})"
        )
    growth = math.expm1(epsilon) if epsilon <= _EXP_MAX else math.inf
    eps = math.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon + k * epsilon * growth
    return eps, k * delta + delta_prime


def _finite(g: Guarantee) -> Guarantee:
    """The guarantee, or "not applicable" when its epsilon is unbounded (inf or nan)."""
    if g.epsilon is not None and not math.isfinite(g.epsilon):
        return Guarantee(g.method, None, None, "unbounded at this epsilon")
    return g


def _worst(step: Step) -> list[Mechanism]:
    return list(step.mechanisms) if isinstance(step, Parallel) else [step]


def _is_pure(m: Mechanism) -> bool:
    return isinstance(m, DiscreteLaplace) or (isinstance(m, ApproxDP) and m.pure)


def _step_delta(step: Step) -> Fraction:
    """delta an (epsilon, delta) step spends by itself (a parallel group: its largest)."""
    return max((m.delta for m in _worst(step) if isinstance(m, ApproxDP)), default=Fraction(0))


class Accountant:
    """Bounds the composition of `steps` at total `delta` for groups of `group_size`."""

    def __init__(self, steps: Sequence[Step], delta: Number = 0, group_size: int = 1) -> None:
        if not steps:
            raise ConfigError("the accountant needs at least one mechanism")
        self.steps = tuple(steps)
        d = to_fraction(delta, "delta")
        if not 0 <= d < 1:
            raise ConfigError(f"delta must be in [0, 1), got {delta!r}")
        self.delta = float(d)
        if group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.all_pure = all(_is_pure(m) for s in self.steps for m in _worst(s))
        # delta that (epsilon, delta) steps use up whatever the method (a parallel group: max)
        self.fixed_delta = float(sum((_step_delta(s) for s in self.steps), Fraction(0)))
        self.has_approx = any(_step_delta(s) > 0 for s in self.steps)

    # Per-step helpers: a parallel group is its worst member.
    def _step_epsilon(self, step: Step) -> Fraction | None:
        """The step's epsilon when every member is pure or (epsilon, delta); else None."""
        mechs = _worst(step)
        if any(isinstance(m, DiscreteGaussian) for m in mechs):
            return None
        return max(m.epsilon for m in mechs if not isinstance(m, DiscreteGaussian))

    def _step_rho(self, step: Step) -> float:
        return max(m.rho for m in _worst(step))

    def _step_approx(self, step: Step, delta: float) -> float:
        """Epsilon of one step at per-step `delta` (pure steps ignore delta)."""
        eps = self._step_epsilon(step)
        if eps is not None:
            return float(eps)
        rho = self._step_rho(step)
        return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))

    def pure(self) -> Guarantee:
        if not self.all_pure:
            return Guarantee("pure", None, None, "not all mechanisms are pure epsilon-DP")
        total = sum((self._step_epsilon(s) or Fraction(0) for s in self.steps), Fraction(0))
        return Guarantee("pure", float(total), 0.0)

    def basic(self) -> Guarantee:
        if self.all_pure:
            return Guarantee("basic", self.pure().epsilon, 0.0)
        k = sum(1 for s in self.steps if self._step_epsilon(s) is None)
        if k == 0:  # pure and (epsilon, delta) steps only: both add up
            total = sum((self._step_epsilon(s) or Fraction(0) for s in self.steps), Fraction(0))
            return Guarantee("basic", float(total), self.fixed_delta)
        free = self.delta - self.fixed_delta
        if free <= 0:
            return Guarantee(
                "basic", None, None, "zCDP mechanisms need delta beyond the (epsilon, delta) steps"
            )
        per = free / k
        return Guarantee("basic", sum(self._step_approx(s, per) for s in self.steps), self.delta)

    def advanced(self) -> Guarantee:
        free = self.delta - self.fixed_delta
        if free <= 0:
            return Guarantee(
                "advanced", None, None, "advanced composition needs delta beyond the steps' own"
            )
        k = len(self.steps)
        if self.has_approx:
            if any(self._step_epsilon(s) is None for s in self.steps):
                return Guarantee(
                    "advanced", None, None, "not applied to zCDP mixed with (epsilon, delta) steps"
                )
            # DRV holds with heterogeneous delta_i: (eps', sum of delta_i + delta').
            eps_max = max(float(self._step_epsilon(s) or 0) for s in self.steps)
            eps, _ = advanced_composition(eps_max, 0.0, k, free)
            return _finite(Guarantee("advanced", eps, self.delta))
        if self.all_pure:
            eps_max = max(float(self._step_epsilon(s) or 0) for s in self.steps)
            eps, dlt = advanced_composition(eps_max, 0.0, k, self.delta)
        else:
            # Half of delta for delta', half shared by the k mechanisms.
            per = self.delta / 2 / k
            eps_max = max(self._step_approx(s, per) for s in self.steps)
            eps, dlt = advanced_composition(eps_max, per, k, self.delta / 2)
        return _finite(Guarantee("advanced", eps, min(dlt, self.delta)))

    def _too_large(self) -> bool:
        """A step beyond e^700 (epsilon or rho): the libraries' numerics do not apply."""
        return any(
            float(self._step_epsilon(s) or 0) > _EXP_MAX
            or any(isinstance(m, DiscreteGaussian) and m.rho > _EXP_MAX for m in _worst(s))
            for s in self.steps
        )

    def pld(self) -> Guarantee:
        """The PLD accountant's guarantee; where dp_accounting fails on extreme parameters
        (a huge epsilon empties its truncated pmf), PLD is not applicable: the chosen
        guarantee then comes from the other methods, never from a guess."""
        try:
            return self._pld()
        except (ValueError, IndexError, FloatingPointError, OverflowError) as e:
            return Guarantee(
                "pld", None, None, f"the PLD accountant fails at these parameters ({e})"
            )

    def _pld(self) -> Guarantee:
        if self._too_large():
            return Guarantee("pld", None, None, "epsilon too large for PLD discretisation")
        if self.delta == 0:
            return Guarantee("pld", None, None, "needs delta > 0 (at delta = 0 it is the pure sum)")
        gaussian = any(isinstance(m, DiscreteGaussian) for s in self.steps for m in _worst(s))
        if not gaussian and self.delta - self.fixed_delta <= 0:
            # every delta is the steps' own: no slack to trade for epsilon, so the sum of
            # the epsilons (basic composition) is already optimal; skip the scipy import
            return Guarantee(
                "pld", None, None, "no delta beyond the steps' own: basic composition is optimal"
            )
        # imported here: dp_accounting pulls in scipy (~1.5 s), needed only when delta > 0
        from dp_accounting.pld import common as pld_common
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        composed: Any = None
        slack = 0.0
        # Identical steps are self-composed at once (FFT powers): much faster than one by one.
        counts: dict[Step, int] = {}
        for step in self.steps:
            counts[step] = counts.get(step, 0) + 1
        for step, count in counts.items():
            eps = self._step_epsilon(step)
            if eps is not None:
                params = pld_common.DifferentialPrivacyParameters(
                    float(eps), float(_step_delta(step))
                )
                pld = pld_lib.from_privacy_parameters(params)
            else:
                mechs = _worst(step)
                m = mechs[0]
                if (
                    len(mechs) != 1
                    or not isinstance(m, DiscreteGaussian)
                    or m.dimensions != 1
                    or m.sensitivity.denominator != 1
                ):
                    return Guarantee(
                        "pld",
                        None,
                        None,
                        "PLD covers discrete Gaussians only as single scalar queries "
                        "(dimensions=1) with integer sensitivity",
                    )
                if m.sigma > _PLD_MAX_SIGMA:  # its pmf would span ~10^5·σ integers
                    return Guarantee(
                        "pld", None, None, f"discrete Gaussian sigma above {_PLD_MAX_SIGMA:g}"
                    )
                if 2 * math.ceil(11.6 * float(m.sigma)) < int(m.sensitivity):
                    # dp_accounting truncates the noise at ceil(11.6·σ) and cannot model a
                    # sensitivity beyond twice that (a huge epsilon): the other methods can
                    return Guarantee(
                        "pld", None, None, "discrete Gaussian sigma below sensitivity / 23.2"
                    )
                pld = pld_lib.from_discrete_gaussian_mechanism(
                    float(m.sigma), sensitivity=int(m.sensitivity)
                )
                slack += _TRUNCATION_SLACK * count
            if count > 1:
                pld = pld.self_compose(count)
            composed = pld if composed is None else composed.compose(pld)
        target = self.delta - slack
        if target < 0:
            return Guarantee("pld", None, None, "delta too small for the truncation slack")
        eps_pld = float(composed.get_epsilon_for_delta(target))
        if not math.isfinite(eps_pld):
            return Guarantee("pld", None, None, "PLD epsilon is unbounded at this delta")
        return Guarantee("pld", eps_pld, self.delta)

    def rdp(self) -> Guarantee:
        if self._too_large():
            return Guarantee("rdp", None, None, "epsilon too large for the RDP accountant")
        if self.delta == 0:
            return Guarantee("rdp", None, None, "RDP conversion needs delta > 0")
        if self.has_approx:
            return Guarantee("rdp", None, None, "(epsilon, delta) steps have no Renyi bound")
        import dp_accounting

        accountant = dp_accounting.rdp.RdpAccountant()
        events = [dp_accounting.ZCDpEvent(self._step_rho(s)) for s in self.steps]
        accountant.compose(dp_accounting.ComposedDpEvent(events))
        return Guarantee("rdp", float(accountant.get_epsilon(self.delta)), self.delta)

    def guarantees(self) -> list[Guarantee]:
        """Every method's guarantee for one unit (before group privacy)."""
        return [self.pure(), self.basic(), self.advanced(), self.pld(), self.rdp()]

    def chosen(self) -> Guarantee:
        """The tightest applicable guarantee whose delta fits the target."""
        valid = [
            g
            for g in self.guarantees()
            if g.epsilon is not None and g.delta is not None and g.delta <= self.delta
        ]
        if not valid:
            raise ConfigError("no accounting method applies: zCDP mechanisms need delta > 0")
        return min(valid, key=lambda g: (g.epsilon, g.delta))

    def report(self) -> dict[str, Any]:
        """Each method's (epsilon, delta) after group privacy, and the chosen one."""
        methods: dict[str, Any] = {}
        for g in self.guarantees():
            if g.epsilon is not None and g.delta is not None:
                eps, dlt = group_privacy(g.epsilon, g.delta, self.group_size)
                g = Guarantee(g.method, eps, dlt, g.note)
            methods[g.method] = g.as_dict()
        best = self.chosen()
        return {
            "delta_target": self.delta,
            "group_size": self.group_size,
            "mechanisms": len(self.steps),
            "methods": methods,
            "chosen": {"method": best.method, **methods[best.method]},
        }
