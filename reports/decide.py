"""What to publish: the Pareto front of utility against the common attacker, and one choice.

Every release is placed by two numbers computed the same way for every method
(contract §2–§3, read from ``releases.<name>.summary``):

- ``error``: mean relative error on the ONE common workload (lower is more useful);
- ``attribute_advantage``: the common attacker's accuracy over the public prior,
  (accuracy − prior) / (1 − prior) (lower is safer); ``membership_advantage`` (TPR − FPR
  against control records) is a further criterion where both releases have it.

A release *dominates* another when it is no worse on every shared criterion and strictly
better on one. The front is the set of releases no other release dominates.

The rule (``RULE``): among the releases on the front whose advantage interval (the upper
end of the Wilson 95% interval of the accuracy, mapped to advantage) stays at or under
``max_advantage`` (config ``report.max_advantage``), publish the one with the lowest
common error; if none stays under it, publish the one with the lowest advantage on the
front and say so. The raw-data baseline is never a candidate. A release missing either
number is not compared and is listed with the reason.

Pure: the standard library only; reads only audit.json keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DEFAULT_MAX_ADVANTAGE",
    "RULE",
    "Point",
    "advantage_interval",
    "dominates",
    "pareto_front",
    "points",
    "recommend",
]

DEFAULT_MAX_ADVANTAGE: Final = 0.1
RULE: Final = (
    "Among the releases on the Pareto front (no other release has both a lower common "
    "error and a lower common attribute advantage, nor lower membership advantage where "
    "both were measured), publish the one with the lowest common error whose advantage "
    "interval (upper end) stays at or under report.max_advantage; if none does, publish "
    "the front's lowest-advantage release. The raw data is a baseline, never a candidate."
)


@dataclass(frozen=True)
class Point:
    """One release on the trade-off plane (None: not measured)."""

    name: str
    kind: str
    error: float | None
    advantage: float | None
    interval: tuple[float, float] | None  # of the advantage
    membership: float | None

    @property
    def upper(self) -> float | None:
        """The advantage's upper interval end (the point when there is no interval)."""
        if self.interval is not None:
            return self.interval[1]
        return self.advantage


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def advantage_interval(entry: Mapping[str, Any]) -> tuple[float, float] | None:
    """The Wilson 95% interval of the common accuracy mapped to advantage over the prior,
    (x − prior) / (1 − prior), with the prior taken as known (None when not measured)."""
    ai = ((entry.get("common") or {}).get("attribute_inference")) or {}
    interval = ai.get("interval")
    prior = _float(ai.get("prior_accuracy"))
    if not interval or len(interval) < 2 or prior is None or prior >= 1.0:
        return None
    lo, hi = _float(interval[0]), _float(interval[1])
    if lo is None or hi is None:
        return None
    return ((lo - prior) / (1.0 - prior), (hi - prior) / (1.0 - prior))


def point_of(name: str, entry: Mapping[str, Any]) -> Point:
    s = entry.get("summary") or {}
    return Point(
        name=name,
        kind=str(entry.get("kind") or ""),
        error=_float(s.get("error")),
        advantage=_float(s.get("attribute_advantage")),
        interval=advantage_interval(entry),
        membership=_float(s.get("membership_advantage")),
    )


def points(audit: Mapping[str, Any]) -> list[Point]:
    """Every release of the audit as a Point (the baseline excluded), in audit order."""
    return [point_of(str(n), e) for n, e in (audit.get("releases") or {}).items()]


def _criteria(a: Point, b: Point) -> list[tuple[float, float]]:
    assert a.error is not None and a.advantage is not None
    assert b.error is not None and b.advantage is not None
    pairs = [(a.error, b.error), (a.advantage, b.advantage)]
    if a.membership is not None and b.membership is not None:
        pairs.append((a.membership, b.membership))
    return pairs


def dominates(a: Point, b: Point) -> bool:
    """``a`` is no worse than ``b`` on every shared criterion and strictly better on one
    (both need an error and an attribute advantage)."""
    if None in (a.error, a.advantage, b.error, b.advantage):
        return False
    pairs = _criteria(a, b)
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def _measured(p: Point) -> bool:
    return p.error is not None and p.advantage is not None


def pareto_front(pts: Sequence[Point]) -> list[Point]:
    """The measured points no other point dominates (ties are all kept), by error."""
    measured = [p for p in pts if _measured(p)]
    front = [p for p in measured if not any(dominates(q, p) for q in measured if q is not p)]
    return sorted(front, key=lambda p: (p.error, p.advantage, p.name))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def _missing(p: Point) -> str:
    what = [
        label
        for label, v in (("common error", p.error), ("common attribute advantage", p.advantage))
        if v is None
    ]
    return "no " + " and no ".join(what)


def _describe(p: Point) -> str:
    text = f"common error {_pct(p.error)}, attribute advantage {_pct(p.advantage)}"
    if p.interval is not None:
        text += f" (95% interval {_pct(p.interval[0])} to {_pct(p.interval[1])})"
    if p.membership is not None:
        text += f", membership advantage {_pct(p.membership)}"
    return text


def _workload(audit: Mapping[str, Any]) -> str | None:
    for e in (audit.get("releases") or {}).values():
        common = (e.get("utility") or {}).get("common") or {}
        if common.get("workload"):
            return str(common["workload"])
    return None


def recommend(
    audit: Mapping[str, Any],
    max_advantage: float = DEFAULT_MAX_ADVANTAGE,
    published: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``audit["recommendation"]``: the front, who dominates whom, the choice and why, in
    plain sentences with the numbers (see the module docstring for the rule)."""
    pts = points(audit)
    if published is None:
        pub = (audit.get("publication") or {}).get("published")
        published = [str(x) for x in pub] if pub is not None else None
    measured = [p for p in pts if _measured(p)]
    front = pareto_front(pts)
    front_names = [p.name for p in front]
    dominated = {
        p.name: [q.name for q in measured if q is not p and dominates(q, p)]
        for p in measured
        if p.name not in front_names
    }
    not_compared = {p.name: _missing(p) for p in pts if not _measured(p)}
    safe = [p for p in front if p.upper is not None and p.upper <= max_advantage + 1e-12]
    choice: Point | None = None
    if safe:
        choice = min(safe, key=lambda p: (p.error, p.advantage, p.name))
        why = (
            f"{choice.name} has the lowest common error among the releases on the front "
            f"whose attribute advantage stays at or under {_pct(max_advantage)} "
            f"(report.max_advantage): {_describe(choice)}."
        )
    elif front:
        choice = min(front, key=lambda p: (p.upper, p.advantage, p.error, p.name))
        why = (
            f"No release on the front keeps its attribute advantage interval under "
            f"{_pct(max_advantage)} (report.max_advantage); {choice.name} leaks least: "
            f"{_describe(choice)}. Consider a stronger setting before publishing."
        )
    else:
        why = (
            "No release has both a common error and a common attribute advantage, so none "
            "can be recommended on the common measures."
        )
    sentences: list[str] = []
    workload = _workload(audit)
    if choice is not None:
        sentences.append(f"Publish {choice.name}" + (f" for {workload}." if workload else "."))
    sentences.append(why)
    if front:
        sentences.append(
            "Pareto front (no other release is both more useful and safer): "
            + "; ".join(f"{p.name} ({_describe(p)})" for p in front)
            + "."
        )
    for name, by in dominated.items():
        sentences.append(
            f"{name} is dominated by {', '.join(by)}: "
            f"{'it is' if len(by) == 1 else 'each is'} at least as useful and as safe, "
            "and better on one measure, so do not publish it."
        )
    by_reason: dict[str, list[str]] = {}
    for name, reason in not_compared.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        verb = "is" if len(names) == 1 else "are"
        sentences.append(f"{', '.join(names)} {verb} not compared ({reason}).")
    differs = False
    if published is not None and choice is not None:
        differs = list(published) != [choice.name]
        if choice.name not in published:
            sentences.append(
                f"This run published {', '.join(published) or 'nothing'}, not {choice.name}."
            )
        elif len(published) > 1:
            others = [n for n in published if n != choice.name]
            sentences.append(
                f"This run published {choice.name} together with {', '.join(others)}; the "
                "recommendation is about one release, the publication attacks about the set."
            )
    return {
        "rule": RULE,
        "max_advantage": float(max_advantage),
        "workload": workload,
        "criteria": {
            "error": "summary.error: mean relative error on the common workload (lower is "
            "more useful)",
            "attribute_advantage": "summary.attribute_advantage: the common attacker's "
            "accuracy over the public prior, (accuracy - prior) / (1 - prior)",
            "membership_advantage": "summary.membership_advantage: TPR - FPR against "
            "control records (used where both releases have it)",
        },
        "points": {
            p.name: {
                "kind": p.kind,
                "error": p.error,
                "attribute_advantage": p.advantage,
                "interval": None if p.interval is None else list(p.interval),
                "membership_advantage": p.membership,
            }
            for p in pts
        },
        "front": front_names,
        "dominated": dominated,
        "not_compared": not_compared,
        "choice": None if choice is None else choice.name,
        "within_threshold": bool(safe),
        "reason": why,
        "published": None if published is None else list(published),
        "differs_from_published": differs,
        "sentences": sentences,
    }
