"""Interval arithmetic for measured attack rates (pure core, standard library only).

Attack success is measured on a finite set of targets or trials, so every rate is
reported with a binomial confidence interval. Wilson's score interval is used because it
stays inside [0, 1] and behaves well at rates near 0 or 1, where the attacks on strong
releases live (a plain normal interval collapses to a point there).
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["wilson_interval"]


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``.

    ``successes`` may be fractional (an expected count, e.g. a sum of prosecutor risks);
    ``n = 0`` gives the uninformative ``(0.0, 1.0)``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes!r}, n={n!r}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    phat = successes / n
    z2n = z * z / n
    centre = (phat + z2n / 2.0) / (1.0 + z2n)
    half = z * math.sqrt(phat * (1.0 - phat) / n + z2n / (4.0 * n)) / (1.0 + z2n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
