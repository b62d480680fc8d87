"""Instrumented communication: every call adds calls, bytes and seconds to the rank's counters
(:func:`lesson_lib.metrics.counters`), by op name.

* :mod:`.p2p` — point-to-point (exact bytes), the link emulator, shared helpers
* :mod:`.ring` — our ring all-reduce, pipelined ring, reduce-scatter and all-gather
* :mod:`.rivals` — naive and halving-doubling all-reduces (bytes exact too)
* :mod:`.schedules` — who sends which chunk when, as pure functions
* :mod:`.algorithms` — ``all_reduce`` by name, the backend's included (``library``: bytes modelled)
"""

from .algorithms import ALGORITHMS, BYTES_SENT, all_reduce, formula_bytes_sent
from .p2p import Pending, exchange, link, recv, recv_any, release_buffers, send, set_link
from .ring import pipelined_ring_all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .rivals import halving_doubling_all_reduce, naive_all_reduce
from .schedules import chunk_bounds, ring_bytes_sent

__all__ = [
    "ALGORITHMS", "BYTES_SENT", "Pending", "all_reduce", "chunk_bounds", "exchange",
    "formula_bytes_sent", "halving_doubling_all_reduce", "link", "naive_all_reduce",
    "pipelined_ring_all_reduce", "recv", "recv_any", "release_buffers", "ring_all_gather", "ring_all_reduce",
    "ring_bytes_sent", "ring_reduce_scatter", "send", "set_link",
]
