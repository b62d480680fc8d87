"""Chapter 10's compressed data parallelism (:mod:`lesson_lib.milestones.resilience.compressed`) against
references written here: the bytes PowerSGD's P and Q factors make, (m + n)·r per matrix; the same loop
uncompressed against two replicas averaged in one process; and rank-2 PowerSGD with error feedback
replayed in one process with torch's QR for the orthogonalization. They share the task's data and first
weights with what they check, not its code."""

import numpy as np
import pytest
import torch

from lesson_lib import comm
from lesson_lib.milestones.resilience import compressed
from lesson_lib.milestones.resilience import task as T

pytestmark = pytest.mark.ch10

TASK = T.Task(steps=5)


def test_powersgd_sends_its_factors_and_the_biases(clusters):
    out = clusters(2).run(compressed.counted, compressed.replica, TASK, "powersgd", None, rank=2)
    # mlp(32, 64, 1, 10): W1 64×32 and W2 10×64 are compressed to P (rows·r) and Q (columns·r); the
    # biases (64 and 10) ride uncompressed with P. On 2 ranks a ring all-reduce of S floats sends
    # S·4 bytes from each rank (one half in the reduce-scatter, the other in the all-gather).
    r = 2
    per_step = (64 + 32) * r + (10 + 64) * r + 64 + 10
    for o in out:
        assert o["bytes_sent"] == TASK.steps * 4 * per_step == 5 * 1656
        assert o["collectives"] == 2 * TASK.steps  # P, then Q
    dense = TASK.steps * 4 * (64 * 32 + 64 + 10 * 64 + 10)
    ddp = clusters(2).run(compressed.counted, _ddp, TASK)
    assert [o["bytes_sent"] for o in ddp] == [dense, dense]  # counted by the comm layer
    assert dense / out[0]["bytes_sent"] == pytest.approx(2762 / 414)


def _ddp(task):
    """Data parallelism with one all-reduce per tensor, as the notebook's ``my_diloco(task, None)``."""
    import torch.distributed as dist

    rank = dist.get_rank()
    train, held = T.data(task)
    model, opt = T.build(task)
    for step in range(task.steps):
        T.gradient(model, T.batch(task, train, step, rank))
        for p in model.parameters():
            comm.all_reduce(p.grad)
            p.grad /= 2
        opt.step()
    return {"params": T.flat_params(model)}


def _two_replicas(task, average):
    """Both replicas in one process: their gradients ``average``d, then torch's SGD with momentum. One
    thread, as each rank runs, so that the matrix products add in the same order."""
    train, _ = T.data(task)
    model, opt = T.build(task)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(task.steps):
            grads = [T.gradient(model, T.batch(task, train, step, r)) for r in (0, 1)]
            T.set_gradient(model, average(grads))
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return T.flat_params(model)


def test_uncompressed_is_two_replicas_averaged_bit_for_bit(clusters):
    out = clusters(2).run(compressed.replica, TASK, "none", None)
    want = _two_replicas(TASK, lambda g: (g[0] + g[1]) / 2)
    assert all(torch.equal(o["params"], want) for o in out)


def _powersgd_by_hand(r: int, seed: int):
    """Rank-r PowerSGD (Vogels et al., 2019, Algorithm 1, as torch's hook lays it out) for 2 replicas:
    P = Σ MᵢQ̂, Q = Σ MᵢᵀP̂ / 2 with ^ an orthonormal basis (QR here), M ≈ P̂Qᵀ; Q warm-started; the biases
    averaged as they are; error feedback eᵢ ← (gᵢ + eᵢ) − the average. Q's first draw seeded as torch's."""
    mats = [(0, 64, 32), (2112, 10, 64)]  # (offset, rows, columns) of W1 and W2 in the flat gradient
    biases = [(2048, 64), (2752, 10)]
    torch.manual_seed(np.random.RandomState(seed).randint(1_000_000_000))
    qs = [torch.randn(cols * r).view(cols, r) for _, _, cols in mats]
    errors = [0, 0]

    def orth(x):
        return torch.linalg.qr(x).Q

    def average(grads):
        nonlocal qs
        acc = [g + e for g, e in zip(grads, errors)]
        out = torch.empty_like(acc[0])
        for i, (at, rows, cols) in enumerate(mats):
            ms = [a[at:at + rows * cols].view(rows, cols) for a in acc]
            q_hat = orth(qs[i])
            p_hat = orth(sum(m @ q_hat for m in ms))
            qs[i] = sum(m.T @ p_hat for m in ms) / 2
            out[at:at + rows * cols] = (p_hat @ qs[i].T).reshape(-1)
        for at, size in biases:
            out[at:at + size] = (acc[0][at:at + size] + acc[1][at:at + size]) / 2
        errors[:] = [a - out for a in acc]
        return out

    return average


def test_powersgd_is_vogels_algorithm_with_error_feedback(clusters):
    out = clusters(2).run(compressed.replica, TASK, "powersgd", None, rank=2)
    want = _two_replicas(TASK, _powersgd_by_hand(2, TASK.seed))
    for o in out:
        torch.testing.assert_close(o["params"], want, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(want, _two_replicas(TASK, lambda g: (g[0] + g[1]) / 2), atol=1e-4)


def test_counted_adds_what_the_comm_layer_saw(clusters):
    out = clusters(2).run(compressed.counted, _ddp, T.Task(steps=2))
    assert all(o["collectives"] == 2 * 4 and o["comm_s"] > 0 for o in out)  # 4 tensors a step
