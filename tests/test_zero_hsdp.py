"""Chapter 4, §3 and §8: FSDP2 on a device mesh — hybrid sharding's bytes per group against the
formula and its training against one process; the precision of the reduction; the backward prefetch."""

import pytest

from lesson_lib import numerics
from lesson_lib.costmodel import zero_memory
from lesson_lib.milestones import zero

pytestmark = pytest.mark.ch4

SMALL = zero.Config.PRESETS["tiny"]
STATES = ("params", "grads", "optimizer")


def _check_counted(out, shape, steps, shards):
    f = zero.hsdp.traffic_formula(shards, shape, steps)
    assert out["bytes_sent"]["param_all_gather"] == f["param_all_gather"], (out, f)
    assert out["bytes_sent"]["grad_reduce_scatter"] == f["grad_reduce_scatter"], (out, f)
    assert out["all_reduce"]["bytes"] == f["all_reduce_bytes"], (out, f)
    return f


@pytest.mark.slow
@pytest.mark.numerics
def test_hsdp_bytes_per_group_equal_the_formula_and_it_trains_like_one_process(clusters):
    cfg = zero.Config(stage=3, world_size=4, peak_memory=True, **SMALL)
    ref, tol = zero.reference(cfg), numerics.adam_drift(cfg)
    runs = {shape: clusters(4).run(zero.hsdp.mesh_worker, cfg, shape) for shape in ((2, 2), (4,))}
    for shape, outs in runs.items():
        for o in outs:  # every rank: counted == formula, in both groups (FSDP2 pads to rank 0's shard)
            _check_counted(o, shape, cfg.steps, outs[0]["shard_numel"])
        assert numerics.max_gap(outs[0]["losses"], ref) <= tol["loss_rel"] * max(map(abs, ref)), shape
        # one all-reduce per layer per step, across the replicate group only
        layers = cfg.depth + 1
        assert outs[0]["all_reduce"]["calls"] == (cfg.steps * layers if len(shape) == 2 else 0)
    hsdp, fsdp = runs[2, 2], runs[4,]
    states = lambda o: sum(o["memory"][c] for c in STATES)
    # HSDP shards over 2 ranks: twice FSDP's shard of a layer whose rows divide by 4 (the first)
    assert hsdp[0]["shard_numel"][0] == 2 * fsdp[0]["shard_numel"][0]
    # measured: HSDP's peak is above FSDP's by at least the extra model states it keeps
    assert min(o["memory"]["measured_peak"] for o in hsdp) - max(o["memory"]["measured_peak"] for o in fsdp) \
        >= max(map(states, hsdp)) - min(map(states, fsdp))
    assert all(o["memory"]["measured_peak"] >= states(o) for o in hsdp + fsdp)


@pytest.mark.numerics
def test_bf16_reduction_halves_the_reduce_scatter_and_stays_within_bf16_rounding(clusters):
    cfg = zero.Config(stage=3, world_size=2, **SMALL)
    ref = zero.reference(cfg)
    runs = {r: clusters(2).run(zero.hsdp.mesh_worker, cfg, (), "bf16", r)[0] for r in ("bf16", "fp32")}
    fp32 = clusters(2).run(zero.hsdp.mesh_worker, cfg)[0]
    assert numerics.max_gap(fp32["losses"], ref) <= numerics.adam_drift(cfg)["loss_rel"] * max(map(abs, ref))
    for r, o in runs.items():
        f = zero.hsdp.traffic_formula(o["shard_numel"], (2,), cfg.steps, 2, 2 if r == "bf16" else 4)
        assert o["bytes_sent"] == {k: f[k] for k in ("param_all_gather", "grad_reduce_scatter")}, (r, o, f)
        gap = numerics.max_gap(o["losses"], ref)
        assert gap <= zero.hsdp.bf16_loss_tolerance(cfg, ref), (r, gap)
        assert gap > numerics.adam_drift(cfg)["loss_rel"] * max(map(abs, ref)) / 100  # bf16 did run
    assert runs["bf16"]["bytes_sent"]["grad_reduce_scatter"] * 2 == fp32["bytes_sent"]["grad_reduce_scatter"]
    # catches: a tolerance so loose that a skipped step would pass (the loss after one step less)
    skipped = [ref[0], *ref[:-1]]
    assert numerics.max_gap(skipped, ref) > zero.hsdp.bf16_loss_tolerance(cfg, ref)


def test_fsdp2_prefetches_the_previous_layer_in_the_backward_unless_told_not_to(clusters):
    cfg = zero.Config(stage=3, world_size=2, **SMALL)
    on, off = (clusters(2).run(zero.hsdp.mesh_worker, cfg, (), "fp32", "fp32", p)[0] for p in (True, False))
    layers = cfg.depth + 1
    assert zero.hsdp.prefetched_in_backward(on["events"]) == layers - 1
    assert zero.hsdp.prefetched_in_backward(off["events"]) == 0
    assert on["losses"] == off["losses"] and on["bytes_sent"] == off["bytes_sent"]
    for o in (on, off):  # the last step's collectives: every layer gathered twice, scattered once
        lanes = [e["lane"] for e in o["events"]]
        assert lanes.count("all-gather, forward") == lanes.count("all-gather, backward") == layers
        assert lanes.count("reduce-scatter") == layers


def test_traffic_formula_and_the_megatron_convention():
    f = zero.hsdp.traffic_formula([10, 6], (2, 2), steps=1)  # Ψ = 32 elements of 4 bytes
    assert f == {"param_all_gather": 128, "grad_reduce_scatter": 64, "all_reduce_bytes": 64,
                 "all_reduce_ring_sent": 64}
    f = zero.hsdp.traffic_formula([8], (4,), steps=2)  # plain FSDP over 4: Ψ = 32, no replicate group
    assert f == {"param_all_gather": 2 * 192, "grad_reduce_scatter": 2 * 96, "all_reduce_bytes": 0,
                 "all_reduce_ring_sent": 0}
    # ZeRO's 16 bytes per parameter, Megatron-LM's 18 (fp32 main gradients), 6 + 12/N distributed
    assert zero_memory(1, 1, 0)["total"] == 16 and zero_memory(1, 1, 0, grad_bytes=4)["total"] == 18
    assert zero_memory(1, 8, 1, grad_bytes=4)["total"] == 6 + 12 / 8


def test_mesh_worker_bad_input_names_the_parameter():
    cfg = zero.Config(stage=3, world_size=1, **SMALL)
    with pytest.raises(ValueError, match="param_dtype"):
        zero.hsdp.mesh_worker(cfg, (), "fp16")
