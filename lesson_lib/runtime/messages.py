"""The messages a worker sends its parent, one type for all of them."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Kind(str, enum.Enum):
    STARTED = "started"  # the worker process is up (torch imported), not yet in the group; data: None
    READY = "ready"  # the worker joined the process group; data: None
    BEGUN = "begun"  # the job's function is loaded (unpickled, its modules imported); data: None
    DONE = "done"    # a job returned; data: the pickled (value, restart_requested)
    ERROR = "error"  # start-up or a job raised; data: the formatted traceback
    EVENT = "event"  # ``context().emit`` during a job; data: the event dict
    EVENTS = "events"  # ``context().emit(..., batched=True)``'s, several at once; data: a list of them
    STACK = "stack"  # where the main thread is, asked for when a job overruns; data: frames
    OUTPUT = "output"  # what a rank printed; data: (stream name, text of whole lines)


class Message(NamedTuple):
    """``kind`` from ``rank`` about job ``job`` (0: start-up; None: an event)."""

    kind: Kind
    rank: int
    job: int | None
    data: Any = None
