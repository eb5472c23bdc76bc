"""Beam's DoFn introspection, memoised (transforms/introspection.py): the same answers as
Beam's own, asked once per function, and never a stale one."""

from __future__ import annotations

import functools
import gc
import weakref
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core, userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from privpipe.transforms import introspection

ORIGINAL = core.get_function_args_defaults.__wrapped__
COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
COUNT_STATE = beam.DoFn.StateParam(COUNT)


class Counting(beam.DoFn):
    """A stateful DoFn: a running count per key."""

    def process(self, element: Any, count: Any = COUNT_STATE) -> Any:
        seen = (count.read() or 0) + 1
        count.write(seen)
        yield element[0], seen


class Plain(beam.DoFn):
    def process(self, element: Any, label: str = "x", *rest: Any, scale: int = 2) -> Any:
        yield element


def _f(a: int, b: int = 1, *args: Any, c: int = 3, **kw: Any) -> None: ...


def _positional(a: int, /, b: int = 2) -> None: ...


@functools.wraps(_f)
def _wrapped(*args: Any, **kw: Any) -> None: ...


class _Callable:
    def __call__(self, x: int, y: int = 4) -> None: ...


CALLABLES = [
    _f,
    _positional,
    _wrapped,
    lambda x, y=beam.DoFn.TimestampParam: None,
    Plain().process,
    Counting().process,
    Plain().setup,
    functools.partial(_f, 1),
    _Callable(),
    str.strip,
    len,
    int,
]


def test_installed_when_the_transforms_are_imported() -> None:
    assert introspection.installed()
    assert core.get_function_args_defaults is not ORIGINAL


@pytest.mark.parametrize("f", CALLABLES, ids=lambda f: getattr(f, "__name__", type(f).__name__))
def test_answers_equal_beams_first_time_and_again(f: Any) -> None:
    want = ORIGINAL(f)
    assert core.get_function_args_defaults(f) == want
    assert core.get_function_args_defaults(f) == want  # from the memo, when kept


def _counting() -> tuple[list[Any], Any]:
    """The functions Beam's own introspection is asked about, and the memo asking it."""
    asked: list[Any] = []

    def ask(f: Any) -> tuple[list[str], list[Any]]:
        asked.append(f)
        return ORIGINAL(f)

    return asked, introspection.memoised(ask)


def test_each_function_is_asked_once_and_callers_get_lists_of_their_own() -> None:
    asked, answer = _counting()
    one, two = Plain(), Plain()  # two instances: the same function
    first = answer(one.process)
    first[0].append("mutated by a caller")
    assert answer(two.process) == ORIGINAL(two.process)
    assert answer(_f) == ORIGINAL(_f)
    assert answer(_f) == ORIGINAL(_f)
    assert len(asked) == 2  # Plain.process (bound) and _f


def test_a_function_whose_defaults_change_is_asked_again() -> None:
    def g(a: int, b: int = 1) -> None: ...

    answer = introspection.memoised(ORIGINAL)
    assert answer(g) == (["a", "b"], [1])
    g.__defaults__ = (beam.DoFn.StateParam(COUNT),)
    assert answer(g) == ORIGINAL(g)
    assert isinstance(answer(g)[1][0], beam.DoFn.StateParam)

    def h(x: int) -> None: ...

    g.__code__ = h.__code__
    g.__defaults__ = None
    assert answer(g) == (["x"], [])


def test_bound_and_plain_forms_of_one_function_are_kept_apart() -> None:
    answer = introspection.memoised(ORIGINAL)
    assert answer(Plain.process) == ORIGINAL(Plain.process)  # self included
    assert answer(Plain().process) == ORIGINAL(Plain().process)  # self not
    assert answer(Plain.process)[0][0] == "self"
    assert answer(Plain().process)[0][0] == "element"


def test_wrapped_functions_and_other_callables_are_always_asked() -> None:
    asked, answer = _counting()
    for f in (_wrapped, _wrapped, functools.partial(_f, 1), _Callable(), _Callable()):
        answer(f)
    assert len(asked) == 5


def test_the_memo_keeps_no_function_alive() -> None:
    answer = introspection.memoised(ORIGINAL)
    fn = (lambda: lambda x, y=2: None)()  # a function nothing else refers to
    answer(fn)
    gone = weakref.ref(fn)
    del fn
    gc.collect()
    assert gone() is None


def test_state_is_still_found_and_a_stateful_pipeline_runs() -> None:
    assert userstate.is_stateful_dofn(Counting())
    assert userstate.is_stateful_dofn(Counting())  # asked again, from the memo
    assert not userstate.is_stateful_dofn(Plain())
    specs, _ = userstate.get_dofn_specs(Counting())
    assert {s.name for s in specs} == {"count"}
    with beam.Pipeline() as p:
        out = p | beam.Create([("a", 1), ("a", 2), ("b", 3)]) | beam.ParDo(Counting())
        assert_that(out, equal_to([("a", 1), ("a", 2), ("b", 1)]))
