"""The milestones' single-process references against torch's own training loop, written out in
tests/single_process.py.

Every "N ranks equal one process" test compares the ranks with a reference that runs the milestone's
own loop at one rank (``data_parallel.reference`` is ``train(world_size=1)``, and so are
``compression.reference`` and ``large_batch.reference``; the parameter server's and ZeRO's Adam
reference are ``data_parallel.reference``). A bug in that loop is then in the reference too. Here each
reference meets a loop that shares only the task with it (data, batches, first weights): the chain
"ranks = reference = torch's loop" is what makes those tests independent. One process, no ranks."""

import pytest
import single_process as sp
import torch

from lesson_lib.milestones import compression as cm
from lesson_lib.milestones import data_parallel as dp
from lesson_lib.milestones import large_batch as lb
from lesson_lib.milestones import parameter_server as ps
from lesson_lib.milestones import pipeline as pp
from lesson_lib.milestones import zero

pytestmark = pytest.mark.numerics

# The same operations in the same order: equal to float32 rounding (bit for bit where this was written);
# a wrong optimizer, rate or group moves an O(1) loss by far more than this within a step or two.
TOL = dict(rtol=1e-6, atol=1e-7)


def _close(a, b):
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), **TOL)


@pytest.mark.ch0
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_data_parallel_reference_is_torchs_adam_or_sgd_on_the_whole_batch(optimizer):
    # catches: the milestone's optimizer built wrong (its momentum, Adam for SGD), the loss or the
    # flat gradient bucket broken at one rank — which test_data_parallel's N-rank runs would share
    cfg = dp.Config(world_size=1, optimizer=optimizer, **dp.Config.PRESETS["tiny"])
    want = sp.fit(cfg, sp.adam(cfg) if optimizer == "adam" else sp.sgd_momentum(cfg))
    _close(dp.reference(cfg), want["losses"])


@pytest.mark.ch4
def test_zero_adam_reference_is_torchs_adam():
    # tests/test_zero.py's fp32 stages (and HSDP's) are compared with this reference
    cfg = zero.Config(**zero.Config.PRESETS["tiny"])
    _close(zero.reference(cfg), sp.fit(cfg, sp.adam(cfg))["losses"])


@pytest.mark.ch1
def test_parameter_server_reference_is_torchs_sgd_with_momentum():
    cfg = ps.Config(**ps.Config.PRESETS["tiny"])
    _close(ps.reference(cfg), sp.fit(cfg, sp.sgd_momentum(cfg))["losses"])


@pytest.mark.ch3
def test_pipeline_reference_losses_parameters_and_gradients_are_torchs_sgd():
    # tests/test_pipeline.py's SMALL task: the reference's last gradients and final weights too
    cfg = pp.Config(stages=2, steps=3, global_batch=24, hidden=16, depth=3, d_in=8, classes=4, samples=256)
    ref, want = pp.reference(cfg), sp.fit(cfg, sp.sgd_momentum(cfg))
    for key in ("losses", "params", "grads"):
        _close(ref[key], want[key])


@pytest.mark.ch6
def test_uncompressed_compression_reference_is_torchs_sgd():
    cfg = cm.Config(compressor="none", **cm.Config.PRESETS["tiny"])
    assert cfg.momentum == 0.0  # the preset's plain SGD
    _close(cm.reference(cfg)["losses"], sp.fit(cfg, sp.sgd_momentum(cfg, momentum=0.0))["losses"])


@pytest.mark.ch5
@pytest.mark.parametrize("optimizer", ["lamb", "lars", "sgd", "adam"])
def test_large_batch_reference_is_the_optimizer_on_the_recipes_groups_and_schedule(optimizer):
    # tests/test_large_batch.py's two-rank case: warm-up over 2 of the 16 steps, then the cosine;
    # catches: a schedule, a parameter group (biases decayed or adapted) or an optimizer's setting
    # (SGD's momentum, say) wrong in the milestone's loop, which its single-process reference shares
    cfg = lb.Config(world_size=2, optimizer=optimizer, lr=0.01, warmup_steps=2, weight_decay=1e-3,
                    **lb.Config.PRESETS["tiny"]).validate()
    assert cfg.steps == 16
    _close(lb.reference(cfg)["losses"], sp.large_batch(cfg)["losses"])


@pytest.mark.ch5
def test_the_written_out_schedule_is_the_chapters_by_hand():
    # the schedule the loop above uses, at the points chapter 5 states: 1/3, 2/3, 3/3 of the peak
    # during 3 warm-up steps, the peak, half of it at the middle of the decay, near 0 at the end
    lr = sp.warmup_cosine(0.3, 3, 23)
    assert [lr(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert lr(3) == pytest.approx(0.3) and lr(13) == pytest.approx(0.15) and lr(22) < 0.003


@pytest.mark.ch4
@pytest.mark.ch5
@pytest.mark.parametrize("optimizer", ["lamb", "lars"])
def test_zero_layerwise_reference_is_the_optimizer_on_the_recipes_groups(optimizer):
    # tests/test_zero_layerwise.py's case: LAMB/LARS under ZeRO are compared with this reference
    cfg = zero.Config(world_size=4, optimizer=optimizer, lr=0.01, weight_decay=1e-3, steps=6, hidden=32)
    ref, want = zero.layerwise_reference(cfg), sp.fit(cfg, sp.layerwise(optimizer, cfg.lr, cfg.weight_decay))
    _close(ref["losses"], want["losses"])
    _close(ref["params"], want["params"])
