"""Chapter 10: when machines fail and the network is slow.

* :mod:`.failures` — MTBF, goodput, Young's and Daly's checkpoint intervals, a DCP save timed
* :mod:`.task` — the small model and data every replica trains
* :mod:`.ft_step` — per-step fault tolerance written out: lighthouse, quorum, discard, heal
* the replica groups run as processes that may die while the others carry on: the runtime's
  :mod:`lesson_lib.runtime.replicas`
* :mod:`.torchft_glue` — the one place torchft is reached, held to loopback
* :mod:`.compressed` — chapter 6's compressed data parallelism on this task, beside DiLoCo
"""
