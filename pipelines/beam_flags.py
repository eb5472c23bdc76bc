"""Strict command lines: an option privpipe does not know must be a Beam option Beam knows.

Beam's own parser drops what it does not recognise with a warning, so a typo such as
``--ouptut /x`` used to publish into the config's ``output.dir`` and exit 0. privpipe checks
every option left over after its own parser against the options Beam registers (the
``PipelineOptions`` subclasses of the installed Beam, with the runners' that import cleanly)
and refuses anything else, naming the nearest privpipe or Beam option. Options after ``--``
go to Beam unchecked: runner-specific options of a runner not installed here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
from collections.abc import Iterable, Iterator, Sequence
from functools import cache

from privpipe.errors import ConfigError

# modules that register runner options only when imported
_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner", "privpipe.pipelines.dask_runner")


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


class _StrictParser(argparse.ArgumentParser):
    """Beam's options parsed by argparse, failing with ConfigError (exit 2), not SystemExit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"Beam option: {message}")


@cache
def beam_parser() -> argparse.ArgumentParser:
    """A parser of every pipeline option the installed Beam registers (``PipelineOptions``
    and its subclasses, with the optional runners' that import cleanly)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    for module in _OPTION_MODULES:
        try:
            importlib.import_module(module)
        except Exception:  # an optional runner that is not installed
            continue
    parser = _StrictParser(add_help=False, allow_abbrev=False, conflict_handler="resolve")
    for cls in {PipelineOptions, *_subclasses(PipelineOptions)}:
        try:
            cls._add_argparse_args(parser)  # type: ignore[attr-defined]
        except Exception:  # a third-party class that cannot register
            continue
    return parser


def check_beam_args(
    args: Sequence[str],
    own_flags: Iterable[str],
    command: str,
    parser: argparse.ArgumentParser | None = None,
) -> None:
    """Refuse (ConfigError, exit 2) anything in ``args`` that is not a Beam option with a
    valid value, naming the nearest privpipe (``own_flags``) or Beam option."""
    beam = beam_parser() if parser is None else parser
    _, unknown = beam.parse_known_args(list(args))
    for arg in unknown:
        if not arg.startswith("-"):
            raise ConfigError(
                f"{command}: unexpected argument {arg!r} (see 'privpipe {command} --help')"
            )
        flag = arg.split("=", 1)[0]
        own = sorted(own_flags)
        known = [f for action in beam._actions for f in action.option_strings]
        near = difflib.get_close_matches(flag, [*own, *known], n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ConfigError(
            f"{command}: unknown option {flag} ({hint}privpipe's options: {', '.join(own)}; "
            "Beam options are accepted by name, or pass anything to Beam after '--')"
        )


def own_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long option strings of one (sub)command's parser."""
    return [
        flag
        for action in parser._actions  # argparse exposes no public list
        for flag in action.option_strings
        if flag.startswith("--")
    ]
