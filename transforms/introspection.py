"""Beam's DoFn introspection, memoised per function: same answers, asked once.

Beam asks for the arguments of every method of a DoFn (``dir(dofn)``: ~35 methods) each
time it checks for user state, at construction, at the runner API translation and again
for the fresh copy in every bundle processor: 1,744 questions and 57,717
``inspect.signature`` calls for the demo's 223 ParDos, ~2.1 s of each run whatever its
size. The answer depends only on the function's code and defaults, so it is kept per
function (weakly: a lambda that goes also takes its entry) and re-checked against them.
Functions that carry ``__wrapped__`` or ``__signature__`` (whose signature is someone
else's), and anything that is not a plain function or a method of one, are asked every
time. Beam is pinned (pyproject.toml), so the replaced function is the one read here.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any, Final

from apache_beam.transforms import core

_Answer = tuple[list[str], list[Any]]
_MARK: Final = "_privpipe_memoised"


def _key(f: Any) -> tuple[types.FunctionType, bool] | None:
    """(plain function, bound?) whose code and defaults alone decide ``f``'s arguments."""
    func, bound = (f.__func__, True) if isinstance(f, types.MethodType) else (f, False)
    if type(func) is not types.FunctionType:
        return None
    if "__wrapped__" in func.__dict__ or "__signature__" in func.__dict__:
        return None
    return func, bound


def memoised(ask: Callable[[Any], _Answer]) -> Callable[[Any], _Answer]:
    """``ask`` (Beam's ``get_function_args_defaults``) with its answers kept per function
    and given again while the function's code and defaults are the same objects."""
    kept: tuple[weakref.WeakKeyDictionary[types.FunctionType, Any], ...] = (
        weakref.WeakKeyDictionary(),  # plain functions
        weakref.WeakKeyDictionary(),  # bound methods, by their function
    )

    def answer(f: Any) -> _Answer:
        key = _key(f)
        if key is None:
            return ask(f)
        func, bound = key
        stamp = (func.__code__, func.__defaults__, func.__kwdefaults__)
        got = kept[bound].get(func)
        if got is None or any(a is not b for a, b in zip(got[0], stamp, strict=True)):
            args, defaults = ask(f)
            got = (stamp, tuple(args), tuple(defaults))
            kept[bound][func] = got
        return list(got[1]), list(got[2])  # callers get lists of their own, as before

    setattr(answer, _MARK, True)
    answer.__wrapped__ = ask  # type: ignore[attr-defined]
    return answer


def installed() -> bool:
    """Whether Beam's ``core.get_function_args_defaults`` is the memoised form."""
    return bool(getattr(core.get_function_args_defaults, _MARK, False))


def install() -> None:
    """Replace Beam's ``core.get_function_args_defaults`` (the one its DoFn introspection
    calls) by its memoised form; once per process."""
    if not installed():
        replaced = memoised(core.get_function_args_defaults)
        core.get_function_args_defaults = replaced  # type: ignore[assignment]  # same call
