"""Privacy budgets as immutable, validated value objects with exact arithmetic.

Modelled on Tumult Analytics' budgets: every parameter is held as a
`fractions.Fraction`, so composing 0.1 and 0.2 gives exactly 3/10 and a lifetime
budget split into parts sums back to exactly the whole. Floats are read through
their shortest decimal repr (0.1 -> 1/10), which is what a user wrote in a config.

- `PureBudget(epsilon)`: epsilon-DP.
- `ApproxBudget(epsilon, delta)`: (epsilon, delta)-DP, 0 <= delta < 1.
- `RhoBudget(rho)`: rho-zCDP; `to_approx(delta)` converts (Bun & Steinke 2016).

`+` is basic sequential composition; `<=`/`<` mean "fits within" (a partial order,
component-wise); `split(weights)` divides a budget exactly in proportion to weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, TypeAlias

from privpipe.errors import ConfigError

Number: TypeAlias = int | float | str | Fraction


def to_fraction(value: Number, name: str) -> Fraction:
    """Read `value` as an exact Fraction; reject bool, NaN, infinities and junk (ConfigError)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Fraction):
        raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        return Fraction(repr(value))
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise ConfigError(
                f"{name} must be a finite number such as 0.5, 1e-6 or 1/3, got {value!r}"
            ) from None
    return Fraction(value)


def _non_negative(value: Number, name: str) -> Fraction:
    frac = to_fraction(value, name)
    if frac < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")
    return frac


def _delta(value: Number) -> Fraction:
    frac = _non_negative(value, "delta")
    if frac >= 1:
        raise ConfigError(f"delta must be < 1 (typically well below 1/n), got {value!r}")
    return frac


def _weights(weights: Sequence[Number]) -> list[Fraction]:
    if len(weights) == 0:
        raise ConfigError("split weights must not be empty")
    fracs = [_non_negative(w, f"split weight #{i}") for i, w in enumerate(weights)]
    if sum(fracs) == 0:
        raise ConfigError("split weights must not all be zero")
    total = sum(fracs, Fraction(0))
    return [w / total for w in fracs]


class _Frozen:
    """Immutability: attributes are set once in __init__ via object.__setattr__."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


class _EpsilonDelta(_Frozen):
    """Equality, hashing and the "fits within" partial order of (epsilon, delta) budgets:
    a pure budget is the (epsilon, 0) approximate one, so the two compare as equals."""

    def _key(self) -> tuple[Fraction, Fraction]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _EpsilonDelta):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __le__(self, other: object) -> bool:
        return _fits(self, other)

    def __lt__(self, other: object) -> bool:
        return _fits(self, other) and self != other

    def __ge__(self, other: object) -> bool:
        return _fits(other, self)

    def __gt__(self, other: object) -> bool:
        return _fits(other, self) and self != other


class PureBudget(_EpsilonDelta):
    """epsilon-DP budget (delta = 0)."""

    __slots__ = ("_epsilon",)
    _epsilon: Fraction

    def __init__(self, epsilon: Number) -> None:
        object.__setattr__(self, "_epsilon", _non_negative(epsilon, "epsilon"))

    @property
    def epsilon(self) -> Fraction:
        return self._epsilon

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def to_approx(self) -> ApproxBudget:
        """The same guarantee as an (epsilon, 0) budget."""
        return ApproxBudget(self._epsilon, 0)

    def __add__(self, other: object) -> Any:
        if isinstance(other, PureBudget):
            return PureBudget(self._epsilon + other._epsilon)
        if isinstance(other, ApproxBudget):
            return ApproxBudget(self._epsilon + other.epsilon, other.delta)
        return _mixed(self, other, "+")

    __radd__ = __add__

    def split(self, weights: Sequence[Number]) -> list[PureBudget]:
        """Parts proportional to `weights` that compose back to exactly this budget."""
        return [PureBudget(self._epsilon * w) for w in _weights(weights)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": "pure",
            "epsilon": float(self._epsilon),
            "exact": {"epsilon": str(self._epsilon)},
        }

    def _key(self) -> tuple[Fraction, Fraction]:
        return (self._epsilon, Fraction(0))

    def __repr__(self) -> str:
        return f"PureBudget(epsilon={self._epsilon})"


class ApproxBudget(_EpsilonDelta):
    """(epsilon, delta)-DP budget."""

    __slots__ = ("_delta", "_epsilon")
    _epsilon: Fraction
    _delta: Fraction

    def __init__(self, epsilon: Number, delta: Number) -> None:
        object.__setattr__(self, "_epsilon", _non_negative(epsilon, "epsilon"))
        object.__setattr__(self, "_delta", _delta(delta))

    @property
    def epsilon(self) -> Fraction:
        return self._epsilon

    @property
    def delta(self) -> Fraction:
        return self._delta

    def to_approx(self) -> ApproxBudget:
        return self

    def __add__(self, other: object) -> Any:
        if isinstance(other, PureBudget | ApproxBudget):
            return ApproxBudget(self._epsilon + other.epsilon, self._delta + other.delta)
        return _mixed(self, other, "+")

    __radd__ = __add__

    def split(self, weights: Sequence[Number]) -> list[ApproxBudget]:
        """Parts (epsilon and delta both) proportional to `weights`, summing exactly."""
        return [ApproxBudget(self._epsilon * w, self._delta * w) for w in _weights(weights)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": "approx",
            "epsilon": float(self._epsilon),
            "delta": float(self._delta),
            "exact": {"epsilon": str(self._epsilon), "delta": str(self._delta)},
        }

    def _key(self) -> tuple[Fraction, Fraction]:
        return (self._epsilon, self._delta)

    def __repr__(self) -> str:
        return f"ApproxBudget(epsilon={self._epsilon}, delta={self._delta})"


class RhoBudget(_Frozen):
    """rho-zCDP budget; composes by adding rho."""

    __slots__ = ("_rho",)
    _rho: Fraction

    def __init__(self, rho: Number) -> None:
        object.__setattr__(self, "_rho", _non_negative(rho, "rho"))

    @property
    def rho(self) -> Fraction:
        return self._rho

    def to_approx(self, delta: Number) -> ApproxBudget:
        """(rho + 2 sqrt(rho ln(1/delta)), delta)-DP, epsilon rounded up to stay valid."""
        d = _delta(delta)
        if d == 0:
            raise ConfigError("converting a rho-zCDP budget to (epsilon, delta) needs delta > 0")
        rho = float(self._rho)
        eps = rho + 2.0 * math.sqrt(rho * math.log(1.0 / float(d)))
        if not math.isfinite(eps):  # rho beyond float range: no finite epsilon to charge
            raise ConfigError(f"rho {float(self._rho):g} has no finite (epsilon, delta) bound")
        return ApproxBudget(Fraction(math.nextafter(eps, math.inf)) if eps > 0 else 0, d)

    def __add__(self, other: object) -> RhoBudget:
        if isinstance(other, RhoBudget):
            return RhoBudget(self._rho + other._rho)
        result: RhoBudget = _mixed(self, other, "+")
        return result

    __radd__ = __add__

    def split(self, weights: Sequence[Number]) -> list[RhoBudget]:
        return [RhoBudget(self._rho * w) for w in _weights(weights)]

    def as_dict(self) -> dict[str, Any]:
        return {"type": "rho", "rho": float(self._rho), "exact": {"rho": str(self._rho)}}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RhoBudget):
            return self._rho == other._rho
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("rho", self._rho))

    def __le__(self, other: object) -> bool:
        return self._rho <= _rho_of(other)

    def __lt__(self, other: object) -> bool:
        return self._rho < _rho_of(other)

    def __ge__(self, other: object) -> bool:
        return self._rho >= _rho_of(other)

    def __gt__(self, other: object) -> bool:
        return self._rho > _rho_of(other)

    def __repr__(self) -> str:
        return f"RhoBudget(rho={self._rho})"


Budget: TypeAlias = PureBudget | ApproxBudget | RhoBudget


def _mixed(left: object, right: object, op: str) -> Any:
    if isinstance(right, int) and not isinstance(right, bool) and right == 0 and op == "+":
        return left  # lets sum(budgets) start from 0
    if isinstance(left, Budget) and isinstance(right, Budget):
        raise ConfigError(
            f"cannot compose {type(left).__name__} with {type(right).__name__}: convert the "
            "RhoBudget with .to_approx(delta) first"
        )
    raise TypeError(
        f"unsupported operand for {op}: {type(left).__name__} and {type(right).__name__}"
    )


def _fits(small: object, big: object) -> bool:
    """True if `small` is at most `big` in both epsilon and delta."""
    if not isinstance(small, PureBudget | ApproxBudget) or not isinstance(
        big, PureBudget | ApproxBudget
    ):
        raise TypeError(f"cannot compare {type(small).__name__} with {type(big).__name__}")
    return small.epsilon <= big.epsilon and small.delta <= big.delta


def _rho_of(other: object) -> Fraction:
    if not isinstance(other, RhoBudget):
        raise TypeError(f"cannot compare RhoBudget with {type(other).__name__}")
    return other.rho
