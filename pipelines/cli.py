"""The `privpipe` command.

    privpipe run CONFIG [--output DIR] [--runner NAME] [beam options...] [-- beam options...]
    privpipe validate CONFIG
    privpipe plan CONFIG [--output DIR] [--input F] [--period N] [--only NAME[,NAME]]
    privpipe tune CONFIG [--release NAME] [--output DIR]
    privpipe demo [--output DIR] [--rows N] [--seed S] [beam options...] [-- beam options...]
    privpipe schema
    privpipe budget init LEDGER --dataset ID --epsilon E [--delta D] [--key-file F | --key-env V]
    privpipe budget show|verify LEDGER [--key-file F | --key-env V] [--heads F]
    privpipe report RUN_DIR [RUN_DIR ...] [--output DIR]
    privpipe ldp aggregate REPORTS --protocol P --epsilon E --domain-size D [--domain ...]
    privpipe multiparty aggregate PARTY_FILE [PARTY_FILE ...] --output DIR [--confidence C]

Exit codes (DESIGN.md): 0 ok; 2 invalid config or arguments; 3 invalid input data;
4 privacy refusal; 130 interrupted; 143 terminated; 141 closed output pipe; 1 anything else.
Errors go to stderr as `privpipe: error: ...`. Options neither privpipe nor Beam knows are
refused (pipelines/beam_flags.py); anything after `--` goes to Beam unchecked.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import privpipe
from privpipe.errors import (
    ConfigError,
    IOFailure,
    PrivacyRefusal,
    PrivpipeError,
    io_failure,
)

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEMO_CONFIG = CONFIGS_DIR / "demo.yaml"
DEMO_ROWS = 20_000


EXIT_CODES = """exit codes:
  0    success
  1    unexpected error (a bug or the environment: disk, permissions); run with --debug
  2    invalid config or command-line arguments
  3    invalid input data
  4    privacy refusal (budget exhausted, a guarantee that does not hold, ...)
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); 141 output pipe closed
  nothing is published unless the exit code is 0"""
_BEAM_EPILOG = (
    "Beam pipeline options (e.g. --direct_num_workers=2) are passed to Beam; an option "
    "neither privpipe nor Beam knows is an error. Anything after '--' goes to Beam unchecked."
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (exit 2) instead of exiting on its own."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _parser() -> _Parser:
    p = _Parser(
        prog="privpipe",
        description="Publish sensitive microdata as anonymised "
        "tables and DP statistics, attack every output, and audit the result.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"privpipe {privpipe.__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run a config: read, publish every release, audit")
    r.add_argument("config", help="the YAML config file")
    r.add_argument("--output", help="output folder (default: the config's output.dir)")
    r.add_argument("--runner", help="Beam runner (default DirectRunner)")
    r.add_argument(
        "--insecure-seed",
        type=int,
        metavar="N",
        help="reproducible DP noise and bounding from seed N: NOT private, for tests only; "
        "recorded in the manifest and every DP release.json",
    )
    r.add_argument(
        "--period",
        type=int,
        metavar="N",
        help="the period this run publishes for every dp_continual_count (overrides period:)",
    )
    r.add_argument(
        "--input", help="input file(s) of this run (overrides input.path), e.g. one period's"
    )
    r.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help="run only these releases (and their sweeps), as if the config listed no other; "
        "public/ then holds only those of them that are published",
    )
    _output_options(r)
    r.epilog = _BEAM_EPILOG

    v = sub.add_parser("validate", help="check a config (schema and semantics); reads no data")
    v.add_argument("config")

    pl = sub.add_parser(
        "plan",
        help="dry run: every check that needs no data, what each release would cost and "
        "what would be left; charges nothing, publishes nothing",
    )
    pl.add_argument("config", help="the YAML config file")
    pl.add_argument("--output", help="output folder (default: the config's output.dir)")
    pl.add_argument("--input", help="input file(s) of the run (overrides input.path)")
    pl.add_argument("--period", type=int, metavar="N", help="as for run (continual counts)")
    pl.add_argument("--only", metavar="NAME[,NAME]", help="as for run: only these releases")

    tune_help = (
        "expected error of each DP release per contribution bound, from the data: "
        "charges nothing, publishes nothing; its output is NOT private"
    )
    t = sub.add_parser(
        "tune",
        help=tune_help,
        description=f"{tune_help[0].upper()}{tune_help[1:]}. For a grid of max_partitions x "
        "max_contributions_per_partition (x clamp bounds for sums and means) it reports the "
        "expected error (RMSE over cells) split into bounding bias, bounding sampling and "
        "noise, the share of rows and persons kept, and suggests the least error. Writes "
        "tune.json and tune.csv for the operator only.",
    )
    t.add_argument("config", help="the YAML config file")
    t.add_argument("--release", metavar="NAME", help="tune only this DP release")
    t.add_argument(
        "--output", metavar="DIR", help="folder for tune.json and tune.csv (default "
        "<output.dir>/tune; never inside public/)",
    )  # fmt: skip

    d = sub.add_parser("demo", help="generate the demo microdata and run configs/demo.yaml")
    d.add_argument("--output", default="demo-out", help="output folder (default demo-out)")
    d.add_argument("--rows", type=int, default=DEMO_ROWS, help=f"rows (default {DEMO_ROWS})")
    d.add_argument("--seed", type=int, default=20261122, help="generator seed")
    d.add_argument("--runner", help="Beam runner (default DirectRunner)")
    d.add_argument("--insecure-seed", type=int, metavar="N", help="as for run (tests only)")
    d.add_argument(
        "--data",
        metavar="CSV",
        help="reuse a demo file generated before with the same --rows and --seed instead of "
        "generating it again (benchmarks)",
    )
    _output_options(d)
    d.epilog = _BEAM_EPILOG

    rep = sub.add_parser(
        "report", help="rebuild the audit report of finished runs (compare several)"
    )
    rep.add_argument("runs", nargs="+", help="run output folders (with manifest.json)")
    rep.add_argument("--output", help="where to write (required for several runs)")

    b = sub.add_parser("budget", help="the privacy-budget ledger of a dataset")
    bsub = b.add_subparsers(dest="budget_command", required=True, parser_class=_Parser)
    init = bsub.add_parser("init", help="create a dataset's ledger with its lifetime budget")
    init.add_argument("ledger", help="the new ledger file (budget.ledger of the config)")
    init.add_argument("--dataset", required=True, help="the dataset id: the config's name")
    init.add_argument("--epsilon", required=True, help="lifetime epsilon, e.g. 10 or 1/2")
    init.add_argument("--delta", default="0", help="lifetime delta (default 0)")
    show = bsub.add_parser("show", help="print a ledger's lifetime, spend and history")
    show.add_argument("ledger", help="the ledger file (budget.ledger of the config)")
    verify = bsub.add_parser(
        "verify", help="authenticate a ledger against its key and heads record; print its head"
    )
    verify.add_argument("ledger", help="the ledger file (budget.ledger of the config)")
    for cmd in (init, show, verify):
        key = cmd.add_mutually_exclusive_group()
        key.add_argument("--key-file", help="the ledger key file (mode 0600; init creates it)")
        key.add_argument("--key-env", help="env variable holding the key (PRIVPIPE_LEDGER_KEY)")
        cmd.add_argument(
            "--heads",
            help="the heads file (default <key-file>.heads, or for an env key "
            "~/.local/state/privpipe/heads/<dataset>.json)",
        )

    ldp = sub.add_parser("ldp", help="local DP: aggregate collected reports")
    lsub = ldp.add_subparsers(dest="ldp_command", required=True, parser_class=_Parser)
    agg = lsub.add_parser(
        "aggregate", help="turn perturbed reports (reports.csv) into frequency estimates"
    )
    agg.add_argument("reports", help="reports.csv or .parquet, as written by write_reports")
    agg.add_argument("--protocol", required=True, help="rr, grr, sue, oue, blh or olh")
    agg.add_argument("--epsilon", required=True, type=float, help="the reports' local epsilon")
    agg.add_argument("--domain-size", required=True, type=int, help="d: number of values")
    agg.add_argument(
        "--domain", help="the values in code order: a file (one per line) or a comma list"
    )
    agg.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    agg.add_argument("--output", help="write the estimates CSV here (default: print)")

    mp = sub.add_parser("multiparty", help="multiparty DP: sum the parties' noisy shares")
    msub = mp.add_subparsers(dest="multiparty_command", required=True, parser_class=_Parser)
    magg = msub.add_parser(
        "aggregate", help="check every party's party.json and write the summed histogram"
    )
    magg.add_argument("parties", nargs="+", help="each party's party.json, each party once")
    magg.add_argument("--output", required=True, help="folder for data.csv and release.json")
    magg.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")

    sub.add_parser("schema", help="print the JSON Schema of the config")
    return p


def _output_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--quiet", action="store_true", help="print nothing but warnings and errors (stderr)"
    )
    cmd.add_argument(
        "--json",
        action="store_true",
        help="print one JSON summary of the run on stdout (also on failure); progress lines "
        "go to stderr",
    )
    cmd.add_argument("--verbose", action="store_true", help="show Beam's own log lines")
    cmd.add_argument(
        "--progress",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="when stderr is not a terminal, a progress line every SECONDS (default 30; 0: "
        "none); on a terminal one status line is kept up to date",
    )


class Console:
    """Where the command's progress lines go: stdout normally; stderr when stdout carries the
    JSON summary (``--json``); nowhere with ``--quiet``."""

    def __init__(self, quiet: bool = False, as_json: bool = False) -> None:
        self.quiet, self.as_json = quiet, as_json

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr if self.as_json else sys.stdout, flush=True)


_console = Console()


def say(message: str) -> None:
    """A progress line of the running command (see :class:`Console`)."""
    _console.say(message)


class _DropBeamImportNoise(logging.Filter):
    """Beam warns on import about optional client libraries privpipe does not use (GCP's,
    on the root logger; MongoDB's when :func:`skip_unused_connectors` skipped them)."""

    NOISE = ("apitools not found", "compatible bson")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in self.NOISE)


class _DropReportedErrors(logging.Filter):
    """A DoFn's privpipe error is reported once, by main(), not also as Beam's traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, PrivpipeError) and "privpipe.errors." not in record.getMessage()


INTERRUPTED, TERMINATED = 130, 143  # the exit codes of Ctrl-C and SIGTERM
STRANDED_WAIT_S = 5.0  # how long an interrupted run waits for threads it left behind


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger().addFilter(_DropBeamImportNoise())
    for name in ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker"):
        logging.getLogger(name).addFilter(_DropReportedErrors())
    args_in = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_in
    own = args_in[: args_in.index("--")] if "--" in args_in else args_in
    as_json = "--json" in own and bool({"run", "demo"} & set(own))
    previous = _on_sigterm()
    global _console
    _console = Console(quiet="--quiet" in own, as_json=as_json)
    try:
        return _dispatch(args_in)
    except Terminated:
        return _failed(TERMINATED, "terminated (SIGTERM); nothing was published", as_json)
    except PrivpipeError as e:
        return _failed(e.exit_code, f"error: {e}", as_json)
    except KeyboardInterrupt:
        return _failed(INTERRUPTED, "interrupted; nothing was published", as_json)
    except BrokenPipeError:  # `privpipe schema | head`: the reader has what it wanted
        _silence_stdout()
        return 141
    except Exception as e:  # anything unexpected: exit 1, no partial output (RunOutput aborts)
        if debug:
            traceback.print_exc()
        failure = io_failure(e)  # disk full, I/O error, sqlite: the path and the fix
        if failure is not None:
            return _failed(failure.exit_code, f"error: {failure}", as_json)
        return _failed(
            1,
            f"error: unexpected {type(e).__name__}: {e} "
            "(run with --debug for the traceback); nothing was published",
            as_json,
        )
    finally:
        _console = Console()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _failed(code: int, message: str, as_json: bool) -> int:
    """Report a failure on stderr (and as the JSON summary on stdout with ``--json``)."""
    print(f"privpipe: {message}", file=sys.stderr)
    if as_json:
        summary = {"status": "failed", "exit_code": code, "error": message}
        print(json.dumps(summary), flush=True)
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush into the closed pipe
    raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so every ``finally`` runs (the staging
    and the private scratch folder are deleted; nothing is published)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _on_sigterm() -> Any:
    """Turn SIGTERM into :class:`Terminated` (main thread only); returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _dispatch(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    else:
        passthrough = []
    parser = _parser()
    args, beam_args = parser.parse_known_args(argv)
    beam_args = [a for a in beam_args if a != "--debug"]
    if args.command in ("run", "demo") and beam_args:
        from privpipe.pipelines.beam_flags import check_beam_args, own_flags

        check_beam_args(beam_args, own_flags(_subparser(parser, args.command)), args.command)
    beam_args += passthrough
    if args.command in ("run", "demo"):
        if not args.progress >= 0:
            raise ConfigError(f"--progress: seconds must be >= 0 (0: none), got {args.progress}")
        _beam_logging(verbose=args.verbose)
    if args.command == "schema":
        from privpipe.pipelines.config import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command == "plan":
        if beam_args:
            raise ConfigError(f"plan takes no other options, got {' '.join(beam_args)}")
        return _plan(args.config, args.output, args.input, args.period, _names(args.only))
    if args.command == "validate":
        if beam_args:
            raise ConfigError(f"validate takes no other options, got {' '.join(beam_args)}")
        return _validate(args.config)
    if args.command == "tune":
        if beam_args:
            raise ConfigError(f"tune takes no other options, got {' '.join(beam_args)}")
        from privpipe.pipelines.plan import load_plan
        from privpipe.pipelines.tune import tune

        tune(load_plan(args.config), args.release, args.output)
        return 0
    if args.command == "run":
        return _run(
            args.config, args.output, args.runner, beam_args, input_override=args.input,
            seed=args.insecure_seed, period=args.period, as_json=args.json, every=args.progress,
            only=_names(args.only),
        )  # fmt: skip
    if args.command == "ldp":
        if beam_args:
            raise ConfigError(f"ldp aggregate takes no other options, got {' '.join(beam_args)}")
        return _ldp_aggregate(args)
    if args.command == "multiparty":
        if beam_args:
            raise ConfigError(
                f"multiparty aggregate takes no other options, got {' '.join(beam_args)}"
            )
        return _multiparty_aggregate(args)
    if args.command == "demo":
        return _demo(
            args.output, args.rows, args.seed, args.runner, beam_args, args.insecure_seed,
            args.data, as_json=args.json, every=args.progress,
        )  # fmt: skip
    if args.command == "report":
        from privpipe.pipelines.audit import rebuild

        if beam_args:
            raise ConfigError(f"report takes no other options, got {' '.join(beam_args)}")
        out = rebuild([Path(r) for r in args.runs], Path(args.output) if args.output else None)
        print(f"privpipe: report: {out}")
        return 0
    if args.command == "budget":
        if beam_args:
            raise ConfigError(
                f"budget {args.budget_command} takes no other options, got {' '.join(beam_args)}"
            )
        if args.budget_command == "init":
            return _budget_init(args)
        return _budget_show(args.ledger, args, verify=args.budget_command == "verify")
    raise ConfigError(f"unknown command {args.command!r}")  # pragma: no cover


def _beam_logging(verbose: bool) -> None:
    """Beam's own log lines (INFO progress of its runners, worker chatter) only with
    ``--verbose``; its errors always."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("apache_beam").setLevel(logging.INFO)
    else:
        logging.getLogger("apache_beam").setLevel(logging.ERROR)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``."""
    for action in parser._actions:  # argparse exposes no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise KeyError(name)  # pragma: no cover


def _validate(config: str) -> int:
    from privpipe.pipelines.dp_release import dp_jobs
    from privpipe.pipelines.hierarchies import check_static
    from privpipe.pipelines.local_release import local_jobs
    from privpipe.pipelines.plan import load_plan

    plan = load_plan(config)
    check_static(plan.config, plan.hierarchies, Path(config).name)  # builders, levels
    dp_jobs(plan)  # DP parameters that need the plan (budget split, noise scales)
    from privpipe.pipelines.publication import check_private_paths

    check_private_paths(plan)  # the ledger and scratch folder outside public/ and internal/
    local_jobs(plan)  # local DP oracles and domains
    for path in plan.input_paths:  # the data is not read, but it must be there
        if "://" not in path and not Path(path).is_file():
            from privpipe.errors import InputDataError

            what = "is not a file" if Path(path).exists() else "not found"
            raise InputDataError(
                f"{Path(config).name}: input.path: {path}: input file {what}; check input.path "
                "(relative paths resolve against the config file's folder)"
            )
    c = plan.config
    print(
        f"{Path(config).name}: valid: dataset {c.name!r}, {len(plan.input_paths)} input "
        f"file(s) ({plan.input_format}), {len(c.schema_.quasi_identifiers)} quasi-identifiers, "
        f"{len(c.hierarchies)} hierarchies, {len(c.releases)} release(s); output "
        f"{plan.output_dir}"
    )
    return 0


def _names(given: str | None) -> list[str] | None:
    """``--only a,b`` -> ["a", "b"] (None without the flag)."""
    if given is None:
        return None
    names = [n.strip() for n in given.split(",") if n.strip()]
    if not names:
        raise ConfigError("--only: give release names, e.g. --only k5,l3")
    return names


def _plan(
    config: str,
    output: str | None,
    input_override: str | None,
    period: int | None,
    only: list[str] | None = None,
) -> int:
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.preflight import budget_plan

    if period is not None and period < 1:
        raise ConfigError(f"--period: periods are numbered from 1, got {period}")
    plan = load_plan(
        config, output_dir=output, input_override=input_override, period_override=period, only=only
    )
    result = budget_plan(plan)
    name = Path(config).name
    print(
        f"privpipe: plan for {name} (dataset {plan.name!r}): checked without reading data "
        "(headers only); nothing charged, nothing published"
    )
    width = max([len("release"), *(len(c.release) for c in result["costs"])])
    print(f"  {'release':<{width}}  {'kind':<20}  {'ledger':<16}  {'epsilon':>9}  {'delta':>9}")
    for c in result["costs"]:
        eps, dlt = (
            ("-", "-") if c.ledger == "-" else (f"{float(c.epsilon):g}", f"{float(c.delta):g}")
        )
        note = f"  ({c.note})" if c.note else ""
        print(f"  {c.release:<{width}}  {c.kind:<20}  {c.ledger:<16}  {eps:>9}  {dlt:>9}{note}")
    for which, st in result["ledgers"].items():
        (le, ld), (se, sd) = st["lifetime"], st["spent"]
        (te, td), (ae, ad) = st["this_run"], st["left_after"]
        print(
            f"privpipe: {which} ledger {st['path']}: lifetime epsilon {float(le):g}, delta "
            f"{float(ld):g}; spent {float(se):g}, {float(sd):g}; this run {float(te):g}, "
            f"{float(td):g}; left after it {float(ae):g}, {float(ad):g}"
        )
    if not any(c.ledger not in ("-",) for c in result["costs"]):
        print("privpipe: no DP release: no budget is spent")
    if not result["affordable"]:
        raise PrivacyRefusal(f"{name}: the run would be refused: {result['refusal']}")
    given = [
        ("--output", output),
        ("--input", input_override),
        ("--period", period),
        ("--only", ",".join(only) if only else None),
    ]
    command = " ".join([f"privpipe run {config}", *(f"{k} {v}" for k, v in given if v)])
    print(f"privpipe: {name}: the run fits; `{command}` would spend as above")
    return 0


def _run(
    config: str,
    output: str | None,
    runner: str | None,
    beam_args: list[str],
    input_override: str | None = None,
    seed: int | None = None,
    ledger_override: str | None = None,
    period: int | None = None,
    key_file_override: str | None = None,
    as_json: bool = False,
    every: float = 30.0,
    only: list[str] | None = None,
) -> int:
    with _collector_paused():
        from privpipe.pipelines.plan import load_plan
        from privpipe.pipelines.run import run
        from privpipe.timing import slowest

    if period is not None and period < 1:
        raise ConfigError(f"--period: periods are numbered from 1, got {period}")
    plan = load_plan(
        config,
        output_dir=output,
        input_override=input_override,
        ledger_override=ledger_override,
        period_override=period,
        key_file_override=key_file_override,
        only=only,
    )
    if only is not None:
        say(
            f"privpipe: --only {','.join(only)}: the other releases of the config are not run, "
            f"not charged and not published; public/ holds "
            f"{', '.join(plan.config.published()) or 'no release'} of this run only"
        )
    if seed is not None:
        print(
            f"privpipe: WARNING: --insecure-seed {seed}: DP noise is reproducible and NOT "
            "private; the manifest records it. Never publish this output.",
            file=sys.stderr,
        )
    try:
        with _progress(every):
            result = run(plan, beam_args=beam_args, runner=runner, insecure_seed=seed, log=say)
    except sqlite3.OperationalError as e:  # the ledger's disk is full or read-only (faults)
        raise IOFailure(
            f"{plan.ledger_path}: the privacy ledger could not be written ({e}); free disk "
            "space or fix the permissions of its folder and run again (nothing was published)"
        ) from e
    m = result.manifest
    prof = m["profile"]
    combos = prof["qi_combinations"]
    say(
        f"privpipe: {m['rows_accepted']:,} rows accepted, {m['rows_rejected']:,} rejected; "
        f"{combos['distinct']:,} distinct QI combinations, "
        f"{combos['unique_share_of_rows']:.1%} of rows unique on their QIs"
        + (
            f", {combos['unique_share_of_persons']:.1%} of persons"
            if "unique_share_of_persons" in combos
            else ""
        )
    )
    for name, summary in m["release_summaries"].items():
        claimed = summary["guarantee"]
        g = (
            ", ".join(f"{k}={v}" for k, v in claimed.items() if not isinstance(v, dict))
            if isinstance(claimed, dict)
            else f"guarantee {claimed}"
        )
        check = "verified" if summary["verified"] else "NOT verified"
        where = "public" if name in (m.get("published") or []) else "internal/candidates"
        say(f"privpipe:   {where}/{name}: {summary['kind']} ({g}), {check}")
    if m.get("attacks"):
        base = m["attacks"].get("raw", {})
        for name, rates in m["attacks"].items():
            shown = ", ".join(
                f"{a} {v:.1%}" + (f" (raw {base[a]:.1%})" if name != "raw" and a in base else "")
                for a, v in rates.items()
            )
            say(f"privpipe:   attacks on {name}: {shown or 'none applicable'}")
    if m.get("budget"):
        b = m["budget"]
        say(
            f"privpipe: privacy budget: spent epsilon {b['spent']['epsilon']:g} of "
            f"{b['lifetime']['epsilon']:g}, {b['remaining']['epsilon']:g} left ({b['ledger']})"
        )
    published = m.get("published") or []
    say(
        f"privpipe: published: {', '.join(published)} in {result.output_dir / 'public'}"
        if published
        else f"privpipe: nothing published: {len(m['releases'])} candidates compared; add "
        "publish: [...] to the config to publish some"
        if m["releases"]
        else "privpipe: nothing published: the config has no releases"
    )
    if m.get("timings"):
        say(f"privpipe: slowest stages: {slowest(m['timings']['stages'])}")
    say(
        f"privpipe: run finished in {m['seconds']:.1f}s; operator files (manifest, audit, "
        f"candidates) in {result.output_dir / 'internal'}"
    )
    if m.get("report"):
        say(f"privpipe: report: {result.output_dir / m['report']} (audit.json, report.md)")
    if as_json:
        print(json.dumps(run_summary(m, result.output_dir), default=str), flush=True)
    return 0


@contextmanager
def _progress(every: float) -> Iterator[None]:
    """Report the run's progress while the block runs (privpipe/progress.py): a status line
    on a terminal, plain lines every ``every`` seconds otherwise; nothing with --quiet."""
    from privpipe import progress

    progress.reset()
    tty = sys.stderr if sys.stderr.isatty() and not _console.quiet else None
    reporter = progress.Reporter(say, tty, 0.0 if _console.quiet else every).start()
    try:
        yield
    finally:
        reporter.stop()


def run_summary(manifest: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """The machine-readable summary of a finished run (``--json``), for schedulers: what was
    published and verified, the budget, the attack rates and where everything is."""
    m = manifest
    published = list(m.get("published") or [])
    return {
        "status": m.get("status", "succeeded"),
        "exit_code": 0,
        "run_id": m.get("run_id"),
        "dataset": m.get("name"),
        "output_dir": str(output_dir),
        "public_dir": str(output_dir / "public"),
        "report": str(output_dir / m["report"]) if m.get("report") else None,
        "rows": {k: m.get(f"rows_{k}") for k in ("read", "accepted", "rejected")},
        "releases": {
            name: {
                "kind": s["kind"],
                "guarantee": s["guarantee"],
                "verified": s["verified"],
                "published": name in published,
            }
            for name, s in (m.get("release_summaries") or {}).items()
        },
        "published": published,
        "attacks": m.get("attacks"),
        "budget": m.get("budget"),
        "insecure_seed": m.get("insecure_seed"),
        "seconds": m.get("seconds"),
    }


def _budget_init(args: argparse.Namespace) -> int:
    from privpipe.dp.budget import ApproxBudget, to_fraction
    from privpipe.dp.ledger import Ledger
    from privpipe.dp.ledger_auth import load_key, new_key_file

    eps, dlt = to_fraction(args.epsilon, "--epsilon"), to_fraction(args.delta, "--delta")
    if eps <= 0 or not 0 <= dlt < 1:
        raise ConfigError(f"--epsilon must be > 0 and --delta in [0, 1), got {eps}, {dlt}")
    lifetime = ApproxBudget(eps, dlt)
    if args.key_file and not Path(args.key_file).expanduser().exists():
        new_key_file(Path(args.key_file).expanduser())
        print(
            f"privpipe: created the ledger key file {args.key_file} (mode 0600): keep it "
            "with the job user only, and never beside copies of the ledger"
        )
    key = load_key(args.dataset, args.key_file, args.key_env, args.heads)
    path = Ledger.create(args.ledger, args.dataset, lifetime, key)
    print(
        f"privpipe: created the ledger {path} of dataset {args.dataset!r}: lifetime epsilon "
        f"{args.epsilon}, delta {args.delta}; key from {key.source}; heads in {key.heads}"
    )
    return 0


def _budget_show(path: str, args: argparse.Namespace, verify: bool = False) -> int:
    from privpipe.dp.ledger import Ledger

    with Ledger.inspect(path, args.key_file, args.key_env, args.heads) as ledger:
        entries = ledger.history()
        spent, left = ledger.spent(), ledger.remaining()
        life = ledger.lifetime
        head = ledger.head()
        if verify:
            print(
                f"ledger {ledger.path}: OK (authenticated with the key from "
                f"{ledger.key.source}; head matches {ledger.key.heads})"
            )
            print(f"dataset {ledger.dataset!r}")
            print(f"head {head['entries']} entries, chain MAC {head['mac']}")
            return 0
        events = ledger.spent("event")
        print(f"ledger {ledger.path}")
        print(f"dataset {ledger.dataset!r}")
        print(f"lifetime epsilon {float(life.epsilon):g}, delta {float(life.delta):g}")
        print(f"spent    epsilon {float(spent.epsilon):g}, delta {float(spent.delta):g}")
        print(f"left     epsilon {float(left.epsilon):g}, delta {float(left.delta):g}")
        if events.epsilon or events.delta:
            print(
                f"event-level (not counted above): epsilon {float(events.epsilon):g}, "
                f"delta {float(events.delta):g}"
            )
        print(f"head     {head['entries']} entries, chain MAC {head['mac'][:16]}...")
        print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}:")
        print(f"{'id':>4}  {'created (UTC)':<26}  {'run':<26}  {'release':<16}  "
              f"{'epsilon':>9}  {'delta':>9}  {'unit':<6}  status")  # fmt: skip
        for e in entries:
            if e.kind == "stream":
                print(
                    f"{e.id:>4}  {e.created_at[:26]:<26}  {e.run_id:<26}  {e.release:<16}  "
                    f"published period {e.period}"
                )
                continue
            line = (
                f"{e.id:>4}  {e.created_at[:26]:<26}  {e.run_id:<26}  {e.release:<16}  "
                f"{float(e.epsilon):>9.4g}  {float(e.delta):>9.3g}  {e.unit:<6}  {e.status}"
            )
            print(line + (f" ({e.reason})" if e.reason else ""))
    return 0


def _ldp_aggregate(args: argparse.Namespace) -> int:
    from privpipe.pipelines.ldp_aggregate import aggregate_reports

    table = aggregate_reports(
        args.reports, args.protocol, args.epsilon, args.domain_size, args.domain, args.confidence
    )
    if args.output:
        out = Path(args.output)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(out, index=False)
        except OSError as e:
            raise ConfigError(f"--output {out}: cannot write ({e.strerror})") from None
        print(f"privpipe: {len(table)} estimates written to {out}", file=sys.stderr)
    else:
        sys.stdout.write(table.to_csv(index=False))
    return 0


def _multiparty_aggregate(args: argparse.Namespace) -> int:
    from privpipe.pipelines.multiparty import aggregate_parties

    doc = aggregate_parties(args.parties, args.output, args.confidence)
    g = doc["guarantee"]
    print(
        f"privpipe: multiparty {doc['name']}: {g['parties']} parties summed "
        f"(epsilon {g['epsilon']:g}, {g['neighbours']} of one {g['unit']}) -> {args.output}"
    )
    return 0


def _demo(
    output: str,
    rows: int,
    seed: int,
    runner: str | None,
    beam_args: list[str],
    insecure_seed: int | None = None,
    reuse: str | None = None,
    as_json: bool = False,
    every: float = 30.0,
) -> int:
    import yaml

    from privpipe.pipelines.demo_config import DEMO_SMALL_ROWS, demo_config_for, fewest_rows
    from privpipe.pipelines.demo_data import write_csv

    if rows < 1:
        raise ConfigError(f"--rows must be a positive integer, got {rows}")
    fewest = fewest_rows(yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8")))
    if rows < fewest:  # known before any data: k persons need at least k rows
        raise ConfigError(
            f"--rows {rows}: the demo's k-anonymous tables need at least {fewest} persons "
            f"(k={fewest}) and the demo has at most one person per row; use --rows "
            f"{DEMO_SMALL_ROWS} or more"
        )
    out = Path(output).resolve()
    if reuse is not None:
        data = Path(reuse).resolve()
        if not data.is_file():
            raise ConfigError(f"--data {reuse}: no such file; drop --data to generate it")
        say(f"privpipe: reusing the demo rows in {data} (--rows {rows:,}, --seed {seed})")
    else:
        try:
            data = write_csv(out / "input" / "demo.csv", rows, seed=seed)
        except OSError as e:
            raise ConfigError(
                f"{out}: cannot write the demo input ({e.strerror}); "
                "choose another folder with --output"
            ) from None
        say(f"privpipe: generated {rows:,} demo rows (seed {seed}) in {data}")
    ledger, key = demo_ledger(out / "budget")
    # size-dependent parameters (max_units, deltas, attack targets) from N, never the data
    config, changes = demo_config_for(DEMO_CONFIG, out / "input" / "demo.yaml", rows)
    if changes:
        say(f"privpipe: the demo config fitted to {rows:,} rows ({config}): {'; '.join(changes)}")
    try:
        return _run(
            str(config),
            str(out),
            runner,
            beam_args,
            input_override=str(data),
            seed=insecure_seed,
            ledger_override=str(ledger),
            key_file_override=str(key),
            as_json=as_json,
            every=every,
        )
    except PrivacyRefusal as e:
        if rows >= DEMO_SMALL_ROWS:
            raise
        raise PrivacyRefusal(
            f"{e} (privpipe demo: {rows:,} rows are too few persons for the demo config; "
            f"use --rows {DEMO_SMALL_ROWS} or more)"
        ) from None


def demo_ledger(folder: Path) -> tuple[Path, Path]:
    """A fresh ledger, key and heads file for the demo in ``folder``.

    Freshly generated data is a new dataset version, so the demo deliberately starts a new
    lifetime with a new key. Fine for a demo only: a real job keeps its key and heads file
    away from the ledger (README, 'Privacy budget ledger').
    """
    import yaml

    from privpipe.dp.budget import ApproxBudget, to_fraction
    from privpipe.dp.ledger import Ledger
    from privpipe.dp.ledger_auth import load_key, new_key_file

    cfg = yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8"))
    budget, name = cfg["budget"], str(cfg["name"])
    ledger, key_file = folder / "ledger.sqlite", folder / "ledger.key"
    stale = [ledger, key_file, *folder.glob("ledger.*"), *folder.glob("demo.*.continual.sqlite")]
    for old in stale:  # the demo's streams start over too
        old.unlink(missing_ok=True)
    new_key_file(key_file)
    lifetime = ApproxBudget(
        to_fraction(budget["lifetime_epsilon"], "budget.lifetime_epsilon"),
        to_fraction(budget.get("lifetime_delta", 0), "budget.lifetime_delta"),
    )
    Ledger.create(ledger, name, lifetime, load_key(name, key_file))
    say(f"privpipe: created a fresh demo ledger {ledger} (key {key_file}, demo only)")
    return ledger, key_file


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The first import of the pipeline's libraries (Beam, pandas, pyarrow, pydantic) with
    the cyclic garbage collector paused, then what is alive frozen (``gc.freeze``): the
    collections would walk the libraries' fresh objects, none of them garbage, during the
    imports (three full ones, ~0.2 s) and again in every later collection. Once per
    process: nothing is paused once they are imported (a second run in the same process)
    or when the collector is off."""
    if "privpipe.pipelines.run" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


UNUSED_CONNECTOR_LIBRARIES = ("bson", "pymongo")
"""Client libraries Beam imports at start-up for an IO connector privpipe never uses
(MongoDB); ``import apache_beam`` loads them whether or not a pipeline reads MongoDB."""


def skip_unused_connectors() -> None:
    """In the ``privpipe`` command's own process, before Beam is imported: mark
    ``UNUSED_CONNECTOR_LIBRARIES`` absent, so Beam takes its own path for a missing
    client library (the connector's names stay defined; using it would fail) and its
    warning about that path is dropped. 0.3–0.5 s of every run's start-up on this
    machine. Not for callers in the same process (notebooks, tests): they keep them."""
    for name in UNUSED_CONNECTOR_LIBRARIES:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # "not installed"
    logging.getLogger("apache_beam.io.mongodbio").addFilter(_DropBeamImportNoise())


LAZY_HTTP_LIBRARIES = ("httplib2", "requests")
"""HTTP client libraries ``import apache_beam`` loads for what a local run never does
(Beam's artifact stager, GCE metadata): loaded when first used instead."""


def lazy_http_libraries() -> None:
    """In the ``privpipe`` command's own process, before Beam is imported: each of the
    ``LAZY_HTTP_LIBRARIES`` that is installed is registered unexecuted (``_OnFirstUse``):
    its code runs when one of its names is first used, so a run that never opens an HTTP
    connection does not build httplib2's pyparsing grammar or load requests' stack (~0.07
    s of every run's start-up on this machine). ``importlib.util.LazyLoader`` cannot do
    this on Python 3.11: the ``import`` statement's own look at ``__spec__`` loads it. Not
    for callers in the same process (notebooks, tests): they keep the libraries as loaded."""
    for name in LAZY_HTTP_LIBRARIES:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _OnFirstUse
        sys.modules[name] = module


class _OnFirstUse(types.ModuleType):
    """A module registered with its spec but not run: the first name looked up that it
    does not have yet runs it, in place (under a lock: once, whichever thread asks)."""

    _lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        with _OnFirstUse._lock:
            if type(self) is _OnFirstUse:
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                object.__setattr__(self, "__class__", types.ModuleType)
                try:
                    spec.loader.exec_module(self)
                except BaseException:  # as a failed import: not left half-run
                    sys.modules.pop(self.__name__, None)
                    raise
        return object.__getattribute__(self, name)


HUGEPAGE_SETTING = "NUMPY_MADVISE_HUGEPAGE"
"""numpy's switch for asking the kernel for transparent huge pages on large arrays."""


def no_huge_page_stalls() -> None:
    """In the ``privpipe`` command's own process, before numpy is imported, and so in every
    worker process it starts (they inherit the environment): numpy allocates its large
    arrays without ``madvise(MADV_HUGEPAGE)`` (``NUMPY_MADVISE_HUGEPAGE=0``) unless the
    user set that variable. Where transparent huge pages are in ``madvise`` mode (this
    project's VM) that request puts a run's large arrays on 2 MB pages: a few hundred
    huge-page faults per 1M-row run, each far costlier here than clearing 2 MB. Measured
    on the 1M-row k=5 run: system time 2.39 -> 1.37 s and wall 7.28 -> 6.20 s in three
    ABBA rounds, though at other moments only 0.1-0.2 s (RESULTS.md, thirty-seventh
    round). Not for callers in the same process (tests, notebooks): numpy is imported
    there already."""
    os.environ.setdefault(HUGEPAGE_SETTING, "0")


def entry() -> None:
    """The ``privpipe`` command: :func:`main`, then exit without the interpreter's last
    cyclic garbage collection (:func:`_quick_exit`); Beam's unused MongoDB connector's
    libraries are skipped (:func:`skip_unused_connectors`), its HTTP clients loaded only
    if used (:func:`lazy_http_libraries`), numpy's huge-page requests skipped too
    (:func:`no_huge_page_stalls`)."""
    no_huge_page_stalls()
    skip_unused_connectors()
    lazy_http_libraries()
    code = main()
    _quick_exit()
    if code in (INTERRUPTED, TERMINATED):
        _exit_without_stranded_threads(code)
    sys.exit(code)


def _exit_without_stranded_threads(code: int) -> None:
    """Exit an interrupted or terminated run even if a library's thread is still running.

    Ctrl-C and SIGTERM raise in the main thread wherever it is; every ``finally`` of the
    run has cleaned up by now (nothing published, the scratch folder gone), but the
    exception can land inside a library's own start-up of a thread, as in Beam's state
    sampler (``statesampler.StateSampler.start``: the thread is running before it is
    marked started, so nothing ever stops it). The interpreter would then wait for that
    non-daemon thread forever (about one SIGTERM in ten in the test of it hung). Threads
    get ``STRANDED_WAIT_S`` to end; if any remains, the process ends without waiting."""
    deadline = time.monotonic() + STRANDED_WAIT_S
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.current_thread()
    ):
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _quick_exit() -> None:
    """Before the process exits: flush the streams and freeze the garbage collector, so
    the interpreter's final collection does not walk every object Beam, pandas and the
    run left behind (0.4 s of a 4 s DP run at 1M rows, more on larger runs). Module
    teardown, atexit handlers and finalizers still run. Only for the process's own exit:
    the run's files are all closed and committed by then (``main`` returned), and a
    caller in the same process (tests, notebooks) keeps its collector."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    entry()
