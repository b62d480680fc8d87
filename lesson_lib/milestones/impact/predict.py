"""The cost model fed this machine's measurements (chapter 7): each milestone's predicted seconds per
step, compute and communication, from the α, β and FLOP/s the impact experiment probes.
"""

from __future__ import annotations

import math

from ... import comm, costmodel
from ...models import mlp, mlp_param_count


def predict(name: str, sub, probe: dict) -> dict:
    """Seconds per step the cost model predicts for milestone ``name`` on this machine, split into
    compute (6·Ψ per sample at the measured FLOP/s) and communication (the measured α and β in the
    chapters' formulas; float32 gradients: 4 bytes per parameter)."""
    a, b, x = probe["alpha_s"], probe["beta_s_per_byte"], probe["flops"]
    n, batch = sub.world_size, sub.global_batch
    if name.startswith("compression"):
        return predict_compression(sub, probe)
    psi = mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes)
    layers = sub.depth + 1
    loss_reduce = costmodel.ring_time(4, n, a, b)
    if name == "parameter-server":  # the workers compute; the server's link carries 2·N·S
        compute, talk = 6 * psi * batch / (n - 1) / x, costmodel.ps_time(4 * psi, n - 1, 1, a, b)
    elif name == "ring":
        compute, talk = 6 * psi * batch / n / x, costmodel.ring_time(4 * psi, n, a, b) + loss_reduce
    elif name == "pipeline":  # M + P − 1 slots of one micro-batch through one stage
        m = sub.microbatches
        compute = (m + n - 1) * 6 * psi * batch / m / n / x
        talk = 2 * m * (a + 4 * sub.hidden * batch / m * b)
    else:  # ZeRO (and LAMB on ZeRO-0): per layer a reduce-scatter and an all-gather (stage 3: two
        # all-gathers), each N−1 ring steps of 1/N of the layer
        per_layer = 3 if name == "zero-3" else 2
        compute = 6 * psi * batch / n / x
        talk = per_layer * (layers * (n - 1) * a + (n - 1) / n * 4 * psi * b) + loss_reduce
    return {"compute": compute, "comm": talk, "step": compute + talk}


def powersgd_sizes(sub) -> list[int]:
    """Elements of each ring all-reduce PowerSGD posts per step (its
    :meth:`~lesson_lib.milestones.compression.powersgd.PowerSGD.all_reduce_sizes`: P with the
    tensors it leaves uncompressed, here the biases, then Q); compressor "none": Ψ."""
    shapes = [p.shape for p in mlp(sub.d_in, sub.hidden, sub.depth, sub.classes, sub.seed).parameters()]
    if sub.compressor == "none":
        return [sum(math.prod(s) for s in shapes)]
    return sub.make_compressor().all_reduce_sizes(shapes)


def predict_compression(sub, probe: dict) -> dict:
    """PowerSGD: the ring's compute (its own matmuls left out) and one ring all-reduce per
    :func:`powersgd_sizes` entry plus the loss's; the slower of the emulated link's model
    (:func:`compression.predicted_step_s`) and the real link's α-β."""
    from .. import compression

    a, b, x = probe["alpha_s"], probe["beta_s_per_byte"], probe["flops"]
    n, psi = sub.world_size, mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes)
    sizes = powersgd_sizes(sub)
    compute = 6 * psi * sub.global_batch / n / x
    talk = sum(costmodel.ring_time(4 * m, n, a, b) for m in sizes) + costmodel.ring_time(4, n, a, b)
    if sub.link_gbps:
        shapes = [p.shape for p in mlp(sub.d_in, sub.hidden, sub.depth, sub.classes, sub.seed).parameters()]
        sent = max(sum(comm.ring_bytes_sent(m, 4, n, r) for m in sizes) for r in range(n))
        emulated = compression.predicted_step_s(0.0, compression.messages_per_step(sub, shapes), sent,
                                                sub.link_gbps, sub.link_latency_us * 1e-6)
        talk = max(talk, emulated)
    return {"compute": compute, "comm": talk, "step": compute + talk}
