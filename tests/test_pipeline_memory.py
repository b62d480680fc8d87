"""Chapter 3 §6: the activations a stage holds, measured by the allocator (lesson_lib.peakmem) beside
the saved-tensor inventory, and activation recomputation (``recompute=True``): the same training,
only the stage inputs kept, a lower measured peak."""

import pytest
import torch

from lesson_lib import run
from lesson_lib.milestones import pipeline as pp

pytestmark = pytest.mark.ch3
SMALL = dict(steps=3, global_batch=24, hidden=16, depth=3, d_in=8, classes=4, samples=256)


def _memory(stages, m, schedule, rows, **options):
    return pp.Config.from_preset("memory", stages=stages, microbatches=m, schedule=schedule,
                                 global_batch=m * rows, **options)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_recomputation_trains_like_storing_and_like_one_process(clusters, schedule):
    cfg = pp.Config(stages=2, schedule=schedule, microbatches=4, **SMALL).validate()
    stored = pp.state(clusters(2).run(pp.worker, cfg))
    recomputed = pp.state(clusters(2).run(pp.worker, cfg.replace(recompute=True)))
    # The backward reruns the same forward kernels on the same inputs, then takes the same steps:
    # equal bit for bit, not merely close.
    assert recomputed["losses"] == stored["losses"]
    for key in ("params", "grads"):
        assert torch.equal(recomputed[key], stored[key]), key
    ref = pp.reference(cfg)  # and equal to one process, to float rounding (as test_pipeline's schedules)
    for key in ("losses", "grads", "params"):
        torch.testing.assert_close(torch.as_tensor(recomputed[key]), torch.as_tensor(ref[key]),
                                   rtol=1e-5, atol=1e-6)


def test_recomputation_keeps_only_the_stage_inputs_and_lowers_the_measured_peak(clusters):
    P, M, rows = 2, 4, 64
    mem = {rc: run("pipeline", _memory(P, M, "gpipe", rows, recompute=rc),
                   cluster=clusters(P))["stage_memory"] for rc in (False, True)}
    cfg = _memory(P, M, "gpipe", rows)
    for k in range(P):
        stored, recomputed = mem[False][k], mem[True][k]
        width = cfg.d_in if k == 0 else cfg.hidden
        # catches: the flag ignored, or the stage keeping more than its input (inventory of saved tensors)
        assert recomputed["activation_per_microbatch"] == rows * width * 4, recomputed
        assert recomputed["activation_peak"] == M * rows * width * 4, recomputed
        assert stored["activation_peak"] >= 4 * recomputed["activation_peak"], (stored, recomputed)
        for s in (stored, recomputed):  # every saved tensor is allocated in the step and alive at once
            assert s["measured_step_peak"] >= s["activation_peak"] > 0, s
        # measured: the stage also keeps its output (the backward's root) and rebuilds one micro-batch
        # at a time, so the saving is less than the inventory's, but clear
        assert recomputed["measured_step_peak"] < 0.75 * stored["measured_step_peak"], (stored, recomputed)


def test_measured_peaks_order_gpipe_above_1f1b_and_see_what_the_inventory_does_not(clusters):
    P, M, rows = 4, 8, 128
    mem = {s: run("pipeline", _memory(P, M, s, rows), cluster=clusters(P))["stage_memory"]
           for s in ("gpipe", "1f1b")}
    for k in range(P):
        for s in ("gpipe", "1f1b"):
            m = mem[s][k]
            assert m["measured_step_peak"] >= m["activation_peak"] > 0, (s, m)
            assert m["measured_at_reset"] > m["param_bytes"], (s, m)  # parameters, gradients, momentum
    g, f = mem["gpipe"][0], mem["1f1b"][0]
    assert f["measured_step_peak"] < 0.6 * g["measured_step_peak"], (g, f)  # 4 micro-batches held, not 8
    # What stage 0 allocates beyond its saved tensors: the gradient receives posted ahead (GPipe all
    # M, 1F1B two), and what one backward builds at a time — at most a micro-batch's activation
    # gradients and one weight gradient (H x H). Catches a stage (or its send thread) keeping each
    # sent activation to the step's end: the allocator sees it, the inventory does not.
    H = 256
    for m, posted in ((g, M), (f, 2)):
        extra = m["measured_step_peak"] - m["activation_peak"]
        assert extra <= posted * rows * H * 4 + m["activation_per_microbatch"] + H * H * 4, m
    # GPipe posts all 8 gradient receives of stage 0 at the step's start (8 x 128 x 256 floats): the
    # meter sees those buffers, allocated on the link's receive thread
    assert g["measured_step_peak"] - g["activation_peak"] >= M * rows * 256 * 4, g


def test_the_meter_is_off_by_default_and_its_peaks_repeat(clusters):
    cfg = pp.Config(stages=2, microbatches=4, **SMALL)
    assert "measured_step_peak" not in run("pipeline", cfg, cluster=clusters(2))["stage_memory"][0]
    peaks = [[s["measured_step_peak"] for s in run("pipeline", _memory(2, 2, "gpipe", 32),
                                                    cluster=clusters(2))["stage_memory"]] for _ in range(2)]
    # the same run twice in warm workers: the same bytes, up to where a receive thread's buffer falls
    # among the stage's own allocations (one buffer: 32 x 256 floats)
    for a, b in zip(*peaks):
        assert abs(a - b) <= 32 * 256 * 4, peaks


@pytest.mark.parametrize("options, name", [
    (dict(recompute=1), "recompute"),
    (dict(recompute="yes"), "recompute"),
    (dict(peak_memory=None), "peak_memory"),
])
def test_bad_flags_name_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        pp.Config(**{**SMALL, **options}).validate()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_the_chapter_recomputation_check_rejects_a_bad_count_of_timed_steps_before_any_run(bad):
    from lesson_lib.chapters import ch03_memory

    with pytest.raises(ValueError, match="timed_steps must be a positive int"):
        ch03_memory.recomputation(timed_steps=bad)


@pytest.mark.parametrize("bad", [0, 1.5, True])
def test_the_chapter_recomputation_check_rejects_a_bad_count_of_rounds_before_any_run(bad):
    from lesson_lib.chapters import ch03_memory

    with pytest.raises(ValueError, match="rounds must be a positive int"):
        ch03_memory.recomputation(rounds=bad)
