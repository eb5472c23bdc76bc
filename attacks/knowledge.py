"""What the attacker knows: ``AttackerKnowledge``.

The attacker of the literature (Machanavajjhala et al. 2006; Li et al. 2007) knows a
target's quasi-identifier values and that the target's record is in the table. Here that
is: which targets (every record of the raw table, or a seeded sample), which QIs the
attacker knows (default all), how many sensitive values it can rule out for a target
(background knowledge ``b``, chosen at random among true negatives, or the defender's
worst case), and the confidence ``tau`` above which a guess counts as a disclosure.

``tau`` defaults to 0.5: a disclosure is a guess the attacker believes more likely right
than wrong (its posterior beats all other values together). Bounds stay comparable:
recursive (c, l)-diversity keeps every posterior below c/(c+1) >= 0.5 for c >= 1.

Target sampling uses ``np.random.default_rng(seed)``: this is the attacker's sample, not
released noise, so a seeded generator is right here (never numpy's global state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

__all__ = ["AttackerKnowledge", "BackgroundMode"]

BackgroundMode: TypeAlias = Literal["random", "worst"]


@dataclass(frozen=True)
class AttackerKnowledge:
    """The attacker model shared by all attacks on one release.

    ``targets``: ``"all"`` or a number N of records sampled without replacement with
    ``seed``. ``known``: the QIs the attacker knows (None = all QIs). ``background``: b,
    SA values ruled out per target. ``background_mode``: ``"worst"`` (the attacker rules
    out the b most frequent wrong values among the target's candidates, the defender's
    worst case) or ``"random"`` (b true negatives drawn from the SA domain with ``seed``).
    ``tau``: posterior at or above which a guess is a disclosure.
    """

    targets: Literal["all"] | int = "all"
    known: tuple[str, ...] | None = None
    background: int = 0
    background_mode: BackgroundMode = "worst"
    tau: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.targets != "all" and (
            isinstance(self.targets, bool) or not isinstance(self.targets, int) or self.targets < 1
        ):
            raise ValueError(f"targets must be 'all' or an integer >= 1, got {self.targets!r}")
        if self.known is not None:
            if isinstance(self.known, str) or not all(isinstance(q, str) for q in self.known):
                raise ValueError(f"known must be a list of QI names, got {self.known!r}")
            object.__setattr__(self, "known", tuple(self.known))
        if isinstance(self.background, bool) or not isinstance(self.background, int):
            raise ValueError(f"background must be an integer >= 0, got {self.background!r}")
        if self.background < 0:
            raise ValueError(f"background must be an integer >= 0, got {self.background!r}")
        if self.background_mode not in ("random", "worst"):
            raise ValueError(
                f"background_mode must be 'random' or 'worst', got {self.background_mode!r}"
            )
        if not 0.0 < float(self.tau) <= 1.0:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau!r}")

    def rng(self, stream: int = 0) -> np.random.Generator:
        """A fresh seeded generator (``stream`` separates independent uses of the seed)."""
        return np.random.default_rng([self.seed, stream])

    def target_rows(self, n_records: int) -> npt.NDArray[np.int64]:
        """Positions of the targets among ``n_records`` raw records, ascending."""
        if self.targets == "all" or self.targets >= n_records:
            return np.arange(n_records, dtype=np.int64)
        chosen = self.rng(0).choice(n_records, size=int(self.targets), replace=False)
        return np.sort(chosen.astype(np.int64))

    def select_targets(self, raw: pd.DataFrame) -> pd.DataFrame:
        """The target records of the raw table (all, or the seeded sample)."""
        return raw.iloc[self.target_rows(len(raw))]

    def known_qis(self, qis: Sequence[str]) -> tuple[str, ...]:
        """The QIs the attacker knows, in the release's order (all by default)."""
        if self.known is None:
            return tuple(qis)
        stray = [q for q in self.known if q not in qis]
        if stray:
            raise ValueError(f"known lists {stray}, which are not quasi-identifiers {list(qis)}")
        return tuple(q for q in qis if q in self.known)
