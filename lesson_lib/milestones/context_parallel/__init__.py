"""Context parallelism (chapter 8): each rank holds a slice of every sequence, and attention's keys
and values travel between them.

* :mod:`.ring_attention` — ring attention (Liu et al., 2023) with an online softmax, forward pass
"""

from . import ring_attention

__all__ = ["ring_attention"]
