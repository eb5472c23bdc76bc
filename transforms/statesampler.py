"""Beam's state sampler with a 10 ms period: a bundle's end no longer waits out a sleep.

Every bundle Beam's SDK harness runs starts a state sampler: a thread that wakes, adds
the time since its last wake to the step running, and sleeps again, its sleep growing
from 2 ms by 1.2x per wake up to the period (200 ms by default). The bundle's end stops
it and joins the thread, which finishes the sleep it is in first: a bundle of a second
or more waits up to 200 ms for nothing. At 1M demo rows a single-release run's 18
bundles waited 0.44-0.53 s in all this way (of a 7.5-8.5 s run); with a 10 ms period,
0.05-0.06 s. The thread wakes without the GIL and does a few additions under its own
lock, so 100 wakes a second cost nothing measurable; the times it samples (Beam's
per-step msecs, which privpipe does not read) only get finer.

The period is the default of ``StateSampler.__init__``'s ``sampling_period_ms``, which
the bundle processor leaves as it is; installing sets that default in this process.
A worker process installs it when it first imports privpipe's transforms, so its first
bundle may still wait. Beam is pinned (pyproject.toml); with a signature other than the
one read here, nothing is changed.
"""

from __future__ import annotations

import inspect
from typing import Final

from apache_beam.runners.worker import statesampler

PERIOD_MS: Final = 10
"""The sampling period set: short enough that a bundle's end waits at most this long."""

_BEAM_PERIOD_MS: Final = 200


def _period_default() -> int | None:
    """The current default of ``sampling_period_ms``, or None if the signature differs."""
    parameter = inspect.signature(statesampler.StateSampler.__init__).parameters.get(
        "sampling_period_ms"
    )
    if parameter is None or not isinstance(parameter.default, int):
        return None
    return parameter.default


def installed() -> bool:
    """Whether Beam's state samplers are created with ``PERIOD_MS``."""
    return _period_default() == PERIOD_MS


def install() -> None:
    """Make ``PERIOD_MS`` the state samplers' default period (once per process; only over
    Beam's own default, so a period set by someone else is left alone)."""
    if _period_default() != _BEAM_PERIOD_MS:
        return
    init = statesampler.StateSampler.__init__
    defaults = init.__defaults__ or ()
    names = inspect.signature(init).parameters
    at = list(names).index("sampling_period_ms") - (len(names) - len(defaults))
    init.__defaults__ = (*defaults[:at], PERIOD_MS, *defaults[at + 1 :])
