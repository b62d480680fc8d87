"""Jobs as bytes: a function and its arguments, by reference when importable, else by value.

A spawned worker cannot import a function defined in a notebook cell, so such functions (and
lambdas, closures) travel by value, pickled by cloudpickle, with their cell's source lines so
that a traceback from a worker shows the learner's own code.
"""

from __future__ import annotations

import collections
import importlib
import io
import linecache
import os
import pickle
import sys
import types
from typing import Any, Callable

import cloudpickle


def importable(fn: Callable) -> bool:
    """True when a spawned worker can import ``fn`` by module and name (then it goes by reference)."""
    name, module = getattr(fn, "__qualname__", ""), getattr(fn, "__module__", None)
    if module in (None, "__main__", "__mp_main__") or "<locals>" in name or "<lambda>" in name:
        return False
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return False
    return obj is fn


def cell_sources() -> dict[str, list[str]]:
    """Source lines of code that exists only in this process's memory (notebook cells).

    IPython keeps each executed cell in ``linecache`` under a file name that does not exist on
    disk; a worker that has these lines prints them in its tracebacks.
    """
    out = {}
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[2] and not name.startswith("<frozen") and not os.path.exists(name):
            out[name] = entry[2]
    return out


def install_sources(lines: dict[str, list[str]]) -> None:
    """In a worker: make the cells' lines available to tracebacks (the inverse of cell_sources)."""
    for name, text in lines.items():
        linecache.cache[name] = (sum(map(len, text)), None, text, name)


def _code_reduce_keep_filename(code: types.CodeType):
    ctor, args = cloudpickle.cloudpickle._code_reduce(code)
    return ctor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, keeping each code object's file name.

    cloudpickle 3.1 writes ``<dynamic-code>`` instead (for deterministic payloads); we keep the
    cell's name, so that a worker's traceback can say 'Cell In[7], line 3' and quote the line.
    """

    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce_keep_filename},
                                          cloudpickle.Pickler.dispatch_table)

    def reducer_override(self, obj):
        # Module objects of a ModuleType subclass (torch.classes, torch.ops) are not in cloudpickle's
        # table, which matches exact types; a cell function whose code merely names `.classes`
        # drags them in. An imported module travels by name.
        if isinstance(obj, types.ModuleType) and sys.modules.get(obj.__name__) is obj:
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pack_job(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> bytes:
    """The bytes a worker needs to run ``fn(*args, **kwargs)`` (see :func:`unpack_job`).

    Importable functions go by reference; functions defined in a notebook cell, ``__main__``,
    lambdas and closures go by value (cloudpickle), with the cells' source lines.
    """
    if not callable(fn):
        raise TypeError(f"Cluster.run needs a function to run on every rank, got {fn!r}")
    # a cell's lines travel with any function of a cell: the job's, or one passed to it (a checker
    # runs the learner's function on the ranks), so that the rank's traceback quotes them
    cells = [f for f in (fn, *args, *(kwargs or {}).values()) if callable(f) and not isinstance(f, type)]
    lines = cell_sources() if any(not importable(f) for f in cells) else {}
    try:
        return dumps((fn, tuple(args), dict(kwargs or {}), lines))
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{name} or its arguments cannot be sent to the workers: {e}. Everything a "
                        "worker needs must be picklable: pass tensors, numbers, lists and "
                        "functions, not clusters, locks, open files or widgets.") from e


def unpack_job(payload: bytes) -> tuple[Callable, tuple, dict]:
    """In a worker: ``fn, args, kwargs`` from :func:`pack_job`'s bytes, the cells' lines installed."""
    fn, args, kwargs, lines = pickle.loads(payload)
    install_sources(lines)
    return fn, args, kwargs
