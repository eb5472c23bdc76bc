"""DP releases from a notebook: a budget session that refuses to overspend.

A :class:`BudgetSession` is an accountant with a lifetime (ε, δ): in memory, or backed by
the dataset's ledger (the same authenticated file ``privpipe run`` charges). Its
:meth:`BudgetSession.release` takes a DataFrame and one release written with the config's
own keys (``kind``, ``epsilon``, ``group_by``, ``levels``, ``domain`` as a plain dict,
``max_contributions_per_partition`` …), validated by the config's own model and planned by
the pipeline's own code, so a notebook release is the release a config would publish. The
charge is recorded before any noise is drawn; a release that does not fit is refused
(PrivacyRefusal) and draws nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd

from privpipe.dp.budget import ApproxBudget, to_fraction
from privpipe.dp.cells import canonical_labels
from privpipe.dp.ledger import Ledger
from privpipe.dp.ledger_auth import load_key
from privpipe.dp.release import dp_release
from privpipe.dp.spec import charge, plan_queries
from privpipe.errors import ConfigError, PrivacyRefusal
from privpipe.pipelines.config import DP_KINDS, NAME_PATTERN, validate_config
from privpipe.pipelines.dp_release import coarsen_for, dp_spec, sampler
from privpipe.pipelines.hierarchies import HierarchyLabeler
from privpipe.pipelines.output import new_run_id
from privpipe.pipelines.plan import Plan, with_static_hierarchies


class BudgetSession:
    """A lifetime (ε, δ) that DP releases spend from, refusing any release that does not
    fit. ``BudgetSession(epsilon, delta)`` keeps the account in memory (it ends with the
    session); :meth:`from_ledger` charges a dataset's ledger instead (lasting, shared with
    ``privpipe run``)."""

    def __init__(
        self,
        epsilon: float | str | Fraction,
        delta: float | str | Fraction = 0,
        *,
        dataset: str = "notebook",
    ) -> None:
        self.lifetime = ApproxBudget(to_fraction(epsilon, "epsilon"), to_fraction(delta, "delta"))
        if not self.lifetime.epsilon > 0 or not 0 <= self.lifetime.delta < 1:
            raise ConfigError(
                f"a lifetime needs epsilon > 0 and delta in [0, 1), got {self.lifetime}"
            )
        if not re.match(NAME_PATTERN, dataset):
            raise ConfigError(f"dataset: letters, digits, '.', '_' and '-' only, got {dataset!r}")
        self.dataset = dataset
        self.run_id = new_run_id()
        self._ledger: Ledger | None = None
        self._charges: list[tuple[str, ApproxBudget]] = []

    @classmethod
    def from_ledger(
        cls,
        path: str | Path,
        dataset: str,
        *,
        key_file: str | Path | None = None,
        key_env: str | None = None,
        heads_file: str | Path | None = None,
    ) -> BudgetSession:
        """A session charging the existing ledger of ``dataset`` (``privpipe budget init``);
        the key as for ``privpipe run`` (a key file, or the env variable)."""
        ledger = Ledger.open(path, dataset, load_key(dataset, key_file, key_env, heads_file))
        session = cls(ledger.lifetime.epsilon, ledger.lifetime.delta, dataset=dataset)
        session._ledger = ledger
        return session

    @property
    def spent(self) -> ApproxBudget:
        """Everything spent from the lifetime (for a ledger: by every run, not only this
        session)."""
        if self._ledger is not None:
            s = self._ledger.spent()
            return ApproxBudget(s.epsilon, s.delta)
        eps = sum((b.epsilon for _, b in self._charges), Fraction(0))
        return ApproxBudget(eps, sum((b.delta for _, b in self._charges), Fraction(0)))

    @property
    def remaining(self) -> ApproxBudget:
        s = self.spent
        return ApproxBudget(self.lifetime.epsilon - s.epsilon, self.lifetime.delta - s.delta)

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()

    def __enter__(self) -> BudgetSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def release(
        self,
        df: pd.DataFrame,
        *,
        unit: str | None = None,
        max_units: int | None = None,
        hierarchies: Mapping[str, Mapping[str, Any]] | None = None,
        insecure_seed: int | None = None,
        **release: Any,
    ) -> tuple[pd.DataFrame, dict[str, Any]]:
        """One central DP release of ``df``: (the published table, its release.json).

        ``release`` holds the release's config keys (``name``, ``kind``, ``epsilon`` …;
        ``domain={"sex": ["F", "M"]}``); ``unit`` is the privacy unit column
        (schema.privacy_unit), ``max_units`` schema.max_units (needed when δ > 0), and
        ``hierarchies`` the config's hierarchies for ``levels``. The charge is recorded
        before noise; ``insecure_seed`` makes the noise reproducible and NOT private
        (tests only)."""
        plan, r = self._plan(release, unit, max_units, hierarchies)
        spec = dp_spec(plan, r)
        eps, dlt = charge(spec, plan_queries(spec))
        self._charge(spec.name, ApproxBudget(eps, dlt))
        labeler = (
            HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)
            if plan.config.hierarchies
            else canonical_labels
        )
        coarsen = coarsen_for(plan, labeler) if spec.consistent else None  # type: ignore[arg-type]
        return dp_release(
            df,
            spec,
            sampler(insecure_seed),
            labeler=labeler,
            coarsen=coarsen,
            insecure_seed=insecure_seed,
        )

    def _plan(
        self,
        release: Mapping[str, Any],
        unit: str | None,
        max_units: int | None,
        hierarchies: Mapping[str, Mapping[str, Any]] | None,
    ) -> tuple[Plan, Any]:
        if "max_contributions" in release:  # the pure core's name, not the config's
            raise ConfigError(
                "release: max_contributions: the config's key is "
                "max_contributions_per_partition (rows per person and cell)"
            )
        kind = release.get("kind")
        if kind not in DP_KINDS:
            raise ConfigError(
                f"release: kind must be one of {', '.join(DP_KINDS)} (a central DP release), "
                f"got {kind!r}"
            )
        data = {
            "name": self.dataset,
            "input": {"path": "notebook.csv"},
            "schema": {"privacy_unit": unit, "max_units": max_units},
            "hierarchies": dict(hierarchies or {}),
            "releases": [dict(release)],
            "budget": {"ledger": "notebook.sqlite"},  # the session accounts, not this file
            "output": {"dir": "notebook-out"},
        }
        try:
            cfg = validate_config(data, "release")
        except ConfigError as e:  # name the argument, not a config file's key path
            raise ConfigError(str(e).replace("release: releases[0].", "release: ")) from None
        plan = Plan(
            config=cfg,
            config_path=Path("notebook"),
            config_sha256="",
            input_paths=(),
            input_format="csv",
            output_dir=Path("notebook-out"),
        )
        return with_static_hierarchies(plan), cfg.releases[0]

    def _charge(self, name: str, cost: ApproxBudget) -> None:
        if self._ledger is not None:
            self._ledger.charge_many(self.run_id, [(name, cost)])
            return
        left = self.remaining
        if cost.epsilon > left.epsilon or cost.delta > left.delta:
            raise PrivacyRefusal(
                f"{name}: costs epsilon {float(cost.epsilon):g}, delta {float(cost.delta):g} "
                f"but the session has epsilon {float(left.epsilon):g}, delta "
                f"{float(left.delta):g} left of its lifetime {self.lifetime}; nothing was drawn"
            )
        self._charges.append((name, cost))
