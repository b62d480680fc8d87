"""Chapter 1: the parameter server against single-process SGD, its counted traffic, its faults."""

import pytest
import torch

from lesson_lib import WorkerError, numerics, run
from lesson_lib.chapters import ch01
from lesson_lib.milestones import parameter_server as ps
from lesson_lib.milestones.parameter_server import replicas as ps_replicas
from lesson_lib.milestones.parameter_server.staleness import release

pytestmark = pytest.mark.ch1

SMALL = ps.Config.PRESETS["tiny"]


def _run(clusters, **kw):
    cfg = ps.Config(**SMALL, **kw).validate()
    return run("parameter-server", cfg, cluster=clusters(cfg.world_size))


@pytest.mark.parametrize("workers, servers", [(1, 1), (3, 1), (2, 2)])
def test_sync_equals_single_process_sgd_on_the_combined_batch(clusters, workers, servers):
    r = _run(clusters, mode="sync", workers=workers, servers=servers)
    ref = ps.reference(ps.Config(**SMALL))
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_async_with_one_worker_is_plain_sgd(clusters):
    r = _run(clusters, mode="async", workers=1)
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ps.reference(ps.Config(**SMALL))),
                               rtol=1e-5, atol=1e-6)
    assert r["staleness"] == {"0": SMALL["steps"]}


def test_sync_server_traffic_is_2_n_s_and_shards_split_it(clusters):
    for workers, servers in ((3, 1), (2, 2)):
        r = _run(clusters, mode="sync", workers=workers, servers=servers)
        s = r["param_bytes"]
        assert r["server_bytes_per_step"] == 2 * workers * s == r["server_bytes_formula"]
        assert sum(r["per_server_bytes"]) == 2 * workers * s * SMALL["steps"]
        for b in r["per_server_bytes"]:  # each shard: 1/K of it, up to one element of rounding
            assert abs(b / SMALL["steps"] - 2 * workers * s / servers) <= 2 * workers * 4
        for p in r.per_rank[servers:]:  # each worker pushes and pulls S per step
            assert p["bytes_sent"] == p["bytes_recv"] == s * SMALL["steps"]


def test_async_traffic_and_staleness(clusters):
    r = _run(clusters, mode="async", workers=3)
    assert r["server_bytes_per_step"] == 2 * 3 * r["param_bytes"]
    assert sum(r["staleness"].values()) == 3 * SMALL["steps"]
    assert r.losses[0] == pytest.approx(ps.reference(ps.Config(**SMALL))[0], rel=1e-6)


def test_staleness_bound_holds_fast_workers_back(clusters):
    # catches: the async server ignoring staleness_bound (replying to every worker at once).
    # Worker 0 does 200x the work (~1 s in all), so without a bound the fast workers push many
    # times during one of its steps: its first gradient is many updates old.
    free = _run(clusters, mode="async", workers=3, straggler="0:200")
    assert max(int(k) for k in free["staleness"]) > 2, free["staleness"]
    r = _run(clusters, mode="async", workers=3, staleness_bound=0, straggler="0:200")
    # with a bound of 0 pushes ahead, no gradient can be older than one update per other worker (2):
    # the workers go round by round, all three sent the same version, so each round's gradients
    # arrive 0, 1 and 2 updates old, whatever the timing
    assert r["staleness"] == {"0": SMALL["steps"], "1": SMALL["steps"], "2": SMALL["steps"]}
    # SSP's own measure, from the server: no worker went on ahead of the slowest; unbounded, they did
    assert r["max_lead"] == 0 and free["max_lead"] > 2, (r["max_lead"], free["max_lead"])


def test_ssp_release_holds_exactly_the_workers_past_the_bound():
    # catches: an off-by-one in the bound, a finished worker held for ever, a lead measured wrongly
    def released(bound, pushes, held, lost=(), steps=10):
        got = []
        release(held, pushes, set(lost), bound, steps, lambda w, lead: got.append((w, lead)))
        return got

    assert released(1, [3, 4, 5], [1, 2]) == [(1, 1)]               # 5 is 2 ahead of the slowest's 3
    assert released(2, [3, 4, 5], [1, 2]) == [(1, 1), (2, 2)]
    assert released(0, [3, 3, 3], [0, 1, 2]) == [(0, 0), (1, 0), (2, 0)]   # round by round
    assert released(-1, [0, 7, 9], [1, 2]) == [(1, 7), (2, 9)]      # unbounded: async, leads measured
    assert released(0, [3, 10, 5], [1, 2]) == [(1, None)]           # finished: released, no lead
    assert released(1, [0, 4, 5], [2], lost={0}) == [(2, 1)]        # a lost worker is nobody's slowest
    held = [1, 2]
    released(1, [3, 4, 5], held)
    assert held == [2]                                              # the one past the bound still waits


def _replicated(clusters, **kw):
    cfg = ps_replicas.Config.tiny(**kw)
    return cfg, ps_replicas.run(cfg, clusters(cfg.world_size))


@pytest.mark.parametrize("fail_at", [0, 3, 5])
def test_a_replicated_shard_survives_its_primary_to_the_same_parameters(clusters, fail_at):
    # catches: a backup that copies the parameters but not the momentum, an update lost in the
    # take-over (or applied twice), a worker that does not push again, replication bytes miscounted
    cfg, failed = _replicated(clusters, fail_at=fail_at)
    _, intact = _replicated(clusters, fail_at=-1)
    s = failed["param_bytes"]
    assert failed["took_over"] == fail_at and failed["acknowledged_by_primary"] == fail_at
    assert failed["switched"] == [{"step": fail_at, "same_params": True}] * cfg.workers
    assert failed["in_order"] and failed["workers_agree"] and intact["took_over"] is None
    assert torch.equal(failed["params"], intact["params"])          # bit for bit, as without failure
    assert torch.equal(failed["params"], failed["backup_params"])
    ref = ps_replicas.reference(cfg)
    assert numerics.max_gap(failed["losses"], ref) <= numerics.sum_order_tolerance(ref)
    # one copy of each acknowledged update (S), its step number and the ack (4 bytes each)
    assert failed["replication_bytes"] == failed["replication_formula"] == fail_at * (s + 8)
    assert intact["replication_bytes"] == intact["replication_formula"] == cfg.steps * (s + 8)
    assert failed["serving_bytes"] == failed["serving_formula"] == (2 * cfg.steps + 1) * cfg.workers * s
    assert failed["recovery_bytes"] == failed["recovery_formula"] == 4 + cfg.workers * s
    assert intact["recovery_bytes"] == intact["recovery_formula"] == 0


@pytest.mark.parametrize("options, name", [
    (dict(workers=0), "workers"), (dict(world_size=3), "world_size"), (dict(fail_at=6), "fail_at"),
    (dict(fail_at=-2), "fail_at"), (dict(fail_at=True), "fail_at"), (dict(workers=5), "global_batch"),
])
def test_replicas_bad_input_names_the_parameter(options, name):
    with pytest.raises((ValueError, TypeError), match=name):
        ps_replicas.Config(**{**ps_replicas.Config.PRESETS["tiny"], **options}).validate()


@pytest.mark.slow
def test_async_goes_on_without_a_lost_worker(clusters):
    r = _run(clusters, mode="async", workers=3, fail_worker="1:2", lost_after_s=3.0)
    assert r["lost_workers"] == [1] and len(r.losses) == SMALL["steps"]
    # the cluster replaced its workers afterwards: the next run works
    assert _run(clusters, mode="sync", workers=3).losses


@pytest.mark.slow
def test_sync_reports_the_lost_worker(clusters):
    with pytest.raises(WorkerError, match=r"worker 1 \(rank 2\) stopped responding"):
        _run(clusters, mode="sync", workers=3, fail_worker="1:2", lost_after_s=3.0)


@pytest.mark.slow
def test_a_dead_server_stops_training_with_its_rank(clusters):
    with pytest.raises(WorkerError, match="rank 0.*SIGKILL"):
        _run(clusters, mode="sync", workers=2, fail_server=2)


@pytest.mark.parametrize("options, name", [
    (dict(workers=0), "workers"),
    (dict(servers=0), "servers"),
    (dict(hidden=1, depth=1, d_in=1, classes=1, servers=5), "servers"),
    (dict(mode="hogwild"), "mode"),
    (dict(straggler="0:0.5"), "straggler"),
    (dict(straggler="7:2"), "straggler"),
    (dict(workers=5, global_batch=24), "global_batch"),
    (dict(fail_worker="x"), "fail_worker"),
    (dict(staleness_bound=-2), "staleness_bound"),
    (dict(world_size=7), "world_size"),
    (dict(server_gbps=-1.0), "server_gbps"),
    (dict(server_gbps=float("inf")), "server_gbps"),
])
def test_bad_input_names_the_parameter(options, name):
    with pytest.raises((ValueError, TypeError), match=name):
        ps.Config(**{**SMALL, **options}).validate()


def test_exercise_references_pass_and_wrong_answers_fail():
    ex = ch01.exercises(param_bytes=1000)
    assert ex["average"].check(ex["average"].reference())
    # catches: a checker rejecting for another reason than the mistake (or crashing on it)
    v = ex["average"].check(lambda shard, grads, lr: shard - lr * sum(grads))
    assert not v and "is 3× the expected length" in v.message, v.message  # summed, 3 workers
    v = ex["average"].check(lambda shard, grads, lr: None)
    assert not v and "— but your function returned None" in v.message, v.message  # the case comes first
    assert ex["traffic"].check(ex["traffic"].reference())
    assert ex["traffic"].check(2 * 1000).message == "you said 2,000 bytes; check your formula"
    ex["traffic"].submit(...)  # unanswered: says so, does not fail
    assert not ex["traffic"].passed
    ex["traffic"].submit(2 * 4 * 1000)
    assert ex["traffic"].passed


@pytest.mark.slow
def test_divergence_exercise_reference_and_a_wrong_answer():
    ex = ch01.exercises()["divergence"]
    assert ex.check(ex.reference()), "async at the reference lr should diverge while sync learns"
    assert not ex.check(0.01)


def _pushes(ends: dict[int, list[float]]) -> dict:
    return {"segments": [{"worker": w, "phase": "push", "end": t} for w, ts in ends.items() for t in ts]}


def test_fast_lead_counts_steps_ahead_of_the_straggler():
    # lockstep (sync): each fast push k+1 comes after the straggler's push k -> at most 1 ahead
    sync = _pushes({0: [4, 8, 12], 1: [1, 5, 9], 2: [1.5, 5.5, 9.5]})
    assert ch01.fast_lead(sync) == 0
    # a fast worker that runs on (async): 3 pushes by the straggler's first, all 6 by its second
    free = _pushes({0: [4, 8], 1: [1, 2, 3, 5, 6, 7], 2: [1, 2, 3, 5, 6, 7]})
    assert ch01.fast_lead(free) == 4  # at the second push: 6 done - 2
    one_ahead = _pushes({0: [4, 8], 1: [1, 3.9, 7], 2: [1, 5, 7.5]})
    assert ch01.fast_lead(one_ahead) == pytest.approx(1.0)  # at push 1: (2 + 1)/2 - 1; at push 2: 3 - 2


@pytest.mark.slow
def test_an_emulated_server_link_holds_each_step_to_its_bytes(clusters):
    # catches: the link left off (steps far under N·S/B), or left on for the next run of a warm worker
    cfg = dict(mode="sync", workers=2, steps=4, hidden=256, depth=2, global_batch=24)
    slow = run("parameter-server", server_gbps=0.05, cluster=clusters(3), **cfg)
    floor = slow["param_bytes"] * 2 * 8 / 0.05e9  # N·S each way
    assert ch01.first_worker_cycle(slow) >= floor  # start to start: a step's own time may dip just under
    fast = run("parameter-server", cluster=clusters(3), **cfg)
    assert fast.median_step_time() < floor / 2 and fast.losses == slow.losses


@pytest.mark.slow
def test_the_staleness_slider_runs_real_ranks_within_the_bound_it_shows(monkeypatch):
    # catches: a slider whose value does not reach the run (every click the same bound)
    from lesson_lib.chapters import ch01_staleness

    rows, real = [], ch01_staleness.ssp_row
    monkeypatch.setattr(ch01_staleness, "ssp_row", lambda b, r: rows.append(real(b, r)) or rows[-1])
    box = ch01.staleness_explorer()
    slider, button = box.children[0], box.children[2]
    assert slider.options[0][1] == 0 and slider.options[-1][1] == -1   # from round by round to async
    slider.value = 2
    button.click()
    assert [r["bound"] for r in rows] == [2] and rows[0]["max_lead"] <= 2, rows
