"""Local DP and continual observation: throughput of the pure cores with the SECURE sources.

- Every frequency oracle: perturb (client side, OS CSPRNG) + aggregate 1M persons over a
  domain of 64 values, each protocol in a fresh process (wall time and peak RSS of the
  process; inner perturb/aggregate timings). Targets: every protocol < 10 s, GRR/OUE < 2 s.
- The tree mechanism with T = 2^20 (OpenDP discrete Laplace): one period update through the
  SQLite state store (pan-private, 1 and 64 cells), and the worst-case period T (all 21
  levels close) in memory. Target: < 1 s per update.

    python benchmarks/bench_local_dp.py [--persons 1000000] [--domain 64]

Prints one JSON object per measurement, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import machine, measure  # noqa: E402

PROTOCOLS = ("grr", "sue", "oue", "blh", "olh")
EPSILON = 1.0


def oracle_side(protocol: str, persons: int, domain: int) -> None:
    """One protocol in this process: perturb + aggregate with the secure source."""
    import numpy as np

    from privpipe.dp.local import aggregate, perturb
    from privpipe.dp.secure_random import SecureRandom

    # The population is synthetic input data (not released noise): a skewed, seeded mix.
    weights = 1.0 / np.arange(1, domain + 1)
    codes = np.random.default_rng(0).choice(domain, size=persons, p=weights / weights.sum())
    truth = np.bincount(codes, minlength=domain)
    source = SecureRandom()
    t0 = time.perf_counter()
    reports = perturb(protocol, codes, EPSILON, domain, source)
    t1 = time.perf_counter()
    est = aggregate(reports)
    t2 = time.perf_counter()
    z = (est.counts - truth) / np.sqrt(est.variance)
    print(
        json.dumps(
            {
                "perturb_s": round(t1 - t0, 3),
                "aggregate_s": round(t2 - t1, 3),
                "inner_s": round(t2 - t0, 3),
                "report_mb": round(
                    sum(
                        a.nbytes
                        for a in (reports.values, reports.bits, reports.keys)
                        if a is not None
                    )
                    / 2**20,
                    1,
                ),
                "max_abs_z": round(float(np.abs(z).max()), 2),
                "table_std": round(float(np.sqrt(est.table_variance)), 1),
            }
        )
    )


class _StreamPeriods:
    """The ledger calls the continual state needs (derive_key, stream_period, advance_stream),
    in memory: the benchmark times the state file, not the ledger."""

    def __init__(self) -> None:
        self.periods: dict[str, int] = {}

    def derive_key(self, purpose: str) -> bytes:
        return b"bench-key/" + purpose.encode()

    def stream_period(self, stream: str) -> int:
        return self.periods.get(stream, 0)

    def advance_stream(self, run_id: str, stream: str, period: int) -> None:
        self.periods[stream] = period


def tree_side() -> None:
    """T = 2^20: per-period update through the store, and the worst case in memory."""
    import numpy as np

    from privpipe.dp.continual import advance, start
    from privpipe.dp.noise import SecureSampler
    from privpipe.dp.state_store import ContinualStore

    sampler = SecureSampler()
    horizon = 2**20
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cells in (1, 64):
            path = Path(tmp) / f"state-{cells}.sqlite"
            t0 = time.perf_counter()
            store = ContinualStore.open(
                path, "bench", _StreamPeriods(), horizon, EPSILON, sampler, cells=cells,
                pan_private=True,
            )  # fmt: skip
            out[f"open_new_stream_cells{cells}_s"] = round(time.perf_counter() - t0, 4)
            times = []
            for t in range(1, 33):
                t0 = time.perf_counter()
                store.release(t, np.arange(cells), sampler, "bench")
                times.append(time.perf_counter() - t0)
            store.close()
            out[f"store_update_cells{cells}_mean_s"] = round(float(np.mean(times)), 4)
            out[f"store_update_cells{cells}_max_s"] = round(float(np.max(times)), 4)
            state = start(horizon, EPSILON, sampler, cells=cells, pan_private=True)
            state.period = horizon - 1  # pan-private: period T closes every level
            t0 = time.perf_counter()
            advance(state, horizon, np.arange(cells), sampler)
            out[f"worst_period_in_memory_cells{cells}_s"] = round(time.perf_counter() - t0, 4)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=1_000_000)
    ap.add_argument("--domain", type=int, default=64)
    ap.add_argument("--side", choices=["oracle", "tree"])
    ap.add_argument("--protocol")
    args, _ = ap.parse_known_args()  # run_all passes every benchmark the same flags
    if args.side == "oracle":
        return oracle_side(args.protocol, args.persons, args.domain)
    if args.side == "tree":
        return tree_side()
    py = sys.executable
    date = datetime.now(UTC).date().isoformat()
    oracles: dict[str, dict[str, object]] = {}
    for protocol in PROTOCOLS:
        cmd = [py, __file__, "--side", "oracle", "--protocol", protocol]
        res = measure([*cmd, "--persons", str(args.persons), "--domain", str(args.domain)])
        oracles[protocol] = res
        print(
            json.dumps(
                {
                    "benchmark": "local_dp_oracle",
                    "date": date,
                    "protocol": protocol,
                    "persons": args.persons,
                    "domain": args.domain,
                    "epsilon": EPSILON,
                    "source": "SecureRandom (os.urandom)",
                    **res,
                }
            )
        )
    tree = measure([py, __file__, "--side", "tree"])
    print(json.dumps({"benchmark": "tree_mechanism_T_2^20", "date": date, **tree}))
    targets = {
        "every_protocol_under_10s": all(float(r["inner_s"]) < 10 for r in oracles.values()),  # type: ignore[arg-type]
        "grr_oue_under_2s": all(float(oracles[p]["inner_s"]) < 2 for p in ("grr", "oue")),  # type: ignore[arg-type]
        "tree_update_under_1s": all(
            v < 1.0 for k, v in tree.items() if k.startswith(("store_update", "worst_period"))
        ),
    }
    print(
        json.dumps(
            {
                "benchmark": "local_dp_summary",
                "date": date,
                "machine": machine(),
                "inner_s": {p: r["inner_s"] for p, r in oracles.items()},
                "wall_s": {p: r["wall_s"] for p, r in oracles.items()},
                "peak_rss_mb": {p: r["peak_rss_mb"] for p, r in oracles.items()},
                "targets": targets,
            }
        )
    )


if __name__ == "__main__":
    main()
