"""Chapter 6's compressed all-reduce (1-bit Adam's, Tang et al., 2021, with scaled signs): real ranks
against the single-process simulation of the same N ranks, its counted bytes against the formula,
and the chapter's training loop with it."""

import pytest
import torch
import torch.distributed as dist

from lesson_lib import comm, run
from lesson_lib.metrics import counters
from lesson_lib.milestones import compression as cm

pytestmark = pytest.mark.ch6


def grads(numel: int, n: int, steps: int) -> list[list[torch.Tensor]]:
    """grads[step][rank], the same on every rank and in the simulation."""
    return [[torch.randn(numel, generator=torch.Generator().manual_seed(1000 * s + r)) for r in range(n)]
            for s in range(steps)]


def on_ranks(numel: int, steps: int, error_feedback: bool = True):
    counters().reset()
    rank, n = dist.get_rank(), dist.get_world_size()
    c = cm.make("sign-allreduce", error_feedback=error_feedback)
    outs = [c.reduce(g[rank].clone()).clone() for g in grads(numel, n, steps)]
    ops = counters().ops["grad"]
    return outs, ops.bytes_sent, ops.bytes_recv, sum(t.numel() for t in c.state_tensors())


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("numel", [3000, 2 * 512, 700, 100])  # uneven, whole blocks, fewer blocks than ranks
def test_real_ranks_equal_the_single_process_simulation(clusters, world, numel):
    for ef in (True, False):
        outs = clusters(world).run(on_ranks, numel, 4, ef)
        want = cm.simulate(grads(numel, world, 4), error_feedback=ef)
        for r, (got, _, _, _) in enumerate(outs):
            for step, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(a, b), (world, numel, ef, r, step, float((a - b).abs().max()))
        # error feedback on both sides: the worker residual (all of it) and the server's (its chunk)
        state = [s for *_, s in outs]
        assert state == ([numel + b - a for a, b in cm.block_chunks(numel, world)] if ef else [0] * world)


def _scaled_sign(x: torch.Tensor) -> torch.Tensor:
    """What the scaled sign code says about ``x`` (1-bit SGD, Seide et al., 2014, as 1-bit Adam uses
    it), written out block by block: each block of 512 values (the last one shorter) becomes the
    mean of its |x| times +1 where x ≥ 0, −1 elsewhere."""
    out = torch.empty_like(x)
    for lo in range(0, x.numel(), 512):
        block = x[lo:lo + 512]
        out[lo:lo + 512] = block.abs().mean() * torch.where(block >= 0, 1.0, -1.0)
    return out


def _by_hand(grads: list[list[torch.Tensor]], error_feedback: bool = True) -> list[torch.Tensor]:
    """Tang et al. (2021)'s compressed all-reduce for N ranks in one process, sharing no code with
    :mod:`lesson_lib.milestones.compression.allreduce`: every rank compresses its gradient plus its
    worker residual; the codes are averaged; the average plus the server residual is compressed again,
    which is what every rank receives. Chunks of whole blocks change no block, so none are cut here."""
    n, numel = len(grads[0]), grads[0][0].numel()
    worker, server, outs = [torch.zeros(numel) for _ in range(n)], torch.zeros(numel), []
    for step in grads:
        acc = [g + e if error_feedback else g for g, e in zip(step, worker)]
        sent = [_scaled_sign(a) for a in acc]
        if error_feedback:
            worker = [a - s for a, s in zip(acc, sent)]
        avg = sum(sent) / n + (server if error_feedback else 0)
        out = _scaled_sign(avg)
        if error_feedback:
            server = avg - out
        outs.append(out)
    return outs


@pytest.mark.numerics
@pytest.mark.parametrize("world, numel", [(1, 1000), (2, 700), (3, 3000), (4, 100), (4, 2 * 512)])
def test_the_simulation_is_the_algorithm_written_out(world, numel):
    # catches: the code's scale or signs wrong (a short last block averaged over 512, the sign of 0),
    # a residual kept on one side only or not subtracted: the real ranks equal cm.simulate bit for bit
    # (above), which shares sign_encode and sign_decode with them, so this is what checks those
    g = grads(numel, world, 4)
    for ef in (True, False):
        for step, (got, want) in enumerate(zip(cm.simulate(g, error_feedback=ef), _by_hand(g, ef))):
            # float32 sums of the same terms in another order: a few roundings of the O(1) values
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"{world}, {numel}, {ef}, {step}")


def test_error_feedback_on_both_sides_is_what_makes_it_add_up():
    # Over many steps, what every rank received adds up to the sum of the average gradients, up to
    # what the two residuals still hold: Σ out = Σ mean(g) + mean(worker residuals) ... so the gap
    # stays bounded instead of growing with the steps, as it does without error feedback.
    g = grads(1500, 4, 60)
    mean = sum(sum(step) / 4 for step in g)
    gap = {ef: float((sum(cm.simulate(g, ef)) - mean).abs().max()) for ef in (True, False)}
    assert gap[True] < gap[False] / 3, gap


@pytest.mark.parametrize("world", [2, 4, 8])
def test_counted_bytes_equal_the_formula(clusters, world):
    numel, n = 76_810, world  # the chapter's model: 151 blocks, not a multiple of N
    outs = clusters(world).run(on_ranks, numel, 1)
    p = [cm.sign_bytes(b - a) for a, b in cm.block_chunks(numel, n)]
    assert sum(p) == cm.sign_bytes(numel)  # chunks of whole blocks: the payload P, split
    # by hand: a float32 scale for each of ⌈76,810 / 512⌉ = 151 blocks, a bit for each value
    assert sum(p) == 4 * 151 + 76_810 // 8 + 1 == 10_206
    # rank r sends its N−1 foreign chunks once and its compressed average to N−1 ranks, and receives
    # every rank's code of its chunk and every other rank's average: the same count
    want = [sum(p) - p[r] + (n - 1) * p[r] for r in range(n)]
    assert [s for _, s, _, _ in outs] == want and [rv for _, _, rv, _ in outs] == want
    assert max(want) == cm.busiest_bytes(numel, n)
    # about 2(N−1)/N of P (chunks of whole blocks are uneven by up to a block), where the
    # all-gathered sign sends (N−1)·P and the fp32 ring 2(N−1)/N·4S
    assert abs(cm.busiest_bytes(numel, n) - 2 * (n - 1) / n * sum(p)) <= (n - 2) * cm.sign_bytes(cm.BLOCK)
    assert cm.busiest_bytes(numel, n) <= (n - 1) * sum(p)
    assert cm.busiest_bytes(numel, n) < cm.ring_busiest_bytes(numel, 2, n) / 14  # ~1/15 of bf16's ring
    if world == 8:  # the 8 workers are not kept for the rest of the session
        clusters(world).close()


def test_training_loop_with_it_agrees_on_every_rank_and_learns(clusters):
    tiny = dict(hidden=32, steps=60, lr=0.2, samples=512, global_batch=64)
    none = cm.Config(compressor="none", world_size=2, **tiny).validate()
    ours = cm.Config(compressor="sign-allreduce", world_size=4, **tiny).validate()
    runs = {c.compressor: run(cm.NAME, c, cluster=clusters(c.world_size)) for c in (none, ours)}
    assert runs["sign-allreduce"]["ranks_agree"] and runs["none"]["ranks_agree"]  # bit for bit
    # the same data and global batch: the loss falls nearly as far as uncompressed (0.8 of it here)
    drop = {c: r.losses[0] - sum(r.losses[-10:]) / 10 for c, r in runs.items()}
    assert drop["sign-allreduce"] > 0.6 * drop["none"] > 0, drop
    assert runs["sign-allreduce"]["wire_bytes_per_step"] == cm.busiest_bytes(runs["none"]["param_count"], 4)
    # an all-to-all and an all-gather of N−1 exchanges each, as many as a ring, and the loss's ring
    assert runs["sign-allreduce"]["messages_per_step"] == 2 * 3 + 2 * 3
    calls = [p["ops"]["grad"]["calls"] for p in runs["sign-allreduce"].per_rank]
    assert calls == [2 * tiny["steps"]] * 4, calls  # one all-to-all and one all-gather per step


def test_one_rank_is_two_codes_in_a_row():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    x[3] = 0.0  # x ≥ 0 codes +1
    got = cm.SignAllReduce(error_feedback=False).reduce(x.clone())
    assert torch.equal(got, cm.sign_decode(cm.sign_encode(cm.sign_decode(cm.sign_encode(x), 1000)), 1000))
    torch.testing.assert_close(got, _scaled_sign(_scaled_sign(x)), rtol=1e-6, atol=0)
    assert torch.equal(got, cm.simulate([[x]], error_feedback=False)[0])


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="n must"):
        cm.block_chunks(100, 0)
    with pytest.raises(ValueError, match="grads"):
        cm.simulate([[torch.zeros(10), torch.zeros(10)], [torch.zeros(10)]])
    with pytest.raises(ValueError, match="compressor"):
        cm.Config(compressor="sign-all-reduce").validate()
    assert comm.chunk_bounds(3, 4)[-1] == (3, 3)  # block_chunks leans on empty chunks past the end
