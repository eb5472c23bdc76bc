"""Published anonymised tables are in a uniformly random order (issue 11).

Row i of two releases, or of a release and the input, must not be the same record, and
the order must not show which rows belong to one person. Each table here publishes a
unique input position ``pos`` (k=1, level 0), so its order can be read back exactly:

- the Spearman rank correlation of published order with input order is within chance
  (|rho| < 5 standard deviations of a uniform order, 1/sqrt(n-1)), run after run;
- a person's rows (adjacent in the input) are adjacent about as often as by chance;
- two releases of one run, and two runs, are in independent (different) orders;
- the scatter shuffle of ``WriteTable`` gives every order of 3 rows equally often.

Without the shuffle, rho is 1 and every person's rows are adjacent: each test fails.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml

import privpipe.transforms.sink as sink
from privpipe.anonymity.api import anonymize, shuffled
from privpipe.anonymity.hierarchy import build_intervals
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.dp.secure_random import SecureRandom, SeededRandom
from privpipe.pipelines.cli import main
from tests.beamtest import local_pipeline
from tests.layout import release_dir

N = 3000
VISITS = 3  # rows per person, adjacent in the input


def spearman(order: np.ndarray) -> float:
    """Rank correlation of published positions 0..n-1 with the input positions ``order``
    (ties get their average rank)."""
    ranks = pd.Series(order).rank().to_numpy(dtype=np.float64)
    published = np.arange(order.shape[0], dtype=np.float64)
    return float(np.corrcoef(ranks, published)[0, 1])


def mean_positions(order: np.ndarray) -> np.ndarray:
    """Per input position value (sorted), its mean published position."""
    return pd.Series(np.arange(order.shape[0])).groupby(order).mean().to_numpy()


def within_chance(rho: float, n: int) -> bool:
    return abs(rho) < 5.0 / math.sqrt(n - 1)


def adjacent_same_person(persons: np.ndarray) -> int:
    """Adjacent published rows of the same person (expected VISITS-1 = 2 in a random order,
    2n/3 in the input order)."""
    return int((persons[1:] == persons[:-1]).sum())


def microdata(n: int = N) -> pd.DataFrame:
    pos = np.arange(n)
    return pd.DataFrame({"pos": pos.astype(str), "pid": (pos // VISITS).astype(str)})


# --------------------------------------------------------------------------- CSPRNG order


def test_permutation_is_a_uniform_order() -> None:
    source = SecureRandom()
    perm = source.permutation(1000)
    assert sorted(perm.tolist()) == list(range(1000))
    assert source.permutation(0).shape == (0,)
    draws = 3000
    seen = Counter(tuple(source.permutation(3).tolist()) for _ in range(draws))
    assert set(seen) == set(itertools.permutations(range(3)))
    expected = draws / 6
    chi2 = sum((c - expected) ** 2 / expected for c in seen.values())
    assert chi2 < 25.0  # 5 degrees of freedom: P(chi2 > 25) < 2e-4
    # a seeded source is reproducible (tests only), the CSPRNG is not
    assert (SeededRandom(3).permutation(50) == SeededRandom(3).permutation(50)).all()
    assert not (source.permutation(50) == source.permutation(50)).all()


# --------------------------------------------------------------------------- pure API


@pytest.fixture(scope="module")
def pure_inputs() -> tuple[pd.DataFrame, AnonymizationSpec, dict[str, Any]]:
    df = microdata()
    hierarchies = {
        "pos": build_intervals("pos", df["pos"], [N]),
        "pid": build_intervals("pid", df["pid"], [N]),
    }
    spec = AnonymizationSpec(kind="k_anonymity", qis=("pos", "pid"), k=1, name="k1")
    return df, spec, hierarchies


def test_pure_api_order_says_nothing_about_input_order(
    pure_inputs: tuple[pd.DataFrame, AnonymizationSpec, dict[str, Any]],
) -> None:
    df, spec, hierarchies = pure_inputs
    orders = []
    for _ in range(4):
        table = anonymize(df, spec, hierarchies).table
        order = table["pos"].astype(int).to_numpy()
        assert sorted(order.tolist()) == list(range(N))  # the same rows, recoded at level 0
        assert within_chance(spearman(order), N)
        assert adjacent_same_person(table["pid"].to_numpy()) <= 15  # Poisson(2) tail < 1e-8
        orders.append(order)
    # releases of one input are in independent orders (row i is not the same record)
    for a, b in itertools.combinations(orders, 2):
        assert within_chance(spearman(np.argsort(a)[b]), N)
    # only a test may fix the order, with a seeded source
    seeded = [shuffled(df, SeededRandom(5))["pos"].tolist() for _ in range(2)]
    assert seeded[0] == seeded[1] != df["pos"].tolist()


# --------------------------------------------------------------------------- Beam


def _config(tmp: Path, out: str) -> Path:
    """Rows r = 0..N-1 with QI pos = r // 2 (k=2 holds at level 0, so pos is published
    as is) and sensitive pid = r // 3 (a person's 3 rows, adjacent in the input)."""
    data = tmp / "people.csv"
    if not data.exists():
        r = np.arange(N)
        pd.DataFrame({"pos": r // 2, "pid": r // VISITS}).to_csv(data, index=False)
    releases = [{"name": name, "kind": "k_anonymity", "k": 2} for name in ("k2a", "k2b")]
    cfg = {
        "name": "order",
        "input": {"path": str(data)},
        "schema": {
            "quasi_identifiers": ["pos"],
            "sensitive": "pid",
            "types": {"pos": "integer"},
        },
        "hierarchies": {
            "pos": {"intervals": {"widths": [N], "lower": 0, "upper": N}},
        },
        "releases": releases,
        "report": {"enabled": False},
        "output": {"dir": str(tmp / out)},
    }
    path = tmp / f"{out}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
def test_beam_releases_in_independent_random_orders(tmp_path: Path) -> None:
    runs = []
    for out in ("run1", "run2"):
        assert main(["run", str(_config(tmp_path, out))]) == 0
        tables = {}
        for name in ("k2a", "k2b"):
            folder = release_dir(tmp_path / out, name)
            table = pd.read_csv(folder / "data.csv", dtype=str)
            order = table["pos"].astype(int).to_numpy()
            assert sorted(order.tolist()) == sorted((np.arange(N) // 2).tolist())
            assert within_chance(spearman(order), N), name
            assert adjacent_same_person(table["pid"].to_numpy()) <= 15
            assert not any(p.name.startswith(".") for p in folder.iterdir())  # no shards left
            tables[name] = order
        # two releases of one run: independent orders
        a, b = mean_positions(tables["k2a"]), mean_positions(tables["k2b"])
        assert within_chance(float(pd.Series(a).corr(pd.Series(b), method="spearman")), N // 2)
        runs.append(tables)
    # two production runs: different, independent orders
    assert not (runs[0]["k2a"] == runs[1]["k2a"]).all()
    a, b = mean_positions(runs[0]["k2a"]), mean_positions(runs[1]["k2a"])
    assert within_chance(float(pd.Series(a).corr(pd.Series(b), method="spearman")), N // 2)


def _write_shuffled(
    tmp: Path, batches: list[pd.DataFrame], rows: int, fmt: str = "csv"
) -> pd.DataFrame:
    with local_pipeline() as p:
        frames = p | beam.Create(batches, reshuffle=False)
        count = p | "Rows" >> beam.Create([rows])
        _ = frames | sink.WriteTable(str(tmp), "data", ["i"], format=fmt, shuffle_rows=count)  # type: ignore[arg-type]
    if fmt == "csv":
        return pd.read_csv(tmp / "data.csv")
    return pd.read_parquet(tmp / "data.parquet")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_write_table_scatter_shuffle_many_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setattr(sink, "BUCKET_ROWS", 100)  # 30 buckets for 3000 rows
    batches = [pd.DataFrame({"i": np.arange(s, s + 500)}) for s in range(0, N, 500)]
    table = _write_shuffled(tmp_path, batches, N, fmt)
    order = table["i"].to_numpy()
    assert sorted(order.tolist()) == list(range(N))
    assert within_chance(spearman(order), N)
    assert [p.name for p in tmp_path.iterdir()] == [f"data.{fmt}"]
    empty = tmp_path / "empty"
    assert _write_shuffled(empty, [pd.DataFrame({"i": []})], 0, fmt).empty
    if fmt == "csv":  # a batch Arrow cannot type (mixed objects) goes through pandas
        mixed = [pd.DataFrame({"i": pd.Series([1, "a", 2.5] * 100, dtype=object)})]
        mixed.append(pd.DataFrame({"i": ["b"] * 300}))
        got = _write_shuffled(tmp_path / "mixed", mixed, 600)["i"].astype(str)
        assert sorted(got) == sorted(["1", "a", "2.5"] * 100 + ["b"] * 300)


@pytest.mark.slow
def test_scatter_shuffle_gives_every_order_equally_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DoFns of the scatter shuffle, run by hand: 3 rows in two batches, 3 buckets."""
    monkeypatch.setattr(sink, "BUCKET_ROWS", 1)
    scatter = sink._ScatterFn(str(tmp_path), "t", ("i",))
    permute = sink._PermuteBucketFn(str(tmp_path), "csv", ",")
    batches = [pd.DataFrame({"i": [0, 1]}), pd.DataFrame({"i": [2]})]
    draws = 400  # without the per-bucket permutation chi2 ~ 44
    seen: Counter[tuple[int, ...]] = Counter()
    for _ in range(draws):
        buckets: dict[int, list[str]] = {}
        for b, path in _bundle(scatter, [(batch, 3) for batch in batches]):
            buckets.setdefault(b, []).append(path)
        shards = sorted(_permuted(permute, buckets))
        rows = [int(line) for s in shards for line in Path(s).read_text().split()]
        seen[tuple(rows)] += 1
        for f in tmp_path.iterdir():
            f.unlink()
    assert set(seen) == set(itertools.permutations(range(3)))
    expected = draws / 6
    chi2 = sum((c - expected) ** 2 / expected for c in seen.values())
    assert chi2 < 25.0, seen


def _bundle(fn: Any, elements: list[tuple[Any, ...]]) -> list[Any]:
    """What a DoFn emits for ``elements`` (each the arguments of one ``process`` call) run
    as a runner runs it, in one bundle: the outputs while elements arrive, then those the
    bundle's end waits for."""
    fn.setup()
    try:
        fn.start_bundle()
        out = [item for args in elements for item in fn.process(*args)]
        out += [windowed.value for windowed in fn.finish_bundle()]
    finally:
        fn.teardown()
    return out


def _permuted(permute: sink._PermuteBucketFn, buckets: dict[int, list[str]]) -> list[str]:
    """The shards the permutation writes for ``buckets``."""
    return _bundle(permute, [(item,) for item in buckets.items()])


def _labelled(values: list[str], categories: list[str]) -> pd.DataFrame:
    """A batch whose column is a Categorical (a recoding's labels) and a plain id."""
    label = pd.Categorical(values, categories=pd.Index(categories, dtype="str"))
    return pd.DataFrame({"i": np.arange(len(values)), "label": label})


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_categorical_columns_are_written_as_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Dictionary columns travel through the scatter as ids and are written as values: the
    same multiset of cells as plain strings, a formula-like label escaped in CSV, a Parquet column
    of strings (not a dictionary). One batch's dictionary is larger than its pieces (decoded
    in the scatter), the others' small (kept): pieces of one bucket then differ in type."""
    monkeypatch.setattr(sink, "BUCKET_ROWS", 50)  # 8 buckets for 400 rows
    monkeypatch.setattr(sink, "_DICTIONARY_MIN", 1)
    small = ["a", "=cmd", "b, c"]
    big = [f"v{j}" for j in range(300)]  # more values than the batch's rows per bucket
    batches = [
        _labelled([small[j % 3] for j in range(150)], small),
        _labelled([big[j] for j in range(100)], big),
        _labelled([small[(j + 1) % 3] for j in range(150)], small[::-1]),
    ]
    expected = sorted(str(v) for b in batches for v in b["label"].astype(str))
    if fmt == "csv":  # a text cell a spreadsheet would run is escaped in CSV
        expected = ["'=cmd" if v == "=cmd" else v for v in expected]
    with local_pipeline() as p:
        frames = p | beam.Create(batches, reshuffle=False)
        count = p | "Rows" >> beam.Create([400])
        _ = frames | sink.WriteTable(
            str(tmp_path), "data", ["i", "label"], format=fmt, shuffle_rows=count
        )  # type: ignore[arg-type]
    if fmt == "csv":
        text = (tmp_path / "data.csv").read_text()
        got = pd.read_csv(tmp_path / "data.csv", dtype=str, keep_default_na=False)
        assert '"b, c"' in text
    else:
        import pyarrow.parquet as pq

        schema = pq.read_schema(tmp_path / "data.parquet")
        assert not pa.types.is_dictionary(schema.field("label").type)
        got = pd.read_parquet(tmp_path / "data.parquet")
        assert not isinstance(got["label"].dtype, pd.CategoricalDtype)
    assert sorted(got["label"].astype(str)) == expected
    assert [p.name for p in tmp_path.iterdir()] == [f"data.{fmt}"]


def test_scatter_keeps_small_dictionaries_and_decodes_large_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pieces themselves, record batches of one file per batch: a dictionary up to the
    batch's rows per bucket stays encoded (ids in the piece), a larger one is written as
    values."""
    monkeypatch.setattr(sink, "BUCKET_ROWS", 10)
    monkeypatch.setattr(sink, "_DICTIONARY_MIN", 1)
    scatter = sink._ScatterFn(str(tmp_path), "t", ("i", "label"))
    types = {}
    for name, categories in {"small": ["x", "y"], "big": [f"v{j}" for j in range(40)]}.items():
        batch = _labelled([categories[j % 2] for j in range(40)], categories)
        pieces = _bundle(scatter, [(batch, 40)])  # 4 buckets: ~10 rows per piece
        assert len({piece.rpartition("#")[0] for _, piece in pieces}) == 1  # one file
        tables = [sink._read_piece(piece) for _, piece in pieces]
        assert all(isinstance(t, pa.Table) for t in tables)
        assert sum(t.num_rows for t in tables) == 40
        types[name] = {str(t.schema.field("label").type) for t in tables}
    assert all("dictionary" in t for t in types["small"]), types
    assert not any("dictionary" in t for t in types["big"]), types


def test_pieces_are_read_back_whatever_their_folder_is_called(tmp_path: Path) -> None:
    """A piece is ``<file>#<record batch>`` or a pickle's path; a "#" in the output folder
    (``run#2``) is neither misread nor lost, for Arrow and for pickled (mixed) batches."""
    folder = tmp_path / "run#2"
    folder.mkdir()
    scatter = sink._ScatterFn(str(folder), "t", ("i",))
    arrow = pd.DataFrame({"i": np.arange(40)})
    mixed = pd.DataFrame({"i": pd.Series([1, "a", 2.5, None] * 10, dtype=object)})
    for batch, kind in ((arrow, pa.Table), (mixed, pd.DataFrame)):
        pieces = _bundle(scatter, [(batch, 40 * sink.BUCKET_ROWS)])  # many buckets
        assert len(pieces) > 1
        read = [sink._read_piece(piece) for _, piece in pieces]
        assert all(isinstance(r, kind) for r in read)
        got = pd.concat([r.to_pandas() if kind is pa.Table else r for r in read])["i"]
        assert sorted(map(str, got)) == sorted(map(str, batch["i"]))


def test_a_bucket_that_fails_on_a_write_thread_fails_the_step(tmp_path: Path) -> None:
    """An error while a bucket is permuted and written (on a thread) is raised by the step,
    with the others' shards still accounted for: none is lost silently."""
    permute = sink._PermuteBucketFn(str(tmp_path), "csv", ",")
    scatter = sink._ScatterFn(str(tmp_path), "t", ("i",))
    pieces = _bundle(scatter, [(pd.DataFrame({"i": [0, 1, 2]}), 3)])
    buckets = {b: [path] for b, path in pieces}
    buckets[99] = [str(tmp_path / "missing.arrow#0")]
    with pytest.raises(FileNotFoundError):
        _permuted(permute, buckets)


@pytest.mark.parametrize("ahead", [0, 1])
def test_writes_leave_the_cores_of_searches_planned_ahead_alone(
    monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    """With two cores and no search planned ahead, buckets are written on threads; with
    one search still planning ahead in a worker, on the stage's own thread (a second
    thread beside that search only slowed it)."""
    import threading

    monkeypatch.setattr(sink, "available_cores", lambda: 2)
    monkeypatch.setattr(sink, "searching_ahead", lambda: ahead)
    assert sink.write_threads() == 2 - ahead

    class Probe(sink._OnThreads):
        def process(self, element: int) -> Any:
            yield from self._submit(lambda e: [(e, threading.current_thread().name)], element)

    out = _bundle(Probe(), [(i,) for i in range(6)])
    assert sorted(e for e, _ in out) == list(range(6))
    on_threads = {name.startswith("privpipe-write") for _, name in out}
    assert on_threads == ({False} if ahead else {True})
