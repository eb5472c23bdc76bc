"""Beam's state-cache weights, with the loaded modules' globals collected once per change.

Beam's in-process runner keeps side inputs (and user state) in a state cache that weighs
every value it keeps with objsize. objsize leaves out every loaded module's globals, and
collects them for each value weighed: ~3,000 modules with Beam, pandas and SciPy loaded,
~4 ms a value, 61 values and ~0.25 s in each run of the demo whatever its size. The set
of module globals changes only when modules are loaded or removed, so it is kept and
collected again when ``sys.modules`` changed (its size, or its last entry). The globals
collected are held, so their ids cannot be reused by other objects while they are left
out; a module replaced in place under its name until the next change is weighed where
objsize would leave it out. The weights only steer what the cache evicts; the values it
gives back are never touched. Beam is pinned (pyproject.toml), so the replaced function
is the one read here.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Final

import objsize
from apache_beam.runners.worker import statecache
from objsize.traverse import ObjSizeSettings, TraversalContext

_MARK: Final = "_privpipe_weighs"
# Beam's get_deep_size, as it asks objsize: its size, referents and filter functions, with
# the module globals left to this module
_SETTINGS: Final = ObjSizeSettings(
    get_size_func=statecache._size_func,
    get_referents_func=statecache._get_referents_func,
    filter_func=statecache._filter_func,
    exclude_modules_globals=False,
)
_lock = threading.Lock()
# (stamp, ids, the globals themselves: held so that no other object takes one of their ids)
_globals: tuple[tuple[int, str, int], frozenset[int], tuple[object, ...]] = (
    (-1, "", 0),
    frozenset(),
    (),
)


def _stamp() -> tuple[int, str, int]:
    """What changes when a module is loaded or removed: ``sys.modules``' size and last entry
    (a module loaded again is a new object)."""
    modules = sys.modules
    try:
        last = next(reversed(modules))
        return len(modules), last, id(modules.get(last))
    except (StopIteration, RuntimeError):  # empty, or changed while read: collect again
        return -1, "", 0


def module_globals() -> frozenset[int]:
    """The ids of every loaded module's globals, as objsize collects them for each call."""
    global _globals
    stamp = _stamp()
    kept_stamp, kept, _ = _globals
    if stamp == kept_stamp and stamp[0] >= 0:
        return kept
    with _lock:
        held = tuple(objsize.traverse._iter_modules_globals())
        ids = frozenset(map(id, held))
        _globals = (stamp, ids, held)
    return ids


def get_deep_size(*objs: Any) -> int:
    """Beam's ``statecache.get_deep_size``: the same weight, module globals collected once."""
    context = TraversalContext(_SETTINGS)
    context.exclude_set.update(module_globals())
    return int(context.get_deep_size(*objs))


setattr(get_deep_size, _MARK, True)


def installed() -> bool:
    """Whether Beam's state cache weighs with :func:`get_deep_size`."""
    return bool(getattr(statecache.get_deep_size, _MARK, False))


def install() -> None:
    """Make Beam's state cache weigh values with :func:`get_deep_size`; once per process."""
    if not installed():
        get_deep_size.__wrapped__ = statecache.get_deep_size  # type: ignore[attr-defined]
        statecache.get_deep_size = get_deep_size
