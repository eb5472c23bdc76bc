"""The one result type every attack returns, and its JSON form for audit.json.

An audit puts each attack of each release under ``attacks: {<name>: {...}}``; the
values must be plain JSON (no numpy scalars, no NaN/inf), so ``as_dict`` converts them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["AttackResult", "audit_attacks", "plain"]


def plain(value: Any) -> Any:
    """``value`` as plain JSON: numpy scalars/arrays to Python, non-finite floats to None."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return number if math.isfinite(number) else None
    return value


@dataclass(frozen=True)
class AttackResult:
    """One attack measured on one release.

    ``rates`` always has ``"rate"``, the headline success rate; ``targets`` is the number
    of targets (or trials) it was measured on; ``interval`` the Wilson 95% interval of
    the headline rate; ``bound`` the theoretical bound the guarantee implies (None when
    the release guarantees nothing for this attack) on ``rates[bound_rate]``.
    """

    name: str
    rates: Mapping[str, float]
    targets: int
    interval: tuple[float, float]
    bound: float | None = None
    bound_rate: str = "rate"
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """The headline success rate."""
        return float(self.rates["rate"])

    @property
    def within_bound(self) -> bool | None:
        """Whether the bounded rate respects the bound (None when there is no bound, or
        the bounded quantity was not measurable on this release)."""
        if self.bound is None or self.bound_rate not in self.rates:
            return None
        return float(self.rates[self.bound_rate]) <= self.bound + 1e-12

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the rates flat, then targets, interval, bound and details."""
        out: dict[str, Any] = {key: plain(value) for key, value in self.rates.items()}
        out["targets"] = int(self.targets)
        out["interval"] = [float(self.interval[0]), float(self.interval[1])]
        out["bound"] = plain(self.bound)
        out["bound_rate"] = self.bound_rate
        out["details"] = plain(self.details)
        return out


def audit_attacks(results: Iterable[AttackResult]) -> dict[str, dict[str, Any]]:
    """``{attack_name: result.as_dict()}`` for a release's ``attacks`` entry in audit.json."""
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        if result.name in out:
            raise ValueError(f"attack {result.name!r} measured twice on the same release")
        out[result.name] = result.as_dict()
    return out
