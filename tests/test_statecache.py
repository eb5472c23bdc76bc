"""Beam's state cache weighs values as before, collecting the module globals once per change."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

import numpy as np
import pytest
from apache_beam.runners.worker import statecache as beam_statecache

from privpipe.transforms import statecache


class _Holder:
    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


def _beams(*objs: Any) -> int:
    """Beam's own weighing (objsize collecting the module globals on this call)."""
    return int(beam_statecache.get_deep_size.__wrapped__(*objs))


def _values() -> list[Any]:
    return [
        {"a": [1, 2, 3], "b": ("x", "yy", 3.5), "c": {"d": None}},
        np.arange(1_000, dtype=np.int64),
        ["label"] * 50 + [str(i) for i in range(50)],
        _Holder(codes=np.zeros(10), names=["p", "q"]),
        {"globals": vars(np), "own": [1, 2]},  # a module's globals: left out
        _Holder(g=vars(sys.modules[__name__])),
        "text",
        12345678901234567890,
    ]


def test_importing_the_transforms_installs_it() -> None:
    assert statecache.installed()
    assert beam_statecache.get_deep_size is statecache.get_deep_size


@pytest.mark.parametrize("index", range(len(_values())))
def test_weights_equal_beams(index: int) -> None:
    value = _values()[index]
    assert statecache.get_deep_size(value) == _beams(value)
    assert statecache.get_deep_size(value, value) == _beams(value, value)


def test_a_module_loaded_later_is_left_out_and_a_removed_one_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    statecache.get_deep_size([1])  # module globals collected before the module exists
    module = types.ModuleType("privpipe_test_loaded_later")
    module.big = list(range(1_000))
    value = {"globals": vars(module)}
    outside = statecache.get_deep_size(value)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    inside = statecache.get_deep_size(value)
    assert inside == _beams(value) < outside  # its globals are shared now: not weighed
    monkeypatch.delitem(sys.modules, module.__name__)
    assert statecache.get_deep_size(value) == _beams(value) == outside


def test_module_globals_collected_once_while_the_modules_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from objsize import traverse

    calls: list[int] = []
    collect = traverse._iter_modules_globals

    def counting() -> Any:
        calls.append(1)
        return collect()

    monkeypatch.setattr(traverse, "_iter_modules_globals", counting)
    monkeypatch.setitem(sys.modules, "privpipe_test_marker", types.ModuleType("marker"))
    for _ in range(5):
        statecache.get_deep_size({"a": [1, 2]})
    assert len(calls) == 1
    module = types.ModuleType("privpipe_test_again")
    monkeypatch.setitem(sys.modules, "privpipe_test_again", module)
    statecache.get_deep_size({"a": [1, 2]})
    assert len(calls) == 2


def test_a_module_replaced_under_its_name_is_collected_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = types.ModuleType("privpipe_test_replaced")
    monkeypatch.setitem(sys.modules, first.__name__, first)
    statecache.get_deep_size([1])
    second = types.ModuleType(first.__name__)
    second.big = list(range(1_000))
    monkeypatch.delitem(sys.modules, first.__name__)
    monkeypatch.setitem(sys.modules, first.__name__, second)  # same size, same last name
    value = {"globals": vars(second)}
    assert statecache.get_deep_size(value) == _beams(value)


def test_the_globals_left_out_are_held_so_no_other_object_takes_their_ids() -> None:
    """A module replaced in place (same size, same last entry: not collected again) frees
    its old globals; objects made next, which may take freed ids, are still weighed."""
    name, after = "privpipe_test_in_place", "privpipe_test_after"
    sys.modules[name] = types.ModuleType(name)
    sys.modules[after] = types.ModuleType(after)  # so the replaced one is not the last
    try:
        statecache.get_deep_size([1])  # collected with the first module's globals
        sys.modules[name] = types.ModuleType(name)  # the first one and its globals go
        gc.collect()
        holders = [_Holder(codes=[i, i + 1]) for i in range(1_000, 3_000)]
        weight = _beams(holders[0])
        assert [statecache.get_deep_size(h) for h in holders] == [weight] * len(holders)
    finally:
        del sys.modules[name], sys.modules[after]


def test_the_state_cache_evicts_by_its_weights() -> None:
    """A cache as large as the value's weight keeps it; one byte less, it is loaded again."""
    value = {"rows": list(range(100))}
    weight = statecache.get_deep_size(value)
    for room, kept in ((weight, True), (weight - 1, False)):
        loads: list[str] = []
        cache = beam_statecache.StateCache(room)
        for _ in range(2):
            assert cache.get("k", lambda key, seen=loads: seen.append(key) or value) is value
        assert len(loads) == (1 if kept else 2)
