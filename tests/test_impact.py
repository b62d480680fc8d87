"""Chapter 7: the impact experiment on real ranks (counted bytes against their formulas, the same
computation reaching the target in the same steps), its bad inputs, its CLI, and its exercises."""

import json
import math

import pytest
import torch
import torch.distributed as dist
from conftest import cli_in_process, worker_children

from lesson_lib import comm, costmodel, run
from lesson_lib.chapters import ch07_exercises as ex7
from lesson_lib.milestones import impact
from lesson_lib.models import mlp_param_count

pytestmark = pytest.mark.ch7

# A 3-rank run in seconds: a 16-wide MLP, 12 small-batch steps, 6 at 8× the batch.
SMALL = impact.Config.PRESETS["tiny"]
KEYS = {"time_to_target_s", "reached_target", "steps", "bytes_per_step_busiest", "peak_memory_per_rank",
        "predicted_step_s", "median_step_s", "milestone", "link_gbps"}


@pytest.fixture(scope="module")
def small(clusters):
    return run("impact", impact.Config(**SMALL), cluster=clusters(3))


def test_every_milestone_is_recorded_with_the_issue_keys(small):
    records = small["milestones"]
    assert [r["milestone"] for r in records] == list(impact.MILESTONES)
    for r in records:
        assert KEYS <= set(r), r["milestone"]
        assert len(r["peak_memory_per_rank"]) == 3
        assert set(r["peak_memory_per_rank"][0]) == {"params", "grads", "optimizer", "activations", "buffers"}
        assert r["predicted_step_s"] > 0 and r["median_step_s"] > 0
        if r["reached_target"]:
            assert 0 < r["time_to_target_s"] <= r["time_run_s"] + r["median_step_s"]
            assert r["steps"] <= r["steps_run"]
        else:
            assert r["time_to_target_s"] is None


def test_counted_bytes_follow_each_chapters_formula(small):
    rec = {r["milestone"]: r for r in small["milestones"]}
    n, psi = 3, rec["ring"]["param_count"]
    assert psi == mlp_param_count(32, 16, 3, 10)
    # the server's link: every worker's gradient in, the parameters out — 2·N·S, exactly
    assert rec["parameter-server"]["bytes_per_step_busiest"] == 2 * (n - 1) * 4 * psi
    # the ring: 2(N−1)/N·S each way, plus the 4-byte loss all-reduce; chunks of uneven size add < 1 %
    ring = 2 * 2 * (n - 1) / n * 4 * psi
    assert ring <= rec["ring"]["bytes_per_step_busiest"] <= 1.01 * ring + 32
    z1, z3 = (rec[f"zero-{s}"]["bytes_per_step_busiest"] for s in (1, 3))
    assert abs(z3 / z1 - 1.5) <= 0.02  # ZeRO-3's extra all-gather; the loss all-reduce adds a little
    # LAMB's batch is 8× larger but each step moves the same gradients: 8× fewer bytes per sample
    assert rec["lamb"]["bytes_per_step_busiest"] == rec["zero-1"]["bytes_per_step_busiest"]
    assert rec["lamb"]["global_batch"] == 8 * rec["ring"]["global_batch"]


# PowerSGD rank 2 on SMALL's MLP (32 → 16 → 16 → 16 → 10): every weight matrix is compressed
# ((n + m)·2·2 < n·m), the biases travel whole, with P: 16 + 16 + 16 + 10 = 58 elements; P has
# rows·2 = (16 + 16 + 16 + 10)·2 = 116; Q has columns·2 = (32 + 16 + 16 + 16)·2 = 160.
POWERSGD_SIZES = [116 + 58, 160]


def test_powersgd_sizes_by_hand():
    subs = impact.plans(impact.Config(**SMALL).validate())
    assert impact.powersgd_sizes(subs["compression"][1]) == POWERSGD_SIZES
    assert impact.powersgd_sizes(subs["compression"][1].replace(compressor="none")) == \
        [mlp_param_count(32, 16, 3, 10)]


def test_powersgd_bytes_follow_its_two_all_reduces(small):
    rec = {r["milestone"]: r for r in small["milestones"]}
    n = 3
    # per rank: sent + received over the two all-reduces and the loss's (1 float), exactly
    per_rank = [sum(comm.ring_bytes_sent(m, 4, n, r) + comm.ring_bytes_sent(m, 4, n, r - 1)
                    for m in POWERSGD_SIZES + [1]) for r in range(n)]
    for name in ("compression", "compression-slow-link"):
        assert rec[name]["bytes_per_step_per_rank"] == per_rank, name
        assert rec[name]["bytes_per_step_busiest"] == max(per_rank)
    psi = mlp_param_count(32, 16, 3, 10)
    assert rec["compression"]["compression_ratio"] == pytest.approx(
        max(comm.ring_bytes_sent(psi, 4, n, r) for r in range(n))
        / max(sum(comm.ring_bytes_sent(m, 4, n, r) for m in POWERSGD_SIZES) for r in range(n)))
    # by hand: both are ring all-reduces, so 2(N−1)/N cancels: Ψ = 1,242 elements against P and Q's
    # 174 + 160 = 334, 3.72×, up to the rings' chunk rounding
    assert psi == 1242 and rec["compression"]["compression_ratio"] == pytest.approx(1242 / 334, rel=0.01)


def test_the_emulated_link_changes_time_only(small):
    rec = {r["milestone"]: r for r in small["milestones"]}
    real, slow = rec["compression"], rec["compression-slow-link"]
    assert real["link_gbps"] is None and slow["link_gbps"] == impact.Config().link_gbps == 0.01
    assert all(r["link_gbps"] is None for r in small["milestones"] if r is not slow)
    assert real["losses"] == slow["losses"]  # the link only sleeps: the same computation, bit for bit
    # every transfer is held at least latency + bytes/bandwidth: 3 ring all-reduces of 2(N−1)
    # messages each, and the bytes this rank sends — a lower bound that holds on any machine
    sent = max(sum(comm.ring_bytes_sent(m, 4, 3, r) for m in POWERSGD_SIZES) for r in range(3))
    assert slow["median_step_s"] >= 3 * 2 * 2 * 100e-6 + sent * 8 / 0.01e9
    # the uncompressed ring's prediction on that link carries at least its own bytes' time (which of
    # the two is faster depends on the model's size: on this tiny model PowerSGD's extra messages
    # can cost more latency than its bytes save)
    c = impact.Config(**SMALL)
    psi = mlp_param_count(c.d_in, c.hidden, c.depth, c.classes)
    plain = max(comm.ring_bytes_sent(psi, 4, 3, r) for r in range(3))
    assert slow["predicted_uncompressed_step_s"] >= plain * 8 / 0.01e9
    assert "predicted_uncompressed_step_s" not in real


def test_memory_per_rank_falls_with_each_zero_stage(small):
    rec = {r["milestone"]: r for r in small["milestones"]}
    states = [max(m["params"] + m["grads"] + m["optimizer"] for m in rec[f"zero-{s}"]["peak_memory_per_rank"])
              for s in (1, 2, 3)]
    assert states[0] > states[1] > states[2]
    # a pipeline stage holds only its layers; a data-parallel rank holds them all
    assert max(m["params"] for m in rec["pipeline"]["peak_memory_per_rank"]) < \
        rec["ring"]["peak_memory_per_rank"][0]["params"]


@pytest.mark.numerics
def test_the_same_computation_gives_the_same_losses(small):
    """Sync parameter server, ring and pipeline are all SGD (momentum 0.9) on the same batches; ZeRO
    stages are one Adam. Float32 sums in another order differ by ~1e-7 of an O(1) loss per step;
    over 12 steps at lr 0.1 that stays far below 1e-4."""
    rec = {r["milestone"]: r for r in small["milestones"]}
    for name in ("parameter-server", "pipeline"):
        for a, b in zip(rec[name]["losses"], rec["ring"]["losses"]):
            assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), name
    assert rec["zero-1"]["losses"] == rec["zero-2"]["losses"] == rec["zero-3"]["losses"]  # bit for bit


def test_reached_at_uses_the_window_mean():
    losses = [3.0, 2.0, 1.0, 0.5, 0.4]
    assert impact.smoothed(losses, 2) == [3.0, 2.5, 1.5, 0.75, 0.45]
    assert impact.reached_at(losses, 1.0, 2) == 4  # step 3 alone is 1.0, but its window mean is 1.5
    assert impact.reached_at(losses, 1.0, 1) == 3
    assert impact.reached_at(losses, 0.1, 2) is None
    assert impact.reached_at([0.1, 0.1], 1.0, 5) is None  # fewer steps than the window


def test_predictions_follow_the_formulas_by_hand():
    cfg = impact.Config(**SMALL).validate()
    subs = impact.plans(cfg)
    probe = {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "flops": 1e9}
    psi, n, b = mlp_param_count(32, 16, 3, 10), 3, 96
    ring = impact.predict("ring", subs["ring"][1], probe)
    assert math.isclose(ring["compute"], 6 * psi * b / n / 1e9)
    assert math.isclose(ring["comm"], costmodel.ring_time(4 * psi, n, 1e-3, 1e-9)
                        + costmodel.ring_time(4, n, 1e-3, 1e-9))
    # the same, written out (chapter 2's ring, α = 1 ms, β = 1 ns/byte, N = 3): 2(N−1)α + 2(N−1)/N·S·β
    # for the 4Ψ bytes of gradients and again for the 4-byte loss
    by_hand = lambda nbytes: 2 * 2 * 1e-3 + 2 * 2 / 3 * nbytes * 1e-9
    assert math.isclose(ring["comm"], by_hand(4 * psi) + by_hand(4))
    ps = impact.predict("parameter-server", subs["parameter-server"][1], probe)
    assert math.isclose(ps["comm"], 2 * 2 * (1e-3 + 4 * psi * 1e-9))  # 2·N·S/K with N=2, K=1
    z1, z3 = (impact.predict(m, subs[m][1], probe)["comm"] for m in ("zero-1", "zero-3"))
    loss = costmodel.ring_time(4, n, 1e-3, 1e-9)
    assert math.isclose((z3 - loss) / (z1 - loss), 1.5)
    psgd = impact.predict("compression", subs["compression"][1], probe)
    assert math.isclose(psgd["compute"], ring["compute"])
    assert math.isclose(psgd["comm"], sum(costmodel.ring_time(4 * m, n, 1e-3, 1e-9) for m in POWERSGD_SIZES)
                        + loss)
    assert math.isclose(psgd["comm"], sum(by_hand(4 * m) for m in POWERSGD_SIZES) + by_hand(4))
    # on the emulated 0.01 Gbit/s link with a fast real one: 3 all-reduces (P with the biases, Q, the
    # loss) of 2(N−1) = 4 messages, 100 µs each, + the bytes sent
    fast = {**probe, "alpha_s": 1e-7}
    slow = impact.predict("compression-slow-link", subs["compression-slow-link"][1], fast)
    sent = max(sum(comm.ring_bytes_sent(m, 4, n, r) for m in POWERSGD_SIZES) for r in range(n))
    assert math.isclose(slow["comm"], 12 * 100e-6 + sent * 8 / 0.01e9)


@pytest.mark.parametrize("options, name", [
    (dict(preset="huge"), "preset"),
    (dict(milestones="ring,bagua"), "milestones"),
    (dict(milestones=""), "milestones"),
    (dict(world_size=1), "world_size"),
    (dict(target_loss=-1.0), "target_loss"),
    (dict(sgd_lr=0.0), "sgd_lr"),
    (dict(window=0), "window"),
    (dict(link_gbps=0.0), "link_gbps"),
    (dict(link_latency_us=-1.0), "link_latency_us"),
    (dict(global_batch=95), "global_batch"),  # not divisible by 3 ranks
    (dict(world_size=6, global_batch=60), "stages"),  # a 6-stage pipeline of a 4-layer model
])
def test_bad_input_names_the_parameter_before_any_worker_starts(options, name):
    before = len(worker_children())
    with pytest.raises(ValueError, match=name):
        run("impact", impact.Config(**{**SMALL, **options}))
    assert len(worker_children()) == before


def test_cli_writes_one_record_per_milestone(tmp_path):
    out = tmp_path / "impact.json"
    proc = cli_in_process("run", "impact", "--preset", "quick", "--hidden", "16", "--samples", "1024",
                          "--steps", "6", "--large-batch-steps", "4", "--target-loss", "2.3",
                          "--milestones", "parameter-server,ring,zero-3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "step 18/18" in proc.stderr  # one progress bar over the three milestones' 6 steps
    records = json.loads(out.read_text())["milestones"]
    assert [r["milestone"] for r in records] == ["parameter-server", "ring", "zero-3"]
    assert all(KEYS <= set(r) for r in records)


def test_progress_bar_runs_over_every_milestone():
    import io

    from lesson_lib.__main__ import _Progress

    out = io.StringIO()
    bar = _Progress(steps=3, stream=out)
    step = lambda rank, i: bar({"kind": "step", "rank": rank, "step": i, "loss": 1.0})
    for rank in (0, 1):
        bar({"kind": "milestone", "rank": rank, "name": "a", "steps": 3, "offset": 0, "total": 5})
    step(0, 0), step(0, 1), step(0, 2)
    bar({"kind": "milestone", "rank": 0, "name": "b", "steps": 2, "offset": 3, "total": 5})
    step(0, 0)
    step(1, 2)  # a slower rank still finishing the first milestone: the bar does not move back
    assert out.getvalue().split("\r")[-1] == f"[{'#' * 24:<30}] step 4/5 loss 1.0000"
    step(0, 1)
    assert out.getvalue().endswith("step 5/5 loss 1.0000\n")


# --------------------------------------------------------------------------- exercises


@pytest.fixture(scope="module")
def exercises():
    return ex7.exercises()


def test_every_reference_answer_is_accepted(exercises):
    for key, e in exercises.items():
        assert e.submit(e.reference()).ok, key


def test_days_and_link_accept_answers_worked_without_the_checkers_code(exercises):
    # days: 8·T·Ψ/(n·X) = 8 × 300e9 × 175e9 / (1,024 × 140e12) s = 2.93e6 s = 33.9 days
    assert exercises["days"].submit(33.9)
    # link: the largest of the estimate's terms (each checked by tests/test_costmodel.py), and the step
    # with only the bandwidth term divided by 10 — summed here, not by ch07_exercises.faster_link
    t = ex7.link_case()["terms"]
    largest = max(costmodel.TERMS, key=t.get)
    assert largest == "bandwidth"
    faster = sum(t[k] / (10 if k == "bandwidth" else 1) for k in costmodel.TERMS)
    assert exercises["link"].submit((largest, faster))


def test_templates_are_not_answered_yet(exercises):
    def template(send, recv):
        ...

    assert exercises["days"].submit(...).message == "not answered yet"
    assert exercises["link"].submit(...).message == "not answered yet"
    assert exercises["pingpong"].submit(template).message == "not answered yet"


@pytest.mark.parametrize("answer, says", [
    (33.9 * 6 / 8, "6·Ψ"), (33.9 * 140 / 312, "peak"), (33.9 * 86400, "seconds"), (33.9 * 24, "hours"),
    (33.9 * 1024, "one device"), (12.0, "8·T·Ψ/(n·X)"),
])
def test_days_rejects_plausible_mistakes(exercises, answer, says):
    v = exercises["days"].submit(answer)
    assert not v.ok and says in v.message


@pytest.mark.parametrize("answer, says", [
    (0, "still holds"), (1, "still holds"), (3, "smaller stage"), (2.5, "ZeRO stage"), (True, "ZeRO stage"),
    ("two", "ZeRO stage"), (4, "ZeRO stage"),
])
def test_stage_rejects_plausible_mistakes(exercises, answer, says):
    v = exercises["stage"].submit(answer)
    assert not v.ok and says in v.message


@pytest.mark.parametrize("answer", [2, 2.0, "2", torch.tensor(2), "stage 2", "ZeRO-2", "zero stage 2"])
def test_stage_accepts_the_stage_in_every_form(exercises, answer):
    assert exercises["stage"].submit(answer)


def test_link_rejects_plausible_mistakes(exercises):
    e = ex7.link_case()
    t = e["terms"]
    cases = [
        (("compute", 33.2), "not the largest"),
        (("network", 33.2), "one of"),
        (("bandwidth", e["step_s"] / 10), "only the time spent moving bytes"),
        (("bandwidth", t["compute"] + (t["bandwidth"] + t["latency"]) / 10), "latency α stays"),
        (("bandwidth", e["step_s"]), "divide"),
        ("bandwidth", "pair"),
        (("bandwidth", "soon"), "pair"),
    ]
    for answer, says in cases:
        v = exercises["link"].submit(answer)
        assert not v.ok and says in v.message, (answer, v.message)


def torch_send_recv(send, recv):  # right, with torch's own calls
    if dist.get_rank() == 0:
        dist.send(send, 1)
        dist.recv(recv, 1)
    else:
        dist.recv(recv, 0)
        dist.send(recv, 0)


def echoes_its_own_buffer(send, recv):
    if dist.get_rank() == 0:
        comm.send(send, 1)
        comm.recv(recv, 1)
    else:
        comm.recv(recv, 0)
        comm.send(send, 0)  # rank 1's own (zero) buffer, not what arrived


def only_one_way(send, recv):
    if dist.get_rank() == 0:
        comm.send(send, 1)
    else:
        comm.recv(recv, 0)


def replies_before_the_ping_arrives(send, recv):  # once accepted: right values from a stale buffer
    if dist.get_rank() == 0:
        comm.send(send, 1)
        comm.recv(recv, 1)
    else:
        reply = dist.isend(recv, 0)  # posted before the ping has arrived
        dist.recv(recv, 0)
        reply.wait()


def replies_before_its_receive_completes(send, recv):  # the receive posted first, the reply too soon
    if dist.get_rank() == 0:
        comm.send(send, 1)
        comm.recv(recv, 1)
    else:
        ping = dist.irecv(recv, 0)
        reply = dist.isend(recv, 0)  # after the receive was posted, before the ping has arrived
        ping.wait()
        reply.wait()


def echoes_and_overlaps_correctly(send, recv):  # right: rank 0 posts its receive first, then sends
    if dist.get_rank() == 0:
        back = dist.irecv(recv, 1)
        dist.send(send, 1)
        back.wait()
    else:
        dist.recv(recv, 0)
        dist.send(recv, 0)


def both_receive_first(send, recv):
    other = 1 - dist.get_rank()
    comm.recv(recv, other)
    comm.send(send, other)


@pytest.mark.parametrize("fn", [torch_send_recv, echoes_and_overlaps_correctly])
def test_pingpong_accepts_torch_point_to_point_too(exercises, fn):
    v = exercises["pingpong"].submit(fn)
    assert v.ok and "one message each way" in v.message, v.message


@pytest.mark.parametrize("fn, says", [
    (echoes_its_own_buffer, "must return what it received"),
    (only_one_way, "one message each way"),
    (replies_before_the_ping_arrives, "before its receive of the ping"),
    (replies_before_its_receive_completes, "before its receive of the ping"),
    pytest.param(both_receive_first, "WorkerTimeout", marks=pytest.mark.slow),  # waits out a timeout
])
def test_pingpong_rejects_plausible_mistakes(exercises, fn, says):
    v = exercises["pingpong"].submit(fn)
    assert not v.ok and says in v.message, v.message


def test_talk_chart_draws_both_overlaps_and_marks_the_compression_bound():
    from lesson_lib import plots
    from lesson_lib.costmodel import claims

    by = claims.chart(175e9, 300e9, 1024)
    fig = plots.impact.talk_chart(by, "GPT-3", ["an assumption"])
    days = [t for t in fig.data if t.xaxis == "x" and t.showlegend is False]  # legend swatches apart
    assert [t.name.split(" (")[0] for t in days] == ["overlap 0", "overlap 1"]
    for trace, ov in zip(days, (0.0, 1.0)):
        assert list(trace.y) == [r["days"] for r in by[ov]]
        assert list(trace.text) == [f"{r['days']:.3g} d" for r in by[ov]]
    labels = dict(zip([r["milestone"] for r in by[0.0]], days[0].x))
    assert "bound: no extra steps" in labels["compression"] and "bound" not in labels["lamb"]
    assert "does not fit" in labels["ring"] and "does not fit" not in labels["zero-3"]
    more = costmodel.estimate(costmodel.plan_for("compression", 175e9, 300e9, 1024, extra_steps=0.1))
    assert "bound" not in plots.impact.bar_text({**more, "milestone": "compression"})


def test_published_check_compares_each_run_in_the_units_its_paper_gives():
    from lesson_lib.chapters import ch07

    rows = {r["case"]: r for r in ch07.published_check()}
    assert {r["use"] for r in rows.values()} == {"calibration", "out-of-sample", "sanity-check"}
    mt = rows["mt-nlg-530b"]
    assert mt["unit"] == "TFLOP/s" and mt["time_unit"] == "s/step" and mt["published_time"] == 60.1
    assert math.isclose(mt["time_error"], mt["estimate"]["step_s"] / 60.1 - 1)
    assert rows["llama-65b"]["unit"] == "tokens/s" and rows["llama-65b"]["time_unit"] == "days"
