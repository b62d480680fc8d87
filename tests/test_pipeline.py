"""Chapter 3: pipeline schedules against single-process training, their properties, counted bytes,
measured memory, torch.distributed.pipelining, exercises, bad input and the CLI."""

import json
import random
import statistics

import pytest
import torch
from conftest import cli_in_process
from hypothesis import given, settings
from hypothesis import strategies as st

from lesson_lib import numerics, run
from lesson_lib.chapters import ch03
from lesson_lib.costmodel import bubble_formula
from lesson_lib.milestones import pipeline as pp
from lesson_lib.milestones.pipeline import torch_ref
from lesson_lib.milestones.pipeline.schedules import (
    SCHEDULES,
    all_actions,
    bubble_breakdown,
    idle_share,
    max_in_flight,
    paced_bubble,
    partition,
    replay,
    stage_actions,
    stage_pace,
)

pytestmark = pytest.mark.ch3
SMALL = dict(steps=3, global_batch=24, hidden=16, depth=3, d_in=8, classes=4, samples=256)


def _close(a, b):
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- equal to one process


def _relay(ahead, count=6):
    """Rank 0 sends ``count`` distinct tensors over a StageLink; rank 1, posting at most ``ahead``
    receives it has not taken, takes them slowly. Returns rank 1's tensors and events."""
    import time as _time

    from lesson_lib.milestones.pipeline.comm import StageLink, Timeline
    from lesson_lib.runtime import context

    rank = context().rank
    tl = Timeline(rank, torch.device("cpu"))
    link = StageLink(rank, 2, count, (3,), (3,), tl, ahead=ahead)
    try:
        if rank == 0:
            for i in range(count):
                link.send_activation(torch.full((3,), float(i)), i)
            link.flush()
            return None
        link.begin_step()
        got = []
        for i in range(count):
            _time.sleep(0.02)  # the stage is busy: the sender's messages pile up
            got.append(link.recv_activation(i).tolist())
        return {"got": got, "events": tl.events}
    finally:
        link.close()


@pytest.mark.parametrize("ahead", [1, 2, None])
def test_receives_posted_ahead_arrive_in_order_and_respect_the_bound(clusters, ahead):
    out = clusters(2).run(_relay, ahead, timeout_s=20)[1]
    assert out["got"] == [[float(i)] * 3 for i in range(6)]
    posted = {e["microbatch"]: e["start"] for e in out["events"] if e["kind"] == "arrive_activation"}
    taken = {e["microbatch"]: e["end"] for e in out["events"] if e["kind"] == "recv"}
    later = [i for i in range(6 - (ahead or 6)) if posted[i + ahead] < taken[i]]
    if ahead:  # receive i + ahead is posted only once the stage has taken receive i
        assert not later, later
    else:  # all posted at once, before the slow stage took the first
        assert max(posted.values()) < taken[0]


@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_equals_single_process_training(clusters, stages, schedule):
    cfg = pp.Config(stages=stages, schedule=schedule, microbatches=4, **SMALL).validate()
    ours, ref = pp.state(clusters(stages).run(pp.worker, cfg)), pp.reference(cfg)
    for key in ("losses", "grads", "params"):
        _close(ours[key], ref[key])


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("interleaved", 2)])
def test_return_params_off_sends_no_state_and_verify_turns_it_back_on(clusters, schedule, chunks):
    cfg = pp.Config(stages=2, schedule=schedule, chunks=chunks, microbatches=4, return_params=False,
                    **SMALL).validate()
    outs = clusters(2).run(pp.worker, cfg)
    assert not {"params", "grads", "chunk_params", "chunk_grads"} & set(outs[0])
    with pytest.raises(ValueError, match="return_params"):
        pp.state(outs)
    on = pp.state(clusters(2).run(pp.worker, cfg.replace(return_params=True)))
    assert on["losses"] == outs[-1]["losses"]  # the same training, only less sent back
    gaps = pp.verify(cfg, clusters(2))  # verify needs the parameters: it asks for them itself
    assert max(gaps.values()) <= numerics.pipeline_tolerance(microbatches=4, steps=cfg.steps, depth=cfg.depth)


def test_the_timed_presets_send_no_parameters_back():
    assert pp.Config().return_params is True
    for preset in ("laptop", "bubble"):
        assert pp.Config.from_preset(preset, stages=2).return_params is False
    with pytest.raises(ValueError, match="return_params"):
        pp.Config(stages=2, return_params=1, **SMALL).validate()


def test_the_reference_is_the_course_single_process_reference():
    from lesson_lib.milestones.data_parallel import reference as single_process

    cfg = pp.Config(stages=2, **SMALL)
    assert pp.reference(cfg)["losses"] == single_process(cfg, optimizer="sgd")


def test_time_balance_and_an_odd_number_of_microbatches(clusters):
    cfg = pp.Config(stages=2, schedule="1f1b", microbatches=3, balance="time", **SMALL).validate()
    outs = clusters(2).run(pp.worker, cfg)
    ours, ref = pp.state(outs), pp.reference(cfg)
    for key in ("losses", "grads", "params"):
        _close(ours[key], ref[key])
    assert outs[0]["bounds"] == outs[1]["bounds"]  # rank 0 measured, every stage cut the same way
    assert outs[1]["per_rank"]["ops"]["balance"]["bytes_recv"] == 8 * cfg.layers


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_ours_equals_torch_distributed_pipelining(clusters, schedule):
    cfg = pp.Config(stages=2, schedule=schedule, microbatches=4, **SMALL)
    c = torch_ref.compare(cfg, clusters(2))
    assert "error" not in c, c
    assert max(c["ours_vs_torch"].values()) < 1e-6 and max(c["torch_vs_reference"].values()) < 1e-5


# --------------------------------------------------------------------------- schedules


@settings(max_examples=60, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES), p=st.integers(1, 6), m=st.integers(1, 12))
def test_schedule_properties(schedule, p, m):
    acts = all_actions(schedule, p, m)
    n = 1 if schedule == "naive" else m
    for k, a in enumerate(acts):
        where = f"{schedule}, stage {k} of P={p}, M={m}: {a}"  # a failure names the stage, P and M
        assert sorted(a) == sorted([("F", i) for i in range(n)] + [("B", i) for i in range(n)]), where
        assert all(a.index(("F", i)) < a.index(("B", i)) for i in range(n)), f"backward first: {where}"
        # each direction carries micro-batches in order (what StageLink's early receives rely on)
        for kind in "FB":
            assert [i for x, i in a if x == kind] == list(range(n)), f"{kind} out of order: {where}"
        held = max_in_flight(a)
        want = min(p - k, n) if schedule == "1f1b" else n
        assert held == want, f"{held} micro-batches in flight, expected {want}: {where}"
    replay(acts, {(k, x, i): 1.0 for k in range(p) for x, i in acts[k]})  # raises if it deadlocks


@settings(max_examples=40, deadline=None)
@given(schedule=st.sampled_from(["gpipe", "1f1b"]), p=st.integers(1, 6), m=st.integers(1, 12),
       backward=st.sampled_from([1.0, 2.0, 3.0]))
def test_equal_stages_give_exactly_the_formula_bubble(schedule, p, m, backward):
    acts = all_actions(schedule, p, m)
    spans = replay(acts, {(k, x, i): 1.0 if x == "F" else backward for k in range(p) for x, i in acts[k]})
    assert idle_share(spans) == pytest.approx(bubble_formula(p, m), abs=1e-12), f"{schedule}, P={p}, M={m}"


def test_1f1b_order_and_a_schedule_that_deadlocks():
    assert stage_actions("1f1b", 4, 6, 1) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                             ("F", 4), ("B", 2), ("F", 5), ("B", 3), ("B", 4), ("B", 5)]
    bad = all_actions("1f1b", 2, 2)
    bad[1] = [("B", 0), ("F", 0), ("F", 1), ("B", 1)]
    with pytest.raises(ValueError, match="deadlocks"):
        replay(bad, {(k, x, i): 1.0 for k in range(2) for x, i in bad[k]})


def test_partition_minimises_the_largest_stage():
    assert partition([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]
    assert partition([1, 2, 3], 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match="stages"):
        partition([1, 2], 3)


# --------------------------------------------------------------------------- bytes, memory, events


def test_counted_bytes_match_the_formula(clusters):
    cfg = pp.Config(stages=4, schedule="gpipe", microbatches=4, **SMALL)
    r = run("pipeline", cfg, cluster=clusters(4))
    per_step = 4 * SMALL["global_batch"] * SMALL["hidden"]  # the batch's activations at a boundary
    assert r["bytes_per_step_formula"] == {"send_activation": per_step, "send_grad": per_step}
    for k, rank in enumerate(r.per_rank):
        ops = rank["ops"]
        sent = {op: ops.get(op, {"bytes_sent": 0})["bytes_sent"] for op in ("send_activation", "send_grad")}
        assert sent["send_activation"] == (per_step * cfg.steps if k < 3 else 0)
        assert sent["send_grad"] == (per_step * cfg.steps if k > 0 else 0)
        if k < 3:
            assert ops["send_activation"]["calls"] == cfg.steps * cfg.microbatches
            assert ops["recv_grad"]["bytes_recv"] == per_step * cfg.steps
        assert rank["bytes_sent"] == sum(sent.values())
        # catches: received bytes miscounted: activations from the stage before, gradients from the next
        if k > 0:
            assert ops["recv_activation"]["bytes_recv"] == per_step * cfg.steps
        assert rank["bytes_recv"] == per_step * cfg.steps * ((k > 0) + (k < 3))


def test_measured_activation_memory_gpipe_vs_1f1b(clusters):
    P, M = 4, 8
    mem = {}
    for schedule in ("gpipe", "1f1b"):
        cfg = pp.Config(stages=P, schedule=schedule, microbatches=M, **{**SMALL, "global_batch": 32})
        mem[schedule] = run("pipeline", cfg, cluster=clusters(P))["stage_memory"]
    # catches: activations mis-measured per stage. A micro-batch is 4 samples, one Linear per stage:
    # stage 0 keeps its input (4 x 8) and its ReLU's output (4 x 16); stages 1-2 the received
    # input (4 x 16) and the ReLU's output; stage 3 its input, the log-softmax (4 x 4), the int64
    # targets and the loss's total weight (a float scalar)
    want = [4 * 4 * (8 + 16), 4 * 4 * (16 + 16), 4 * 4 * (16 + 16), 4 * 4 * (16 + 4) + 8 * 4 + 4]
    assert [s["activation_per_microbatch"] for s in mem["1f1b"]] == want
    for k in range(P):
        g, f = mem["gpipe"][k], mem["1f1b"][k]
        assert g["activation_per_microbatch"] == f["activation_per_microbatch"] > 0
        assert g["max_in_flight"] == M and g["activation_peak"] == M * g["activation_per_microbatch"]
        assert f["max_in_flight"] == P - k
        assert f["activation_peak"] == (P - k) * f["activation_per_microbatch"]


def test_events_bubble_and_parameter_memory(clusters):
    cfg = pp.Config(stages=2, schedule="1f1b", microbatches=4, **SMALL)
    r = run("pipeline", cfg, cluster=clusters(2))
    ev = r["events"]
    assert {"rank", "kind", "microbatch", "start", "end", "busy", "step"} <= set(ev[0])
    for k in range(2):
        for step in range(cfg.steps):
            mine = [e for e in ev if e["rank"] == k and e["step"] == step]
            for kind in ("forward", "backward", "send", "recv"):
                assert sorted(e["microbatch"] for e in mine if e["kind"] == kind) == list(range(4))
            assert all(e["end"] >= e["start"] for e in mine)
    # catches: the wall-clock bubble not measured from the step's own forwards and backwards (a
    # window or a work sum taken wrong), or summarised over the wrong steps (step 0 is left out)
    assert r["bubble_formula"] == 1 / 5  # (P - 1) / (M + P - 1) with P = 2, M = 4
    wall = []
    for step in range(cfg.steps):
        comp = [e for e in ev if e["step"] == step and e["kind"] in ("forward", "backward")]
        window = max(e["end"] for e in comp) - min(e["start"] for e in comp)
        wall.append(1 - sum(e["end"] - e["start"] for e in comp) / (2 * window))
        assert r["bubble_per_step"][step]["wall"] == pytest.approx(wall[-1], abs=1e-9)
    assert r["bubble_wall"] == pytest.approx(statistics.median(wall[1:]), abs=1e-9)
    busy = [b["busy"] for b in r["bubble_per_step"]]
    assert r["bubble_busy"] == statistics.median(busy[1:]) and 0 < min(busy) < 1
    # every message of the measured steps (step 0 skipped) was timed: 4 activations and 4 gradients
    assert len(r["message_delays_s"]) == 8 * (cfg.steps - 1) and min(r["message_delays_s"]) >= 0
    params = [s["param_bytes"] for s in r["stage_memory"]]
    assert sum(params) == r["unsplit_param_bytes"] and max(params) < r["unsplit_param_bytes"]


def test_naive_is_a_relay_with_one_stage_busy(clusters):
    r = run("pipeline", pp.Config(stages=4, schedule="naive", microbatches=4, **SMALL), cluster=clusters(4))
    assert r["microbatches_run"] == 1 and r["bubble_formula"] == 0.75
    assert r["bubble_busy"] == pytest.approx(0.75, abs=1e-9)


# --------------------------------------------------------------------------- exercises


def test_exercise_references_pass_and_wrong_answers_fail():
    ex = ch03.exercises(stages=4)
    assert ex["bubble"].check(ex["bubble"].reference())
    # catches (here and below): a checker rejecting for another reason than the mistake, or crashing
    assert ex["bubble"].check(0.75).message == "you said 0.75; check your formula"
    order = ex["order"]
    assert order.check(order.reference())
    assert order.check(stage_actions("1f1b", 4, 6, 1))  # tuples are accepted too
    v = order.check(" ".join(f"{x}{i}" for x, i in stage_actions("gpipe", 4, 6, 1)))
    assert not v and "it is GPipe's" in v.message, v.message
    assert "B0 comes before F0" in order.check("B0 F0 F1 F2 F3 F4 F5 B1 B2 B3 B4 B5").message
    v = order.check("F0 F1 B0")
    assert not v and v.message == ("stage 1 of 4, M = 6: each of F0…F5 and B0…B5 exactly once — but you "
                                   "listed 3 actions, not each once"), v.message
    assert ex["in_flight"].check(ex["in_flight"].reference())
    v = ex["in_flight"].check(8)
    assert not v and v.message.startswith("you said 8;"), v.message
    assert ex["smallest_m"].reference() == 28
    for wrong in (27, 29):
        v = ex["smallest_m"].check(wrong)  # wrong answers are rejected without a run
        assert not v and v.message.startswith(f"with M = {wrong} the formula gives"), v.message
    ex["bubble"].submit(...)  # unanswered: says so, does not fail
    assert ex["bubble"].passed is False


@pytest.mark.slow
def test_smallest_m_exercise_judges_by_the_formula_and_reports_its_run():
    # once "confirmed by a real run" beside a run measuring 18-25 % busy and 61-70 % wall
    ex = ch03.exercises(stages=4)["smallest_m"]
    verdict = ex.check(ex.reference())
    assert verdict and "by the formula, 9.7%: the answer" in verdict.message, verdict.message
    assert "measured (not part of the verdict)" in verdict.message


# --------------------------------------------------------------------------- bad input, CLI


@pytest.mark.parametrize("options, name", [
    (dict(stages=0), "stages"),
    (dict(stages=-1), "stages"),
    (dict(stages=5), "stages"),  # the SMALL model has depth + 1 = 4 layers
    (dict(microbatches=5), "microbatches"),  # 24 samples do not split into 5
    (dict(microbatches=0), "microbatches"),
    (dict(schedule="zero-bubble"), "schedule"),
    (dict(balance="flops"), "balance"),
    (dict(stages=2, world_size=3), "world_size"),
])
def test_bad_input_names_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        pp.Config(**{**SMALL, **options}).validate()


def test_replace_keeps_one_rank_per_stage():
    cfg = pp.Config(stages=2, **SMALL).replace(stages=4)
    assert cfg.world_size == cfg.stages == 4


def test_cli_writes_the_chapter_keys_and_stages_1_is_the_unsplit_model(tmp_path):
    small = ["--steps", "3", "--global-batch", "16", "--seed", "0", "--hidden", "16", "--depth", "3",
             "--samples", "256"]
    losses = {}
    for p in (2, 1):
        f = tmp_path / f"pp{p}.json"
        out = cli_in_process("run", "pipeline", "--stages", str(p), "--microbatches", "4", "--schedule",
                             "1f1b", *small, "--json", str(f))
        assert out.returncode == 0, out.stderr[-2000:]
        d = json.loads(f.read_text())
        assert d["experiment"] == "pipeline" and d["world_size"] == p and len(d["per_rank"]) == p
        assert {"rank", "kind", "microbatch", "start", "end"} <= set(d["events"][0])
        for key in ("bubble_wall", "bubble_formula", "bubble_busy", "stage_memory", "partition"):
            assert key in d
        assert len(d["stage_memory"]) == p and "activation_peak" in d["stage_memory"][0]
        losses[p] = d["losses"]
    _close(losses[2], losses[1])


@pytest.mark.parametrize("args, name", [
    (["--microbatches", "5", "--global-batch", "16"], "microbatches"),
    (["--stages", "0"], "stages"),
    (["--stages", "9", "--depth", "3"], "stages"),
])
def test_cli_bad_input_fails_fast_naming_the_parameter(args, name):
    out = cli_in_process("run", "pipeline", *args)
    assert out.returncode != 0 and name in out.stderr


# --------------------------------------------------------------------------- bench bubble (no timing)


@pytest.mark.slow
def test_bench_bubble_runs_and_prints_every_run(capsys):
    from lesson_lib.__main__ import load_benchmark

    bench = load_benchmark("bubble")
    rows = bench.measure(schedules=("gpipe",), microbatches=(2,), repeats=2, steps=2)
    assert [(r["schedule"], r["microbatches"], r["run"]) for r in rows] == [("gpipe", 2, 0), ("gpipe", 2, 1)]
    for r in rows:
        # catches: a ratio taken against another figure than (P - 1) / (M + P - 1) = 1/3 here, or the
        # replay with each stage's mean times below the formula (for GPipe the bottleneck stage's
        # M (F + B) plus the others' F + B bounds the makespan, so it cannot be)
        assert r["formula"] == 1 / 3
        assert 0 < r["busy"] < 1 and 0 < r["wall"] < 1
        assert r["busy_ratio"] == pytest.approx(3 * r["busy"])
        assert r["wall_ratio"] == pytest.approx(3 * r["wall"])
        assert r["stages"] >= 1 / 3 - 1e-9
        assert r["messages"] >= r["busy"] - 1e-12  # a message delay can only postpone an action
        assert [s["stage"] for s in r["per_stage"]] == [0, 1]
        assert all(0 <= s[k] <= 1 for s in r["per_stage"] for k in ("off_core", "recv", "between"))
    bench.show(rows)
    out = capsys.readouterr().out
    assert "gpipe M=2: busy/formula" in out and out.count("\n") >= len(rows) + 4


@pytest.mark.parametrize("stages, microbatches", [(2, 1), (2, 4), (2, 8), (3, 5), (4, 8)])
def test_paced_bubble_is_gpipes_replay_with_unequal_stages(stages, microbatches):
    # catches: a pace taken from the slowest stage's forward + backward (wrong when one stage is the
    # slower in forwards and another in backwards, as in the first draw's stage 0 and 1), a mean
    # over the wrong stages, or a formula that is not GPipe's flow shop
    rng = random.Random(stages * 100 + microbatches)
    acts = all_actions("gpipe", stages, microbatches)
    for draw in range(5):
        fwd = [rng.uniform(0.5, 2.0) for _ in range(stages)]
        bwd = [rng.uniform(0.5, 2.0) for _ in range(stages)]
        if draw == 0:  # one stage slower forward, the other slower backward
            fwd[0], bwd[0], fwd[1], bwd[1] = 2.0, 1.0, 1.0, 2.0
        durations = {(k, x, i): fwd[k] if x == "F" else bwd[k] for k in range(stages) for x, i in acts[k]}
        events = [{"rank": k, "step": 0, "kind": "forward" if x == "F" else "backward", "microbatch": i,
                   "start": s, "end": e, "busy": durations[k, x, i]}
                  for (k, x, i), (s, e) in replay(acts, durations).items()]
        b = bubble_breakdown(acts, events, 0)
        pace = stage_pace(b["per_stage"])
        assert b["pace"] == pace
        assert [s["forward"] for s in b["per_stage"]] == pytest.approx(fwd)
        assert b["stages"] == pytest.approx(paced_bubble(stages, microbatches, pace), abs=1e-12)
        assert pace >= 1 and b["stages"] >= bubble_formula(stages, microbatches) - 1e-12
    assert paced_bubble(stages, microbatches, 1.0) == pytest.approx(bubble_formula(stages, microbatches))


def test_bubble_breakdown_of_a_synthetic_step():
    acts = all_actions("gpipe", 2, 2)
    # stage 1's forwards and backwards take twice as long as stage 0's
    durations = {(k, x, i): (1 + k) * (1.0 if x == "F" else 2.0) for k in range(2) for x, i in acts[k]}
    events = [{"rank": k, "step": 0, "kind": "forward" if x == "F" else "backward", "microbatch": i,
               "start": s, "end": e, "busy": durations[k, x, i]}
              for (k, x, i), (s, e) in replay(acts, durations).items()]
    b = bubble_breakdown(acts, events, 0)
    # no variation, free messages, no overhead: every rung is the replay itself
    assert b["busy"] == pytest.approx(b["wall"]) == pytest.approx(b["stages"]) == pytest.approx(b["messages"])
    # stage 1 sets the pace: makespan = F of stage 0 + M·(F+B) of stage 1 + B of stage 0 = 15, work 6 + 12
    assert b["stages"] == pytest.approx(1 - 18 / (2 * 15)) and b["stages"] > bubble_formula(2, 2)
    assert all(s["off_core"] == pytest.approx(0) and s["recv"] == 0 for s in b["per_stage"])
    assert b["busy_bounds"] == pytest.approx((b["busy"], b["busy"]))  # no variation: no range
    # stage 1's first forward gets its activation 0.5 after stage 0's ends: everything after it moves
    arrive = {"rank": 1, "step": 0, "kind": "arrive_activation", "microbatch": 0, "start": 0.0, "end": 1.5,
              "busy": 0.0}
    late = bubble_breakdown(acts, events + [arrive], 0)
    assert late["busy"] == b["busy"] and late["messages"] == pytest.approx(1 - 18 / (2 * 15.5))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_variations_range_brackets_the_busy_replay(schedule):
    # catches: bounds from the fastest and slowest action of the whole step (not of the stage's own
    # kind), bounds from their own work instead of the run's, or a range that does not contain the replay
    rng = random.Random(7)
    acts = all_actions(schedule, 3, 6)
    for _ in range(20):
        durations = {(k, x, i): (1 + k / 4) * (1.0 if x == "F" else 2.0) * rng.uniform(0.7, 1.4)
                     for k in range(3) for x, i in acts[k]}
        events = [{"rank": k, "step": 0, "kind": "forward" if x == "F" else "backward", "microbatch": i,
                   "start": s, "end": e, "busy": durations[k, x, i]}
                  for (k, x, i), (s, e) in replay(acts, durations).items()]
        b = bubble_breakdown(acts, events, 0)
        lo, hi = b["busy_bounds"]
        assert lo <= b["busy"] <= hi and lo < hi
        slowest = {(k, x): max(d for (j, y, _), d in durations.items() if (j, y) == (k, x))
                   for k in range(3) for x in "FB"}
        spans = replay(acts, {key: slowest[key[:2]] for key in durations})
        assert hi == pytest.approx(1 - sum(durations.values()) / (3 * max(e for _, e in spans.values())))


@pytest.mark.numerics
@pytest.mark.parametrize("stages, schedule, chunks", [(4, s, 1) for s in SCHEDULES] + [(2, "interleaved", 2)])
def test_the_chapters_equality_checks_hold_within_the_pipeline_tolerance(clusters, stages, schedule, chunks):
    """Chapter 3's §2 and interleaved checks, as the notebook makes them (``make test-numerics``
    reruns them under the portable kernels, in place of rerunning the whole notebook)."""

    cfg = pp.Config.tiny(stages=stages, schedule=schedule, microbatches=4, chunks=chunks)
    g = pp.verify(cfg, clusters(stages))
    assert max(g.values()) <= numerics.pipeline_tolerance(microbatches=4, steps=cfg.steps, depth=cfg.depth), g


def test_the_live_timeline_refuses_bad_input_before_drawing_anything(monkeypatch):
    # once: an empty live figure drawn, then the error
    shown = []
    monkeypatch.setattr(ch03, "display", shown.append)
    with pytest.raises(ValueError, match="stages"):
        ch03.live(stages=0)
    assert shown == []
