"""Instrumented communication: point-to-point, collectives, and our own ring all-reduce.

Every call made through this package adds to the calling rank's counters
(:func:`lesson_lib.metrics.counters`): calls, bytes sent, bytes received and seconds, by op name.

* :mod:`.p2p` — point-to-point (exact bytes: those of the tensors handed to the wire), the link
  emulator of chapter 6, and what the collectives built by hand share.
* :mod:`.ring` — ``ring_all_reduce``, the pipelined ring and the ring's two phases alone.
* :mod:`.rivals` — ``naive_all_reduce`` (reduce-to-one + broadcast) and
  ``halving_doubling_all_reduce``, built from point-to-point calls like the ring: bytes exact too.
* :mod:`.schedules` — who sends which chunk when, as pure functions: drives the code and the animation.
* :mod:`.algorithms` — ``all_reduce`` by name, with the backend's own (``library``: bytes modelled).

Used by chapter 0 (data parallel) and chapter 2 (ring all-reduce) onwards.
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
