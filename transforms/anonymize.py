"""One anonymised release as a Beam composite: summarise → search → recode → verify → write.

    batches ─► FrequencyTable ─► Plan (hierarchies, summary, search; the releases sharing
                                   │ one table: SearchReleases, side by side on the cores)
                                   │ side input
    rows to recode ─► Recode (AnonymizeRelease) ─► WriteTable(data.csv|parquet, shuffled)
    (ExpandTable of the      └────► FrequencyTable ─► Verify ─► release.json
     table, or a second read)

The search sees only the frequency table of distinct (QI, SA) values, never rows; with
``unit: person`` of distinct (QI, SA, person id) values, and the verifier counts classes
of (published labels, SA, person id), so k is checked in persons on the rows written.
The person id travels beside the recoded rows up to the writer, which never writes it.
With ``suppressed: drop`` the SA (and person id) of the dropped rows are counted apart,
so the verifier can check the dropped block as the class it is for an attacker.
The rows to recode are never the first read's batches, so that no runner
has to hold every batch while the search runs: a runner in this process expands the
frequency table the search started from (``transforms.expand``, the same rows as a
multiset), a distributed one reads the input again on its workers
(``pipelines.run.build_graph``). On a runner that runs one
stage at a time in-process, the longest searches are planned ahead (``SearchReleases(
ahead=...)``, ``AwaitPlan``; ``transforms.planning``): the other releases are recoded,
verified and written while those searches run, and the releases planned ahead get their
own rows to recode. Where those rows would come from the table (a runner in this process),
the worker that searched a release planned ahead also publishes it
(``pipelines.publish_ahead``): this composite in a pipeline of its own, while this
process recodes the other releases and bounds the DP contributions. The published table
is verified by `anonymity.verify` — code separate from the search's — on exactly
the rows that are written; a failed check raises PrivacyRefusal and nothing is
published (the run's staging folder is discarded). The table is written in a uniformly
random order drawn from the OS CSPRNG (``WriteTable``'s scatter shuffle), independently
per release and per run: row positions link nothing across releases or to the input.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsSingleton
from pandas._libs.hashtable import Int64HashTable as _Int64HashTable
from pandas._libs.hashtable import Int64Vector as _Int64Vector

from privpipe.anonymity.api import release_document
from privpipe.anonymity.arrays import (
    KEY_BITS,
    bit_widths,
    pack_rows,
    sum_by_key,
    unique_counts,
    unpack_rows,
)
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import group_rows, unit_hashes
from privpipe.anonymity.verify import verify_counts, verify_grid_labels
from privpipe.errors import PrivacyRefusal
from privpipe.timing import NAMESPACE
from privpipe.transforms.coders import HandOverCoder, hands_over
from privpipe.transforms.context import (  # noqa: F401 (re-exported: the composites' contexts)
    COUNT,
    RecodeContext,
    ReleaseContext,
    Resolver,
    SlimContext,
    _value_counts,
    make_context,
)
from privpipe.transforms.memory import release_free_memory
from privpipe.transforms.order import after
from privpipe.transforms.overlap import OverlappedCombineFn
from privpipe.transforms.planning import (
    PlanCall,
    Published,
    Ticket,
    collect_ahead,
    plan_releases,
    plan_with_ahead,
)
from privpipe.transforms.sink import WriteTable, write_json_step
from privpipe.transforms.timing import TimedDoFn, stage_ms, timed


class _HashDictionary:
    """Distinct int64 values (person hashes) in order of first appearance, each one's code
    its position in that order, looked up in pandas' own int64 hash table (the one
    ``pd.factorize`` fills; ``pandas._libs.hashtable``, stable within pandas' pinned minor
    version): a batch of ``b`` values costs O(b), whatever the persons seen. It replaced
    sorted runs merged like a binary counter (O(b log n); 4.1 against 1.6 s for 9M rows of
    4.4M persons), which had replaced a ``pd.Index`` rebuilt by ``append`` (quadratic: 85 s
    for the 10M-row demo file's 6M persons). Pickled as its values; the table is rebuilt."""

    __slots__ = ("_n", "_table", "_values")

    def __init__(self) -> None:
        self._values = np.empty(0, dtype=np.int64)  # in code order; grown by doubling
        self._n = 0
        self._table = _Int64HashTable()

    def __len__(self) -> int:
        return self._n

    def __getstate__(self) -> npt.NDArray[np.int64]:
        return self.to_numpy().copy()

    def __setstate__(self, values: npt.NDArray[np.int64]) -> None:
        self.__init__()  # type: ignore[misc]
        self.encode(values)

    def to_numpy(self, dtype: Any = None) -> npt.NDArray[np.int64]:
        """The values in code order (a view)."""
        return self._values[: self._n]

    def encode(self, values: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Codes of ``values`` (repeated or not); new ones get the next codes, in the order
        they first appear."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        fresh = _Int64Vector()  # the values new to the table, in order
        codes = self._table.get_labels(values, fresh, self._n, -1)
        self._append(fresh.to_array())
        return codes.astype(np.int32)

    def _append(self, new: npt.NDArray[np.int64]) -> None:
        end = self._n + new.shape[0]
        if end > self._values.shape[0]:
            grown = np.empty(max(end, 2 * self._values.shape[0], 1024), dtype=np.int64)
            grown[: self._n] = self._values[: self._n]
            self._values = grown
        self._values[self._n : end] = new
        self._n = end


@dataclass
class _Partial:
    """A partial frequency table: distinct rows as integer codes (one column per summarised
    column, a code being a position in that column's dictionary of values) and their counts.

    ``values[j]`` holds the distinct values of column ``j`` as strings (missing as NaN), in
    order of first appearance; it only grows, so codes stay valid as batches arrive.

    While the codes fit side by side in the bits of an int64 (``layout``: bits per column,
    first column most significant), each part's rows are kept packed as sorted keys: parts
    merge by sorting 64-bit values, with no permutation built and no code matrix gathered,
    and rows are unpacked only when the table is read. A person-id column takes the spare
    bits, so its growing dictionary does not change the layout. Wider rows (``layout`` is
    None) are kept as code matrices and merged by ``group_rows``.
    """

    values: list[pd.Index | _HashDictionary] = field(default_factory=list)
    parts: list[npt.NDArray[np.int64] | npt.NDArray[np.int32]] = field(default_factory=list)
    counts: list[npt.NDArray[np.int64]] = field(default_factory=list)
    layout: list[int] | None = None
    compacted: int = 0

    def size(self) -> int:
        return sum(len(c) for c in self.counts)

    def radices(self) -> list[int]:
        return [max(len(v), 1) for v in self.values]

    def add(self, codes: npt.NDArray[np.int32], counts: npt.NDArray[np.int64]) -> None:
        """Add rows of codes (any, repeated or not) with their counts, distinct per part."""
        self._fit_layout()
        if self.layout is None:  # distinct per part too, as the packed parts are
            rows, summed = _distinct_rows(codes, counts, self.radices())
            self.parts.append(rows)
            self.counts.append(summed)
            return
        keys, summed = _sum_keys(pack_rows(codes, self.layout), counts)
        self.parts.append(keys)
        self.counts.append(summed)

    def rows(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """The table's distinct rows as codes and their counts (compacted first)."""
        self.compact()
        if not self.parts:
            return np.zeros((0, len(self.values)), dtype=np.int32), np.zeros(0, dtype=np.int64)
        return self.unpacked(self.parts[0]), self.counts[0]

    def compact(self) -> None:
        """Merge the parts into one (rows distinct, counts summed)."""
        if len(self.parts) > 1:
            counts = np.concatenate(self.counts)
            if self.layout is None:
                codes, counts = _distinct_rows(np.concatenate(self.parts), counts, self.radices())
                self.parts, self.counts = [codes], [counts]
            else:
                keys, counts = _sum_keys(np.concatenate(self.parts), counts)
                self.parts, self.counts = [keys], [counts]
        self.compacted = self.size()

    def maybe_compact(self) -> None:
        """Amortised: merge once the parts hold twice what the last merge left."""
        if self.size() > 2 * max(self.compacted, 65_536):
            self.compact()

    def encode(
        self, j: int, values: pd.Index | _HashDictionary | npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int32]:
        """Codes of distinct ``values`` in dictionary ``j`` (a hashed column's: any int64
        values, repeated or not); new ones are appended."""
        known = self.values[j]
        if isinstance(known, _HashDictionary):
            if not isinstance(values, np.ndarray):
                values = values.to_numpy(dtype=np.int64)
            return known.encode(values)
        assert isinstance(values, pd.Index)
        position = known.get_indexer(values)
        fresh = position < 0
        if fresh.any():
            position[fresh] = len(known) + np.arange(int(fresh.sum()))
            self.values[j] = known.append(values[fresh])
        return position.astype(np.int32)

    def unpacked(
        self, part: npt.NDArray[np.int64] | npt.NDArray[np.int32]
    ) -> npt.NDArray[np.int32]:
        """A part's rows as codes (unpacked from its keys, or as kept when wide)."""
        if part.ndim == 2:
            return part  # type: ignore[return-value]
        assert self.layout is not None
        return unpack_rows(part, self.layout)  # type: ignore[arg-type]

    def _fit_layout(self) -> None:
        """Widen the layout when a dictionary outgrew its bits (parts repacked), or give
        it up when the codes no longer fit an int64 key (parts unpacked, for good)."""
        need = bit_widths(self.radices())
        old = self.layout
        if old is not None and all(w <= o for w, o in zip(need, old, strict=True)):
            return
        if self.parts and old is None:
            return  # already wide: dictionaries only grow
        layout: list[int] | None = None
        if sum(need) <= KEY_BITS:
            spare = KEY_BITS - sum(need)
            hashed = [j for j, v in enumerate(self.values) if isinstance(v, _HashDictionary)]
            for j in hashed:  # the person ids grow all run long: they take the headroom
                need[j] += spare // len(hashed)
            layout = need
        codes = [self.unpacked(part) for part in self.parts]
        self.layout = layout
        if layout is not None:
            self.parts = [pack_rows(c, layout) for c in codes]  # same rows: still sorted
        else:
            self.parts = list(codes)


def _sum_keys(
    keys: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Sorted distinct keys and their summed counts. When the counts add up to at most
    twice the keys (rows nearly all distinct, as with a person id), the keys repeated by
    their counts are sorted by value (numpy sorts 64-bit values several times faster than
    it argsorts them); otherwise by an argsort (``sum_by_key``)."""
    if int(counts.sum()) <= 2 * keys.shape[0]:
        if bool((counts != 1).any()):
            keys = np.repeat(keys, counts)
        return unique_counts(keys)
    return sum_by_key(keys, counts)


def _distinct_rows(
    codes: npt.NDArray[np.int32], counts: npt.NDArray[np.int64], radices: Sequence[int]
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Distinct rows of a code matrix and their summed counts (mixed-radix keys, np.unique)."""
    group, first = group_rows([codes[:, j] for j in range(codes.shape[1])], radices)
    summed = np.bincount(group, weights=counts, minlength=len(first))
    return codes[first], np.rint(summed).astype(np.int64)


class FrequencyTable(beam.CombineFn):  # type: ignore[misc]
    """Batches → one DataFrame of the distinct value combinations of `columns` (as strings)
    and their counts, bounded by the distinct combinations, not by rows.

    Values are compared as strings (``astype("str")``; missing stays missing; a float
    ``-0.0`` is ``0.0``, as in the canonical strings hierarchies match). While
    partial tables are combined, a row is a tuple of int32 codes into per-column
    dictionaries of values (about 4 bytes per column and 8 for the count per distinct
    row); equal rows are found exactly with mixed-radix int64 keys, never hashes. With
    ``categorical`` the columns come out as pandas Categoricals over those dictionaries
    (cheap to ship and to encode); otherwise as ``str`` columns.

    ``hashed`` columns (the person id) are carried as the 64-bit hash of each value's
    canonical string (``summary.unit_hashes``, the hash the summary uses) and come out as
    a ``uint64`` column: no dictionary of a million id strings is built, shipped or
    merged. A collision can only merge two persons, so persons are undercounted and the
    models checked more strictly, never less.
    """

    def __init__(
        self,
        columns: Sequence[str],
        categorical: bool = False,
        hashed: Sequence[str] = (),
        hashed_as_codes: bool = False,
    ) -> None:
        self.columns = list(columns)
        self.categorical = categorical
        self.hashed = frozenset(c for c in hashed if c in self.columns)
        # hashed columns out as their codes in this table (a categorical over 0..n-1),
        # not the hashes: what tells persons apart for a verifier, with no hash table of
        # millions of hashes to factorise them again (2.3 s for 9M rows of 6M persons)
        self.hashed_as_codes = hashed_as_codes
        # partial tables go to the merge by reference on a runner in this process
        self.hand_over = hands_over()

    def get_accumulator_coder(self) -> Any:
        return HandOverCoder() if self.hand_over else super().get_accumulator_coder()

    def create_accumulator(self) -> _Partial:
        return _Partial(
            values=[
                _HashDictionary() if c in self.hashed else pd.Index([], dtype=object)
                for c in self.columns
            ]
        )

    def add_input(self, acc: _Partial, batch: pd.DataFrame) -> _Partial:
        if not len(batch):
            return acc
        codes = np.empty((len(batch), len(self.columns)), dtype=np.int32)
        for j, col in enumerate(self.columns):
            if col in self.hashed:
                # every row's hash looked up as is (the table finds repeats itself)
                codes[:, j] = acc.encode(j, unit_hashes(batch[col], col))
                continue
            column = batch[col]
            if isinstance(column.dtype, pd.CategoricalDtype):
                # a recoding's labels: codes into the categories (a missing value last),
                # nothing hashed per row; only the values present enter the dictionary
                raw_codes = np.asarray(column.array.codes, dtype=np.intp).copy()
                n_categories = len(column.dtype.categories)
                raw_codes[raw_codes < 0] = n_categories
                present = np.bincount(raw_codes, minlength=n_categories + 1) > 0
                renumber = np.cumsum(present) - 1
                raw_codes = renumber[raw_codes]
                strings = self._kept_category_strings(j, column.dtype)[present]
            else:
                # distinct raw values first, then their strings (equal strings share a
                # code); -0.0 is 0.0 (factorize merges them within a batch; so must every
                # batch)
                values = column + 0.0 if column.dtype.kind == "f" else column
                raw_codes, raw_uniques = pd.factorize(values, use_na_sentinel=False)
                strings = pd.Series(raw_uniques).astype("str").to_numpy(dtype=object)
            str_codes, str_uniques = pd.factorize(strings, use_na_sentinel=False)
            global_codes = acc.encode(j, pd.Index(str_uniques, dtype=object))
            codes[:, j] = global_codes[str_codes][raw_codes]
        acc.add(codes, np.ones(len(batch), dtype=np.int64))
        acc.maybe_compact()
        return acc

    def _kept_category_strings(self, j: int, dtype: pd.CategoricalDtype) -> npt.NDArray[np.object_]:
        """``_category_strings`` of column ``j``'s dtype, kept for the last dtype object seen
        (a recoder's batches share one per column: a Mondrian table's thousands of labels
        are made strings once, not once per batch)."""
        kept = self.__dict__.setdefault("_strings_of", {})
        last = kept.get(j)
        if last is None or last[0] is not dtype:
            last = kept[j] = (dtype, _category_strings(dtype))
        strings: npt.NDArray[np.object_] = last[1]
        return strings

    def compact(self, acc: _Partial) -> _Partial:
        """Before a partial table is encoded and shipped: merge its pending parts."""
        acc.compact()
        return acc

    def merge_accumulators(self, accs: Iterable[_Partial]) -> _Partial:
        """Merge as the partials stream in (amortised), never holding all at once, into
        the first one (Beam lets a CombineFn modify and return its first accumulator: its
        dictionaries are kept, not encoded again)."""
        release_free_memory()
        stream = iter(accs)
        out = next(stream, None)
        if out is None:
            return self.create_accumulator()
        for acc in stream:
            mappings = [out.encode(j, v) for j, v in enumerate(acc.values)]
            for part, counts in zip(acc.parts, acc.counts, strict=True):
                codes = acc.unpacked(part)
                remapped = np.empty_like(codes)
                for j, mapping in enumerate(mappings):
                    remapped[:, j] = mapping[codes[:, j]]
                out.add(remapped, counts)
            out.maybe_compact()
        out.compact()
        return out

    def extract_output(self, acc: _Partial) -> pd.DataFrame:
        rows, counts = acc.rows()
        n = acc.size()
        out: dict[str, Any] = {}
        for j, col in enumerate(self.columns):
            values = acc.values[j]
            if col in self.hashed and self.hashed_as_codes:
                codes = rows[:, j]  # positions in the dictionary of distinct hashes
                out[col] = pd.Categorical.from_codes(codes, categories=pd.RangeIndex(len(values)))
                continue
            if col in self.hashed:
                hashes = values.to_numpy(dtype=np.int64)[rows[:, j]]
                out[col] = np.ascontiguousarray(hashes).view(np.uint64)
                continue
            assert isinstance(values, pd.Index)
            if self.categorical:
                missing = values.isna()
                present = np.flatnonzero(~missing)
                recode = np.full(len(values), -1, dtype=np.int32)
                recode[present] = np.arange(len(present), dtype=np.int32)
                categories = pd.Index(values[present], dtype="str")
                out[col] = pd.Categorical.from_codes(recode[rows[:, j]], categories=categories)
            else:
                out[col] = _taken_strings(values, rows[:, j])
        assert len(counts) == n
        return pd.DataFrame({**out, COUNT: counts})


def _category_strings(dtype: pd.CategoricalDtype) -> npt.NDArray[np.object_]:
    """The strings of a categorical dtype's categories, as ``astype("str")`` makes a
    column's values, then a missing value (the code of a missing cell)."""
    values = pd.Series(dtype.categories, dtype=dtype.categories.dtype)
    if values.dtype.kind == "f":
        values = values + 0.0  # -0.0 is 0.0, as for a column of floats
    strings = values.astype("str").to_numpy(dtype=object)
    return np.append(strings, np.array([np.nan], dtype=object))


def _taken_strings(values: pd.Index, codes: npt.NDArray[np.int32]) -> Any:
    """``str`` column of ``values[codes]`` (a dictionary of strings and missing values),
    gathered by Arrow from the dictionary instead of made from one Python string per row."""
    strings = np.asarray(values, dtype=object)
    try:
        dictionary = pa.array(strings, type=pa.large_string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all strings: as pandas makes them
        return pd.array(strings[codes], dtype="str")
    return pd.array(dictionary.take(pa.array(codes)), dtype="str")


class RecodeFn(beam.DoFn):  # type: ignore[misc]
    """A batch with its QIs replaced by their published labels; only QIs and the sensitive
    attribute are published (person ids and other columns never are)."""

    def setup(self) -> None:
        release_free_memory()  # what the search freed, before the rows to recode

    SUPPRESSED = "suppressed"
    DROPPED = "dropped"

    def process(self, batch: pd.DataFrame, ctx: RecodeContext) -> Iterable[Any]:
        spec = ctx.spec
        cols = published_columns(spec)
        out, suppressed = ctx.recoder.apply(batch[cols], ctx.hierarchies)
        out = out[cols]
        # counted where it happens, so the verifier checks the plan against the rows
        yield beam.pvalue.TaggedOutput(self.SUPPRESSED, int(suppressed.sum()))
        unit = spec.unit_by
        if unit is not None:  # for counting persons; the writer leaves it out
            out[unit] = batch[unit].to_numpy()
        if spec.suppressed == "drop":
            mask = np.asarray(suppressed, dtype=bool)
            if mask.any():
                rest = dropped_columns(spec)
                block = out.loc[mask].assign(**{NO_COLUMN: ""})[rest]
                yield beam.pvalue.TaggedOutput(self.DROPPED, block.reset_index(drop=True))
            out = out[~mask]
        if len(out):
            yield out.reset_index(drop=True)


def _input_records(ctx: ReleaseContext | SlimContext) -> int:
    return ctx.input_records


def _for_recoding(ctx: ReleaseContext | SlimContext) -> RecodeContext:
    return ctx.for_recoding()


def _without_tuples(ctx: ReleaseContext | SlimContext) -> ReleaseContext:
    return ctx.without_tuples()


def published_columns(spec: AnonymizationSpec) -> list[str]:
    return [*spec.qis, *([spec.sensitive] if spec.sensitive else [])]


NO_COLUMN = "_"  # counts the dropped rows when neither an SA nor a person id is counted


def dropped_columns(spec: AnonymizationSpec) -> list[str]:
    """What is counted of the rows ``suppressed: drop`` leaves out: SA and person id."""
    rest = [c for c in counted_columns(spec) if c not in spec.qis]
    return rest or [NO_COLUMN]


def hash_units(batch: pd.DataFrame, unit: str) -> pd.DataFrame:
    """The batch with its person ids replaced by their 64-bit hashes (``unit_hashes``, as a
    ``uint64`` column, which every ``FrequencyTable(hashed=...)`` takes as is): on the rows
    read for recoding, hashed once for all releases instead of once per release's verifier.
    The person id is never published; the verifier still counts persons on these rows."""
    out = batch.copy(deep=False)  # the batch itself may feed other steps: not modified
    out[unit] = unit_hashes(batch[unit], unit).view(np.uint64)
    return out


def hashed_columns(spec: AnonymizationSpec) -> list[str]:
    """The columns the frequency tables carry as 64-bit hashes: the person id."""
    return [spec.unit_by] if spec.unit_by is not None else []


class Summarise(beam.PTransform):  # type: ignore[misc]
    """batches → the one frequency table a release's search starts from (the published
    columns and the person id). Releases counting the same columns share one: built once,
    it feeds their ``SearchReleases`` step and, expanded (``transforms.expand``), the rows
    they recode."""

    def __init__(self, spec: AnonymizationSpec) -> None:
        super().__init__()
        self.columns = counted_columns(spec)
        self.hashed = hashed_columns(spec)

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        table = OverlappedCombineFn("summary", FrequencyTable(self.columns, True, self.hashed))
        return batches | "FrequencyTable" >> beam.CombineGlobally(table)


def counted_columns(spec: AnonymizationSpec) -> list[str]:
    """The published columns and, with ``unit: person``, the person id (never written)."""
    unit = spec.unit_by
    return [*published_columns(spec), *([unit] if unit is not None else [])]


def verify_and_document(
    class_counts: pd.DataFrame,
    ctx: ReleaseContext,
    suppressed: int,
    dropped: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Verify the table to be published and return release.json; refuse if it fails.

    The verifier recounts classes from the rows being written and checks the number of
    records the recoding actually suppressed (counted batch by batch) against the `*` rows
    it finds, the record total and the plan.
    """
    spec = ctx.spec
    if suppressed != ctx.plan.suppressed_records:
        raise PrivacyRefusal(
            f"release {spec.name!r}: recoding the rows suppressed {suppressed} records, the "
            f"plan {ctx.plan.suppressed_records}; nothing was published"
        )
    verification = verify_counts(
        class_counts,
        spec,
        input_records=ctx.input_records,
        suppressed_records=suppressed,
        input_sa_distribution=ctx.plan.input_sa_distribution,
        sa_hierarchy=ctx.sa_hierarchy,
        dropped_counts=dropped if spec.suppressed == "drop" else None,
    )
    if not verification.ok:
        raise PrivacyRefusal(
            f"release {spec.name!r}: the independent check of the published table failed: "
            f"{verification.message()}; nothing was published"
        )
    off_grid = verify_grid_labels(class_counts, spec, ctx.hierarchies)
    if off_grid:
        raise PrivacyRefusal(
            f"release {spec.name!r}: a published range is off the public grid: "
            f"{'; '.join(off_grid)}; nothing was published"
        )
    return release_document(spec, ctx.plan, verification)


class SearchReleases(beam.PTransform):  # type: ignore[misc]
    """The summary several releases share → ``{release name: its one context}``, their
    searches side by side on the machine's cores (``planning.plan_releases``).

    ``ahead``: releases planned ahead (``planning.plan_with_ahead``): the step returns once
    the others are planned, and for each of these a ``planning.Ticket`` instead of a
    context (``AwaitPlan`` turns it into the context later). ``publish``: by name, what
    the workers of some of them run instead of planning only (e.g. plan and publish:
    ``pipelines.publish_ahead.PublishAhead``).

    Stage timings: ``search`` is the time the pipeline waited for searches (this step and
    every ``AwaitPlan``), ``search:<release>`` the seconds each release's planning took
    where it ran (a worker process or this one)."""

    def __init__(
        self,
        specs: Sequence[AnonymizationSpec],
        resolver: Resolver,
        ahead: Sequence[str] = (),
        publish: Mapping[str, PlanCall] | None = None,
    ) -> None:
        super().__init__()
        self.specs = list(specs)
        self.resolver = resolver
        self.ahead = list(ahead)
        self.publish = dict(publish or {})

    def expand(self, freq: beam.PCollection) -> dict[str, beam.PCollection]:
        names = [str(s.name) for s in self.specs]
        planned = freq | "Search" >> beam.FlatMap(
            _search_releases, self.specs, self.resolver, self.ahead, self.publish
        )
        by_name = beam.Partition(_by_name, len(names), names)  # type: ignore[arg-type]
        parts = planned | "ByRelease" >> by_name
        return {
            name: parts[i] | f"Context[{name}]" >> beam.MapTuple(_context)
            for i, name in enumerate(names)
        }


class AwaitPlan(beam.PTransform):  # type: ignore[misc]
    """A release's ``planning.Ticket`` → its context, once every PCollection of ``after``
    is complete: the steps a runner runs before this one (one stage at a time) are the
    ones that overlap the release's search."""

    def __init__(self, after: Sequence[beam.PCollection]) -> None:
        super().__init__()
        self.after = list(after)

    def expand(self, tickets: beam.PCollection) -> beam.PCollection:
        return after(tickets, self.after, "After") | "Collect" >> beam.Map(_collect_plan)


def _collect_plan(ticket: Ticket) -> SlimContext:
    with stage_ms("search"):
        planned = collect_ahead(ticket)
    Metrics.counter(NAMESPACE, f"search:{ticket.spec.name}").inc(round(planned.seconds * 1000))
    if isinstance(planned, Published):  # its publication's stages, timed where it ran
        for name, ms in planned.stages.items():
            Metrics.counter(NAMESPACE, name).inc(ms)
    return planned.context.slim()


def _search_releases(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    ahead: Sequence[str] = (),
    publish: Mapping[str, PlanCall] | None = None,
) -> Iterator[tuple[str, ReleaseContext | SlimContext | Ticket]]:
    tickets: list[Ticket] = []
    with stage_ms("search"):
        if ahead:
            planned, tickets = plan_with_ahead(freq, specs, resolver, ahead, publish)
        else:
            planned = plan_releases(freq, specs, resolver, slim=True)
    for name, p in planned.items():
        Metrics.counter(NAMESPACE, f"search:{name}").inc(round(p.seconds * 1000))
        yield name, p.context
    for ticket in tickets:
        yield str(ticket.spec.name), ticket


def _by_name(
    named: tuple[str, ReleaseContext | SlimContext | Ticket], n: int, names: Sequence[str]
) -> int:
    return names.index(named[0])


def _context(name: str, context: SlimContext | Ticket) -> SlimContext | Ticket:
    return context


class AnonymizeRelease(beam.PTransform):  # type: ignore[misc]
    """rows to recode → releases/<name>/{data.<fmt>, release.json} in `directory`, with the
    release's plan ``context`` (a ``SearchReleases`` step's, or ``AwaitPlan``'s)."""

    def __init__(
        self,
        spec: AnonymizationSpec,
        context: beam.PCollection,
        directory: str,
        output_format: str = "csv",
        counts_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.context = context
        self.directory = directory
        self.output_format = output_format
        self.counts_dir = counts_dir  # where the audit's table of the published rows goes

    def expand(self, again: beam.PCollection) -> beam.PCollection:
        spec, cols = self.spec, published_columns(self.spec)
        counted = counted_columns(spec)
        hashed = hashed_columns(spec)
        ctx = self.context
        # the side inputs are slim views of the context (the full one is never shipped)
        recoder = ctx | "Recoder" >> beam.Map(_for_recoding)
        figures = ctx | "Figures" >> beam.Map(_without_tuples)
        recode_fn = TimedDoFn(f"recode:{spec.name}", RecodeFn())
        recode = again | "Recode" >> beam.ParDo(recode_fn, AsSingleton(recoder)).with_outputs(
            RecodeFn.SUPPRESSED, RecodeFn.DROPPED, main="rows"
        )
        recoded = recode.rows
        suppressed = recode[RecodeFn.SUPPRESSED] | "CountSuppressed" >> beam.CombineGlobally(sum)
        written = recoded
        if counted != cols:
            written = recoded | "Published" >> beam.Map(lambda batch: batch[cols])
        # published in a uniformly random order (CSPRNG scatter shuffle), fresh per release
        rows = ctx | "Rows" >> beam.Map(_input_records)
        write = WriteTable(
            self.directory,
            "data",
            cols,
            format=self.output_format,  # type: ignore[arg-type]
            shuffle_rows=rows,
        )
        _ = written | "Write" >> write
        dropped = recode[RecodeFn.DROPPED] | "CountDropped" >> beam.CombineGlobally(
            FrequencyTable(dropped_columns(spec), hashed=hashed)
        )
        path = str(Path(self.directory) / "release.json")
        classes = recoded | "CountClasses" >> beam.CombineGlobally(
            OverlappedCombineFn(
                f"verify:{spec.name}", FrequencyTable(counted, True, hashed, hashed_as_codes=True)
            )
        )
        if self.counts_dir is not None:  # the audit reads these counts, not the table
            from privpipe.transforms.audit_truth import StagePublishedCounts

            _ = classes | "PublishedCounts" >> StagePublishedCounts(
                self.counts_dir, str(spec.name), cols
            )
        return (
            classes
            | "Verify"
            >> beam.Map(
                timed(f"verify:{spec.name}", verify_and_document),
                AsSingleton(figures),
                AsSingleton(suppressed),
                AsSingleton(dropped),
            )
            | "WriteRelease" >> beam.Map(write_json_step, path)
        )
