"""Data parallel equals single-process training; counted traffic and memory equal their formulas."""

import pytest
import torch

from lesson_lib import run
from lesson_lib.comm import ring_bytes_sent
from lesson_lib.milestones import data_parallel as dp

pytestmark = pytest.mark.ch0

SMALL = dp.Config.PRESETS["tiny"]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("allreduce", ["ring", "library"])
def test_losses_equal_single_process_training(clusters, n, allreduce):
    ref = dp.reference(dp.Config(world_size=1, **SMALL))  # = torch's loop: test_single_process_references
    r = run("data-parallel", dp.Config(world_size=n, allreduce=allreduce, **SMALL), cluster=clusters(n))
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ref), rtol=1e-5, atol=1e-6)
    assert len(r.losses) == SMALL["steps"] and r.losses[-1] < r.losses[0]


def test_sgd_and_stragglers_do_not_change_the_result(clusters):
    ref = dp.reference(dp.Config(world_size=1, optimizer="sgd", **SMALL))
    r = run("data-parallel", dp.Config(world_size=2, optimizer="sgd", straggler="1:2.5", **SMALL),
            cluster=clusters(2))
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_counted_gradient_traffic_equals_the_ring_formula(clusters):
    n = 3
    r = run("data-parallel", dp.Config(world_size=n, **SMALL), cluster=clusters(n))
    psi = r["param_count"]
    for rank, pr in enumerate(r.per_rank):
        grads = pr["ops"]["grad_all_reduce"]
        assert grads["calls"] == SMALL["steps"]
        assert grads["bytes_sent"] == SMALL["steps"] * ring_bytes_sent(psi, 4, n, rank)
        # catches: received bytes miscounted; a rank receives what its left neighbour sends it
        assert grads["bytes_recv"] == SMALL["steps"] * ring_bytes_sent(psi, 4, n, (rank - 1) % n)
        assert abs(grads["bytes_sent"] / SMALL["steps"] - r["grad_bytes_formula"]) <= 8


def test_measured_memory_matches_what_the_rank_holds(clusters):
    r = run("data-parallel", dp.Config(world_size=2, **SMALL), cluster=clusters(2))
    psi, n_tensors = r["param_count"], 2 * (SMALL["depth"] + 1)  # weight + bias per Linear
    for pr in r.per_rank:
        m = pr["memory"]
        assert m["params"] == 4 * psi
        assert m["grads"] == 4 * psi                       # the flat gradient bucket
        assert m["optimizer"] == 8 * psi + 4 * n_tensors   # Adam: exp_avg, exp_avg_sq, step
        assert m["buffers"] == 4 * -(-psi // 2)            # ring scratch: one chunk
        # catches: activations mis-measured (a tensor missed or counted twice, a parameter counted).
        # What autograd saves for 12 samples: the input (12 x 32) for the first layer's weight
        # gradient, each ReLU's output (12 x 32, also the next layer's input: one storage), the
        # log-softmax (12 x 10), the int64 targets and the loss's total weight (a float scalar)
        assert m["activations"] == 4 * 12 * (32 + 32 + 32) + 4 * 12 * 10 + 8 * 12 + 4
        assert m["rss"] > 0


def test_per_step_split_adds_up(clusters):
    # catches: a step's comm_s not measured (0), not this step's share (a running total), or
    # counting time outside comm calls; per-step bytes not this step's; steps recorded out of order
    r = run("data-parallel", dp.Config(world_size=2, **SMALL), cluster=clusters(2))
    psi = r["param_count"]
    for rank, pr in enumerate(r.per_rank):
        ops_s = sum(v["seconds"] for v in pr["ops"].values() if not v["overlapped"])
        assert sum(s["comm_s"] for s in pr["steps"]) == pytest.approx(ops_s, rel=1e-9, abs=1e-12)
        for s in pr["steps"]:
            assert 0 < s["comm_s"] < s["wall_s"] and 0 <= s["busy_s"] <= s["wall_s"] + 1e-6
            # the gradients' and the loss's ring all-reduces, and what the left neighbour sent
            per_step = lambda r: ring_bytes_sent(psi, 4, 2, r) + ring_bytes_sent(1, 4, 2, r)
            assert s["bytes_sent"] == per_step(rank) and s["bytes_recv"] == per_step(1 - rank)
        assert [s["step"] for s in pr["steps"]] == list(range(SMALL["steps"]))
        starts = [s["start"] for s in pr["steps"]]
        assert starts == sorted(starts)
    # one rank: nothing communicated, every second of the step is compute
    alone = run("data-parallel", dp.Config(world_size=1, **SMALL), cluster=clusters(1))
    for s in alone.per_rank[0]["steps"]:
        assert s["comm_s"] == 0 and s["bytes_sent"] == s["bytes_recv"] == 0
        assert s["compute_s"] == s["wall_s"] > 0


def test_events_arrive_per_step_and_rank(clusters):
    seen = []
    run("data-parallel", dp.Config(world_size=2, **SMALL), cluster=clusters(2), on_event=seen.append)
    steps = sorted((e["rank"], e["step"]) for e in seen if e["kind"] == "step")
    assert steps == [(r, s) for r in (0, 1) for s in range(SMALL["steps"])]


@pytest.mark.parametrize("options, name", [
    (dict(world_size=3, global_batch=64), "global_batch"),
    (dict(world_size=2, straggler="5:2"), "straggler"),
    (dict(world_size=2, straggler="1:0.5"), "straggler"),
    (dict(world_size=2, straggler="oops"), "straggler"),
    (dict(world_size=0), "world_size"),
    (dict(steps=0), "steps"),
    (dict(lr=-1.0), "lr"),
    (dict(optimizer="lion"), "optimizer"),
    (dict(allreduce="tree"), "allreduce"),
    (dict(backend="mpi"), "backend"),
])
def test_bad_options_raise_a_clear_error_naming_the_parameter(options, name):
    with pytest.raises((ValueError, TypeError), match=name):
        dp.Config(**options).validate()


def test_result_json_has_the_common_keys(clusters, tmp_path):
    import json

    r = run("data-parallel", dp.Config(world_size=2, **SMALL), cluster=clusters(2))
    r.save_json(tmp_path / "r.json")
    d = json.loads((tmp_path / "r.json").read_text())
    assert {"experiment", "world_size", "backend", "config", "losses", "per_rank"} <= set(d)
    for pr in d["per_rank"]:
        assert {"rank", "bytes_sent", "bytes_recv", "compute_s", "comm_s", "memory"} <= set(pr)
        assert set(pr["memory"]) >= {"params", "grads", "optimizer", "activations", "buffers"}


def test_run_rejects_a_config_of_another_experiment_or_mixed_arguments():
    from lesson_lib.milestones import zero

    with pytest.raises(TypeError, match="either cfg or keyword options"):
        run("data-parallel", dp.Config(world_size=1), steps=3)
    with pytest.raises(TypeError, match="cfg must be a lesson_lib.milestones.data_parallel.Config"):
        run("data-parallel", zero.Config(world_size=1))


@pytest.mark.slow
def test_the_ddp_benchmark_times_both_steps_on_the_same_model():
    from lesson_lib.__main__ import load_benchmark
    from lesson_lib.models import mlp_param_count

    rows = load_benchmark("ddp").measure(hidden_sizes=(16,), steps=2, bucket_mb=0.001)
    assert [r["variant"] for r in rows] == ["ring", "ring+buckets", "library", "library+buckets"]
    assert all(r["params"] == mlp_param_count(32, 16, 3, 10) for r in rows)
    assert all(r["ours_s"] > 0 and r["ddp_s"] > 0 and r["ratio"] > 0 for r in rows)


def test_an_emulated_link_is_a_config_field_applied_in_the_run_and_undone_after(clusters):
    # catches: the link set from notebook glue (cluster.run(set_link, ...)) and left in force for the
    # next run on those warm workers, or a link option that does nothing
    from lesson_lib import comm

    cfg = dp.Config(world_size=2, link_gbps=0.05, **SMALL)
    r = run("data-parallel", cfg, cluster=clusters(2))
    op = r.per_rank[0]["ops"]["grad_all_reduce"]
    assert op["seconds"] >= op["bytes_sent"] * 8 / 0.05e9 > 0  # every transfer held to the link
    assert clusters(2).run(comm.link) == [None, None]  # undone when the run ended
    plain = run("data-parallel", cfg.replace(link_gbps=0.0), cluster=clusters(2))
    assert plain.losses == r.losses  # the link only waits: the same training
    for bad in (-1.0, float("inf"), True, "fast"):
        with pytest.raises(ValueError, match="link_gbps"):
            dp.Config(world_size=2, link_gbps=bad, **SMALL).validate()
