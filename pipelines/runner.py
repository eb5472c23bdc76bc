"""Which Beam runner object a privpipe pipeline is built with."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from privpipe.errors import ConfigError
from privpipe.transforms.coders import use_batch_coder

LOCAL_NAMES = ("directrunner", "direct")
SAMPLING_PERIOD_MS: Final = 20
"""How often Beam's state sampler samples a bundle run in this process (Beam: 200 ms)."""
DASK_NAMES = ("dask", "daskrunner", "apache_beam.runners.dask.dask_runner.daskrunner")


def runner_for(options: PipelineOptions) -> Any:
    """The runner for ``beam.Pipeline(runner=...)``: Beam's FnApiRunner for DirectRunner,
    privpipe's Dask runner for ``dask`` (:mod:`pipelines.dask_runner`), else None (Beam
    resolves the runner named in the options) once the name is known to be a runner.

    Beam 2.77's DirectRunner first tries the Prism runner, a binary it downloads; without
    network (CI, an air-gapped operator) the download fails, leaving an empty
    ``/tmp/beam-temp*`` folder behind on every run, and it falls back to the FnApiRunner,
    which runs batch pipelines like privpipe's. Choosing that runner directly does the same
    work with no download attempt and nothing left behind; its options
    (``--direct_num_workers``, ``--direct_running_mode``) apply as before.

    Beam's own DaskRunner does not run privpipe's graph correctly (see pipelines/dask_runner);
    every name of it (``dask``, ``DaskRunner``, its class path) gets privpipe's.

    Untyped PCollections get ``transforms.coders.BatchCoder`` (Beam's default coder without
    encoding a batch to estimate its size) on every runner."""
    use_batch_coder()
    name = str(options.view_as(StandardOptions).runner or "DirectRunner")
    if name.lower() in LOCAL_NAMES:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        shorter_state_sampling()
        return FnApiRunner()
    if name.lower() in DASK_NAMES:
        try:
            from privpipe.pipelines.dask_runner import DaskRunner
        except ImportError as e:
            raise ConfigError(
                f"--runner {name}: Dask is not installed ({e}); install privpipe[dask] "
                "(dask[distributed]) on the driver and on every worker"
            ) from None
        return DaskRunner()
    check_runner(name)
    return None


def shorter_state_sampling() -> None:
    """Beam's state sampler of a bundle (a thread that charges the time elapsed to the
    step running) sleeps up to 200 ms between samples, and the bundle's end waits for
    the sleep to end: 0.27–0.36 s of a 1M-row k-anonymity run's main thread spent waiting
    at its 18 bundle ends (0.08 s at 20 ms; RESULTS.md, thirty-eighth round). Bundles run
    in this process sample every ``SAMPLING_PERIOD_MS`` instead. The samples only feed
    Beam's msec counters, which privpipe does not read; a Beam whose sampler has another
    default is left as it is."""
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    if init.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        init.__defaults__ = (SAMPLING_PERIOD_MS,)


@contextmanager
def new_pipeline(options: PipelineOptions) -> Iterator[beam.Pipeline]:
    """A pipeline on ``runner_for(options)`` whose local temporary folder is gone when the
    block ends. Beam makes that folder (``/tmp/beam-pipeline-temp*``) when the pipeline is
    built and removes it only when it runs: a run refused while its graph is built or before
    it runs (a bad level, a ledger's refusal) left an empty folder in /tmp every time."""
    p = beam.Pipeline(runner=runner_for(options), options=options)
    try:
        yield p
    finally:
        shutil.rmtree(p.local_tempdir, ignore_errors=True)


def plans_ahead(options: PipelineOptions) -> bool:
    """Whether the runner runs the pipeline's stages one at a time in this process (Beam's
    FnApiRunner, privpipe's DirectRunner, threads or not): then the longest searches are
    planned ahead, in worker processes, while the other releases' steps run
    (``transforms.planning``). Other runners run independent stages side by side anyway,
    and a worker process of the search step cannot be reached from another process."""
    name = str(options.view_as(StandardOptions).runner or "DirectRunner")
    mode = options.view_as(DirectOptions).direct_running_mode
    return name.lower() in LOCAL_NAMES and mode != "multi_processing"


def check_runner(name: str | None, flag: str = "--runner") -> None:
    """ConfigError (exit 2) naming the known runners when ``name`` is none of them (nor
    the dotted path of a runner class): before any ledger is touched or data read."""
    import difflib
    import importlib

    from apache_beam.runners.runner import _RUNNER_MAP

    if not name:
        return
    low = name.lower()
    if low in DASK_NAMES:  # privpipe's own translation (pipelines/dask_runner.py)
        return
    if low in _RUNNER_MAP or low + "runner" in _RUNNER_MAP:
        return
    if "." in name:
        module, cls = name.rsplit(".", 1)
        try:
            if hasattr(importlib.import_module(module), cls):
                return
        except ImportError:
            pass
    known = list(StandardOptions.KNOWN_RUNNER_NAMES)
    choices = {k.lower(): k for k in ["dask", *known]}
    near = [choices[m] for m in difflib.get_close_matches(low, list(choices), n=1, cutoff=0.8)]
    hint = f"did you mean {near[0]}? " if near else ""
    raise ConfigError(
        f"{flag} {name}: no such Beam runner; {hint}known runners: dask (pip install "
        f"privpipe[dask]), {', '.join(known)} (or the dotted path of a PipelineRunner class)"
    )
