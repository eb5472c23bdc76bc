"""privpipe's Dask runner: Beam's DaskRunner options and client, a translation that runs the
whole graph (``--runner dask``).

Beam 2.77's DaskRunner (``apache_beam.runners.dask``) translates a pipeline into Dask bags but
does not run privpipe's graph correctly; tests/test_dask.py keeps a minimal reproduction
of each of its bugs (each tells us when Beam fixes it):

1. only the branch of the last transform visited is computed: every other sink silently
   never runs (privpipe has many: profile, releases, audit truth, DP cells, rejected rows);
2. a multi-output ParDo hands *all* its outputs to the consumer of *each* output (tags are
   never split): privpipe's first failure, ``path, index, frame = tagged`` in
   transforms/io.py receiving a DataFrame batch instead of a tagged rejection;
3. what a DoFn emits in ``finish_bundle`` is dropped;
4. a side input is recomputed inside every task that reads it (its whole upstream again,
   side effects included: the anonymisation search once per recoded partition);
5. ``metrics()`` raises NotImplementedError (no stage timings) and the client it opens is
   never closed.

This module keeps Beam's ``DaskOptions`` (``--dask_client_address``,
``--dask_scheduler_file``, ``--dask_npartitions`` ...) and Beam's Create/Reshuffle/Flatten
overrides, and translates the graph itself, on global windows only (privpipe uses no other):

* every PCollection is one Dask bag of plain values; a ParDo runs each partition as one
  bundle (setup, start_bundle, process, finish_bundle, teardown), its outputs tagged inside
  the partition and split into one bag per output;
* a side input is one Dask task that gathers its bag, computed once on the cluster and
  handed to every task that reads it;
* GroupByKey is a task-based shuffle (keys hashed by ``dask.base.tokenize``: the same on
  every worker process);
* Create puts each element in its own partition (privpipe creates its input splits and
  Beam's Reshuffle is a no-op here), so the splits spread over the workers;
* every sink (a PCollection nobody consumes) is computed, and Beam counters are collected
  per bundle and summed (the manifest's stage timings).

Nothing runs in the driver but graph construction: the rows are read, summarised, recoded
and written by the workers, which must see the input and output paths (shared storage).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.metrics.execution import MetricKey, MetricResult, MetricsContainer
from apache_beam.metrics.metric import MetricResults
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import (
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    Receiver,
    _OutputHandler,
)
from apache_beam.runners.dask.dask_runner import DaskOptions
from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner
from apache_beam.runners.dask.overrides import _Create, _Flatten, _Read, _Reshuffle, dask_overrides
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.runners.worker import statesampler
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils import counters
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

_LOG = logging.getLogger(__name__)
_METRICS = "__privpipe_dask_metrics__"  # the tag of a bundle's counters among its outputs
_MAX_CREATE_PARTITIONS = 1024


class _GroupByKey(beam.PTransform):  # type: ignore[misc]
    """GroupByKey as one primitive: a Dask shuffle (Beam's override reifies windows and
    groups again per window: needless on the global window)."""

    def expand(self, pcoll: Any) -> Any:
        windowfn = pcoll.windowing.windowfn
        if not isinstance(windowfn, GlobalWindows):
            raise NotImplementedError(
                f"privpipe's Dask runner groups on the global window only, got {windowfn!r}"
            )
        return beam.pvalue.PCollection.from_(pcoll)


class _GroupByKeyOverride(PTransformOverride):  # type: ignore[misc]
    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        return applied_ptransform.transform.__class__ == beam.GroupByKey

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> beam.PTransform:
        return _GroupByKey()


def overrides() -> list[PTransformOverride]:
    """Beam's Dask overrides (Create, Reshuffle, Read, Flatten) with privpipe's GroupByKey
    first (Beam's GroupByKey override then no longer matches)."""
    return [_GroupByKeyOverride(), *dask_overrides()]


# ---------------------------------------------------------------------- worker-side tasks


class _Collect(Receiver):  # type: ignore[misc]
    """Appends ``(tag, value)`` of every output of one bundle."""

    def __init__(self, tag: str | None, into: list[tuple[str | None, Any]]) -> None:
        self.tag = tag
        self.into = into

    def receive(self, windowed_value: WindowedValue) -> None:
        self.into.append((self.tag, windowed_value.value))


class _Receivers(dict):  # type: ignore[type-arg]
    def __init__(self, into: list[tuple[str | None, Any]]) -> None:
        super().__init__()
        self.into = into

    def __missing__(self, tag: str | None) -> _Collect:
        receiver = self[tag] = _Collect(tag, self.into)
        return receiver


def _global(values: Iterable[Any]) -> Iterator[WindowedValue]:
    for v in values:
        yield WindowedValue(v, MIN_TIMESTAMP, (GlobalWindow(),))


def run_bundle(
    items: Iterable[Any], payload: bytes, *sides: list[Any]
) -> list[tuple[str | None, Any]]:
    """One partition of a ParDo as one bundle: its outputs as ``(tag, value)`` (tag None:
    the main output), finish_bundle's included, then the bundle's counters. ``payload``:
    the pickled (label, DoFn, args, kwargs, side input views); ``sides``: each side
    input's values."""
    label, fn, args, kwargs, views = pickler.loads(payload)
    out: list[tuple[str | None, Any]] = []
    receivers = _Receivers(out)
    handler = _OutputHandler(
        window_fn=GlobalWindows(),
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    side_inputs = [
        SideInputMap(view, options, list(_global(values)))
        for (view, options), values in zip(views, sides, strict=True)
    ]
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn),
        handler,
        context=DoFnContext(label, state=None),
        side_inputs=side_inputs,
        input_args=args,
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam(),
    )
    sampler = statesampler.StateSampler(label, counters.CounterFactory())
    previous = statesampler.get_current_tracker()
    statesampler.set_current_tracker(sampler)  # Metrics.counter(...) finds the container
    container = MetricsContainer(label)
    try:
        with sampler.scoped_state(label, "process", metrics_container=container):
            invoker.invoke_setup()
            invoker.invoke_start_bundle()
            for wv in _global(items):
                invoker.invoke_process(wv)
            invoker.invoke_finish_bundle()
            invoker.invoke_teardown()
    finally:
        statesampler.set_current_tracker(previous)
    found = container.get_cumulative().counters
    if found:
        out.append((_METRICS, [(k, int(v)) for k, v in found.items()]))
    return out


def select(part: Iterable[tuple[str | None, Any]], tag: str | None) -> list[Any]:
    """The values of one output (tag) of a ParDo partition."""
    return [v for t, v in part if t == tag]


def gather(part: Iterable[Any]) -> list[Any]:
    return list(part)


def concat(parts: Iterable[list[Any]]) -> list[Any]:
    return [v for p in parts for v in p]


def group_key(kv: tuple[Any, Any]) -> Any:
    return kv[0]


def group_values(group: tuple[Any, list[tuple[Any, Any]]]) -> tuple[Any, list[Any]]:
    return group[0], [v for _, v in group[1]]


def count(part: Iterable[Any]) -> int:
    return sum(1 for _ in part)


# ---------------------------------------------------------------------- driver side


class _Translate(PipelineVisitor):  # type: ignore[misc]
    """One Dask bag per PCollection, every leaf transform translated in topological order."""

    def __init__(self, bag_kwargs: dict[str, Any]) -> None:
        self.bag_kwargs = bag_kwargs
        self.bags: dict[int, Any] = {}  # id(PCollection) -> dask bag
        self.consumed: set[int] = set()  # id() of every PCollection read by a transform
        self.metrics: list[Any] = []  # the counters' bags of every ParDo
        self._sides: dict[int, Any] = {}  # id(PCollection) -> its gathered Item

    def visit_transform(self, node: AppliedPTransform) -> None:
        import dask.bag as db

        t = node.transform
        mains = [i for i in node.main_inputs.values() if not isinstance(i, beam.pvalue.PBegin)]
        inputs = [self.bags[id(i)] for i in mains]  # producers come first (topological)
        for pc in list(node.main_inputs.values()) + [s.pvalue for s in node.side_inputs]:
            self.consumed.add(id(pc))
        outputs = node.outputs
        if isinstance(t, _Create):
            self._one(outputs, self._create(list(t.values)))
        elif isinstance(t, beam.Impulse):
            self._one(outputs, db.from_sequence([b""], npartitions=1))
        elif isinstance(t, _Reshuffle):
            self._one(outputs, inputs[0])
        elif isinstance(t, _Flatten):
            self._one(outputs, db.concat(inputs) if inputs else self._create([]))
        elif isinstance(t, _GroupByKey):
            grouped = inputs[0].groupby(group_key, shuffle="tasks").map(group_values)
            self._one(outputs, grouped)
        elif isinstance(t, beam.ParDo):
            self._pardo(node, inputs[0])
        elif isinstance(t, _Read):
            raise NotImplementedError("privpipe's Dask runner does not translate beam.io.Read")
        else:
            raise NotImplementedError(
                f"privpipe's Dask runner cannot translate {type(t).__name__} ({node.full_label})"
            )

    def _one(self, outputs: dict[Any, Any], bag: Any) -> None:
        for pc in outputs.values():
            self.bags[id(pc)] = bag

    def _create(self, values: list[Any]) -> Any:
        import dask.bag as db

        kw = dict(self.bag_kwargs)
        if not kw:  # one element per partition: the splits spread over the workers
            kw = {"npartitions": max(1, min(len(values), _MAX_CREATE_PARTITIONS))}
        return db.from_sequence(values, **kw)

    def _side(self, pc: Any) -> Any:
        item = self._sides.get(id(pc))
        if item is None:  # computed once on the cluster, handed to every reader
            item = self._sides[id(pc)] = self.bags[id(pc)].reduction(gather, concat)
        return item

    def _pardo(self, node: AppliedPTransform, bag: Any) -> None:
        t: Any = node.transform
        main: Any = next(iter(node.main_inputs.values()))
        if isinstance(t, beam.WindowInto) and isinstance(t.windowing.windowfn, GlobalWindows):
            self._one(node.outputs, bag)  # into the global window: elements unchanged
            return
        if isinstance(t, beam.WindowInto) or not isinstance(main.windowing.windowfn, GlobalWindows):
            raise NotImplementedError(
                f"privpipe's Dask runner runs on the global window only ({node.full_label})"
            )
        views = [(type(s), s._view_options()) for s in node.side_inputs]
        payload = pickler.dumps((node.full_label, t.fn, t.args, t.kwargs, views))
        sides = [self._side(s.pvalue) for s in node.side_inputs]
        mixed = _bundles(_token(node), bag, payload, sides)
        for tag, pc in node.outputs.items():
            self.bags[id(pc)] = mixed.map_partitions(select, None if tag is None else str(tag))
        self.metrics.append(mixed.map_partitions(select, _METRICS))

    def sinks(self) -> list[Any]:
        """One element count per PCollection nobody reads (each bag once)."""
        seen: set[str] = set()
        out = []
        for pc, bag in self.bags.items():
            if pc in self.consumed or bag.name in seen:
                continue
            seen.add(bag.name)
            out.append(bag.reduction(count, sum))
        return out


def _bundles(token: str, bag: Any, payload: bytes, sides: Sequence[Any]) -> Any:
    """The bag of ``run_bundle`` over each partition of ``bag``, every task depending on the
    side inputs' own keys. (Dask's map_partitions would re-key each side input's graph
    apart from its other uses, computing its upstream twice.)"""
    import dask.bag as db
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    name = f"{token}-{tokenize(bag.name, payload, [s.key for s in sides])}"
    keys = [s.key for s in sides]
    dsk: dict[Any, Any] = {
        (name, i): (run_bundle, (bag.name, i), payload, *keys) for i in range(bag.npartitions)
    }
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[bag, *sides])
    return db.Bag(graph, name, bag.npartitions)


def _token(node: AppliedPTransform) -> str:
    """A readable task name prefix (Dask adds a hash of the arguments)."""
    return "".join(c if c.isalnum() else "-" for c in node.full_label)[:60] or "pardo"


class DaskMetrics(MetricResults):  # type: ignore[misc]
    """The counters the bundles reported, summed per (step, metric)."""

    def __init__(self, totals: dict[MetricKey, int]) -> None:
        self.totals = totals

    def query(self, filter: Any = None) -> dict[str, list[MetricResult]]:
        found = [MetricResult(k, v, v) for k, v in self.totals.items() if self.matches(filter, k)]
        return {
            self.COUNTERS: found,
            self.DISTRIBUTIONS: [],
            self.GAUGES: [],
            self.STRINGSETS: [],
            self.BOUNDED_TRIES: [],
            self.HISTOGRAMS: [],
        }


class DaskResult(PipelineResult):  # type: ignore[misc]
    """A running Dask job; waiting gathers every sink (a worker's exception is raised here)
    and closes the client, and the local cluster when this run started it."""

    def __init__(self, client: Any, futures: list[Any], metrics: Any, cluster: Any) -> None:
        super().__init__(PipelineState.RUNNING)
        self.client = client
        self.futures = futures
        self._metrics_future = metrics
        self.cluster = cluster
        self._metrics = DaskMetrics({})

    def wait_until_finish(self, duration: int | None = None) -> str:
        import dask.distributed as dd

        try:
            timeout = None if duration is None else duration / 1000
            for _ in dd.as_completed(self.futures, timeout=timeout, with_results=True):
                pass
            totals: dict[MetricKey, int] = {}
            for bundle in self._metrics_future.result():  # each bundle's [(key, value)]
                for key, value in bundle:
                    totals[key] = totals.get(key, 0) + value
            self._metrics = DaskMetrics(totals)
            self._state = PipelineState.DONE
        except BaseException:
            self._state = PipelineState.FAILED
            self.client.cancel(self.futures)
            raise
        finally:
            self.close()
        return str(self._state)

    def cancel(self) -> str:
        self.client.cancel(self.futures)
        self.close()
        self._state = PipelineState.CANCELLED
        return str(self._state)

    def metrics(self) -> DaskMetrics:
        return self._metrics

    def close(self) -> None:
        """Close the client and a cluster started for this run (idempotent)."""
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None


def local_workers() -> int:
    """Worker processes of a local cluster: one per core."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LocalClusterOptions(PipelineOptions):  # type: ignore[misc]
    """privpipe's option for the local cluster a run starts without a scheduler address."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument(
            "--dask_local_workers",
            type=int,
            default=None,
            help="worker processes (one thread each) of the local Dask cluster started "
            "when no --dask_client_address/--dask_scheduler_file is given (default: one "
            "per core)",
        )


class DaskRunner(BeamDaskRunner):  # type: ignore[misc]
    """Runs a privpipe pipeline on a dask.distributed cluster (``--dask_client_address`` or
    ``--dask_scheduler_file``), else on a local cluster of one single-threaded worker process
    per core, started and closed by the run."""

    def run_pipeline(self, pipeline: beam.Pipeline, options: Any) -> DaskResult:
        import dask.distributed as dd

        dask_options = options.view_as(DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        workers = options.view_as(LocalClusterOptions).dask_local_workers or local_workers()
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        pipeline.replace_all(overrides())
        translate = _Translate(bag_kwargs)
        pipeline.visit(translate)  # before any cluster: a graph it cannot run fails here
        sinks = translate.sinks()
        import dask.bag as db

        metrics = (
            db.concat(translate.metrics).reduction(gather, concat) if translate.metrics else None
        )
        cluster = None
        quiet = logging.getLogger("distributed")  # its INFO lines would drown privpipe's
        if quiet.getEffectiveLevel() < logging.WARNING:
            quiet.setLevel(logging.WARNING)
        if not dask_options.get("address") and not dask_options.get("scheduler_file"):
            cluster = dd.LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            )
            dask_options["address"] = cluster
        try:
            client = dd.Client(**dask_options)
        except BaseException:
            if cluster is not None:
                cluster.close()
            raise
        try:
            futures = client.compute(
                [*sinks, *([metrics] if metrics is not None else [])], optimize_graph=False
            )
        except BaseException:
            client.close()
            if cluster is not None:
                cluster.close()
            raise
        if metrics is not None:
            futures, metrics_future = futures[:-1], futures[-1]
        else:
            metrics_future = _Done([])
        return DaskResult(client, list(futures), metrics_future, cluster)


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value
