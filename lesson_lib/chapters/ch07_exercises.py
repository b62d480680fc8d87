"""Chapter 7's exercises: GPT-3's days by hand, the smallest ZeRO stage that fits, which term
dominates and what a 10× faster link buys, and a ping-pong on real ranks that measures α and β."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from .. import comm, costmodel
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    borrowed,
    duration,
    duration_slip,
    judge,
    observe,
    on_ranks,
    stage,
    summary,
    unobserved,
    values_of,
)
from ..source import source

# Narayanan et al. (SC21): GPT-3 175B, 300B tokens, 1,024 A100s at 140 TFLOP/s each.
DAYS_CASE = {"params": 175e9, "tokens": 300e9, "devices": 1024, "flops": 140e12}
# Chapter 4's formulas (model states only, mixed-precision Adam): a 13B model on 16 A100-40GB.
FIT_CASE = {"params": 13e9, "devices": 16, "device": "a100-40gb"}
# The modelled step of GPT-3 under ZeRO-3 on the named cluster (costmodel.plan_for).
LINK_CASE = {"milestone": "zero-3", "params": 175e9, "tokens": 300e9, "devices": 1024}


def gpt3_days(params, tokens, devices, flops) -> float:
    return 8 * tokens * params / (devices * flops) / 86400


def _check_days(answer) -> Verdict:
    value = duration(answer, "days", "a number of days")  # also "34 days", a timedelta, {"days": 34}
    c = DAYS_CASE
    expected = gpt3_days(**c)
    if math.isclose(value, expected, rel_tol=0.02):
        return Verdict(True, f"{value:.1f} days; Narayanan et al. report about 34")
    wrong = {gpt3_days(**c) * 6 / 8: "that is 6·Ψ per token: they also recompute the forward pass",
             gpt3_days(**{**c, "flops": 312e12}): "that uses the A100's peak; use the rate achieved",
             expected * 86400: "that is in seconds", expected * 24: "that is in hours",
             expected * 1024: "that is one device's time: the work is shared by all of them"}
    for v, why in wrong.items():
        if math.isclose(value, v, rel_tol=0.02):
            return Verdict(False, why)
    slip = duration_slip(value, expected, "days")  # 4.84: right in weeks
    return Verdict(False, slip or f"you said {value:g}; write 8·T·Ψ/(n·X) with the numbers above, in days")


def fit_stage(params, devices, device) -> int:
    cap = costmodel.devices()[device]["memory"]
    return next(s for s in (0, 1, 2, 3) if costmodel.zero_memory(params, devices, s, "mixed")["total"] <= cap)


def _check_stage(answer) -> Verdict:
    answer = stage(answer, "a ZeRO stage: 0, 1, 2 or 3")  # "stage 2", "ZeRO-2" too
    if answer not in (0, 1, 2, 3):
        return Verdict(False, "answer with a ZeRO stage: 0, 1, 2 or 3")
    c = FIT_CASE
    cap = costmodel.devices()[c["device"]]["memory"]
    held = costmodel.zero_memory(c["params"], c["devices"], answer, "mixed")["total"]
    if held > cap:
        return Verdict(False, f"at stage {answer} each device still holds {held / 1e9:.1f} GB of model "
                              f"state, more than its {cap / 2**30:g} GB ({cap / 1e9:.1f}e9 bytes)")
    if answer > fit_stage(**c):
        return Verdict(False, f"stage {answer} fits, but so does a smaller stage, with less traffic")
    return Verdict(True, f"stage {answer}: {held / 1e9:.1f} GB of model state per device "
                         f"(activations come on top)")


def link_case() -> dict:
    c = LINK_CASE
    return costmodel.estimate(costmodel.plan_for(c["milestone"], c["params"], c["tokens"], c["devices"]))


def faster_link(e: dict) -> tuple[str, float]:
    t = e["terms"]  # a 10× faster link: 10× the bandwidth; the latency α is not the link's speed
    return e["dominant"], t["compute"] + t["bubble"] + t["bandwidth"] / 10 + t["latency"] + t["tensor"]


def _link_solution() -> str:
    e = link_case()
    term, seconds = faster_link(e)
    return (f"('{term}', {seconds:.4g}): {term} is the largest term; with 10× the bandwidth the step is "
            "compute + bubble + bandwidth/10 + latency + tensor = "
            + " + ".join(f"{e['terms'][k] / (10 if k == 'bandwidth' else 1):.4g}"
                         for k in ("compute", "bubble", "bandwidth", "latency", "tensor")) + " s.")


def _check_link(answer) -> Verdict:
    what = "a pair: (term, step seconds with the faster link)"
    if isinstance(answer, dict) and len(answer) == 1 and str(*answer).strip().lower() in costmodel.TERMS:
        answer = tuple(*answer.items())  # {"bandwidth": 1.23}: the term, keyed to the step's seconds
    term, seconds = values_of(answer, 2, what, names=(("term", "dominant"),
                                                      ("seconds", "step_s", "step", "s")))
    seconds = duration(seconds, "s", what)
    e = link_case()
    term = str(term).strip().strip("'\"").lower()
    if term not in costmodel.TERMS:
        return Verdict(False, f"the term is one of {', '.join(costmodel.TERMS)}")
    if term != e["dominant"]:
        return Verdict(False, f"{term} is not the largest of the terms printed above")
    good = faster_link(e)[1]
    t = e["terms"]
    if math.isclose(seconds, e["step_s"] / 10, rel_tol=0.02):
        return Verdict(False, "a faster link speeds up only the time spent moving bytes")
    if math.isclose(seconds, good - t["latency"] * 0.9, rel_tol=0.005):
        return Verdict(False, "a faster link carries more bytes per second; its latency α stays")
    if not math.isclose(seconds, good, rel_tol=0.02):
        return Verdict(False, f"you said {seconds:.3g} s; " + (duration_slip(seconds, good, "s") or
                              "keep compute, bubble and latency, divide the bandwidth term by 10"))
    new = max(("compute", t["compute"]), ("bandwidth", t["bandwidth"] / 10), key=lambda kv: kv[1])[0]
    return Verdict(True, f"{e['step_s']:.1f} s → {seconds:.1f} s per step: {e['step_s'] / seconds:.1f}× "
                         f"faster, not 10×; now {new} dominates")


# --------------------------------------------------------------------------- on real ranks

PING_SIZES = (4096, 1 << 18, 1 << 22)
PING_REPS = 5


def pingpong_harness(fn, sizes=PING_SIZES, reps: int = PING_REPS) -> dict:
    """On each of 2 ranks: rank 0's ``send`` holds a pattern, rank 1's zeros; after each of the
    learner's first two round trips (another pattern each time, so a stale buffer cannot pass) both
    ranks' ``recv`` must hold that round's pattern. Then times ``reps`` round trips, and observes the
    messages (:func:`~lesson_lib.exercises.observe`), whichever API sent them, with their times."""
    rank = dist.get_rank()
    barrier = unobserved(dist.barrier)  # the checker's own: not the learner's messages
    # the timed round trips call the learner's function itself: the watch for the library's own
    # ping_pong (a profile hook) runs on the checked ones; on the timed ones it would add to α
    timed = borrowed.unwatched(fn)
    rows = []
    with observe() as log:
        for size in sizes:
            ok = True
            for round_ in range(UNTIMED):  # the first round opens the connection: checked, not timed
                pattern = torch.arange(size // 4, dtype=torch.float32) + 1 + round_ * size
                send = pattern.clone() if rank == 0 else torch.zeros(size // 4)
                recv = torch.zeros(size // 4)
                fn(send, recv)
                ok = ok and torch.equal(recv, pattern)
            barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                timed(send, recv)
            rows.append({"size": size, "ok": ok, "one_way_s": (time.perf_counter() - t0) / reps / 2})
    calls = log.as_data()["calls"]
    return {"rank": rank, "rows": rows, "calls": calls,
            "sent": sum(c["bytes"] for c in calls if c["op"] == "send"),
            "recv": sum(c["bytes"] for c in calls if c["op"] == "recv")}


UNTIMED = 2  # checked round trips per size, each with its own pattern


def _arrives(outs: list[dict]) -> str | None:
    for o in outs:
        bad = [r["size"] for r in o["rows"] if not r["ok"]]
        if bad:
            who = "rank 1 did not receive rank 0's message" if o["rank"] == 1 else \
                "rank 0 did not get its own message back: rank 1 must return what it received"
            return f"{who} (at {bad[0]:,} bytes, in one of the first {UNTIMED} round trips)"


def _reply_after_the_ping(outs: list[dict]) -> str | None:
    """Rank 1's k-th reply leaves after its k-th receive has completed: a round trip's reply cannot
    start before the ping has arrived (a reply posted early sends whatever the buffer held before)."""
    calls = outs[1]["calls"]
    sends = [c for c in calls if c["op"] == "send"]
    recvs = [c for c in calls if c["op"] == "recv"]
    for k, (got, reply) in enumerate(zip(recvs, sends)):
        if got["done"] is None or reply["start"] < got["done"]:
            return (f"rank 1 started reply {k + 1} ({reply['api']}) before its receive of the ping "
                    f"({got['api']}) had completed: a reply that leaves before the ping arrives sends what "
                    "the buffer held before, right only when the last message happened to be the same")


def _one_message_each_way(outs: list[dict]) -> str | None:
    expected = (PING_REPS + UNTIMED) * sum(PING_SIZES)
    for o in outs:
        if (o["sent"], o["recv"]) != (expected, expected):
            return (f"rank {o['rank']} sent {o['sent']:,} B and received {o['recv']:,} B over all "
                    f"{PING_REPS + UNTIMED} round trips of each size ({summary(o['calls'])}); one round trip "
                    f"is one message each way, {expected:,} B in all")


def _check_pingpong(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(ping_pong)")
    outs: list[dict] = []
    case = on_ranks("2 ranks", 2, pingpong_harness, fn, timeout_s=10, then=lambda o: outs.extend(o) or o)
    v = judge([case], [
        Property("one message each way per round trip", _one_message_each_way),
        Property("rank 1 replies only after the ping has arrived", _reply_after_the_ping),
        Property("rank 0's message reaches rank 1 and comes back", _arrives)])
    if not v:
        return v
    rows = outs[0]["rows"]
    fit = costmodel.fit_point_to_point([r["size"] for r in rows], [r["one_way_s"] for r in rows])
    ring = costmodel.ring_time(16e6, 4, fit["alpha_s"], fit["beta_s_per_byte"])
    return Verdict(True, f"{v.message}. On this machine α ≈ {fit['alpha_s'] * 1e6:.0f} µs and 1/β ≈ "
                         f"{fit['bandwidth_GBps']:.2f} GB/s (noisy on shared cores); fed to the cost "
                         f"model, a 16 MB ring all-reduce on 4 such ranks takes about {ring * 1e3:.0f} ms")


def ping_pong(send, recv):
    if dist.get_rank() == 0:
        comm.send(send, 1)
        comm.recv(recv, 1)
    else:
        comm.recv(recv, 0)
        comm.send(recv, 0)  # back what arrived


def exercises() -> dict[str, Exercise]:
    d, f, k = DAYS_CASE, FIT_CASE, LINK_CASE
    dev = costmodel.devices()[f["device"]]["name"]
    return {
        "days": Exercise(
            key="days", title="GPT-3's training time by hand",
            prompt=f"GPT-3 has Ψ = {d['params']:.3g} parameters and was trained on T = {d['tokens']:.3g} "
                   f"tokens. On n = {d['devices']:,} A100s each delivering X = {d['flops'] / 1e12:g} "
                   "TFLOP/s, how many days does 8·T·Ψ/(n·X) give? A number of days, a text with its "
                   "units (<code>\"30 days\"</code>, <code>\"4 weeks, 2 days\"</code>) or a "
                   "<code>datetime.timedelta</code>.",
            check=_check_days,
            hint="8 FLOPs per parameter per token (6 for forward and backward, 2 to recompute the forward); "
                 "a day is 86,400 s.",
            solution=f"8 × {d['tokens']:.3g} × {d['params']:.3g} / ({d['devices']} × {d['flops']:.3g}) / "
                     f"86400 = {gpt3_days(**d):.1f} days", reference=lambda: gpt3_days(**d)),
        "stage": Exercise(
            key="stage", title="the smallest ZeRO stage that fits",
            prompt=f"A {f['params']:.3g}-parameter model is trained with mixed-precision Adam on "
                   f"{f['devices']} × {dev}. Counting model states only (chapter 4's formulas), what is the "
                   "smallest ZeRO stage at which they fit on one device?",
            check=_check_stage,
            hint="costmodel.zero_memory(params, devices, stage, 'mixed') gives the bytes per device; "
                 "compare them with the device's memory.",
            solution=f"stage {fit_stage(**f)}", reference=lambda: fit_stage(**f)),
        "link": Exercise(
            key="link", title="which term dominates, and a 10× faster link",
            prompt=f"Model GPT-3 under {k['milestone']} on {k['devices']:,} A100s with HDR InfiniBand "
                   "(<code>costmodel.estimate(costmodel.plan_for(...))</code>, printed above). Which term "
                   "dominates the step, and how many seconds is a step when the link carries 10× the "
                   "bandwidth? Answer <code>(term, seconds)</code> or <code>{term: seconds}</code>; the "
                   "seconds may carry a unit (<code>\"850 ms\"</code>).",
            check=_check_link, hint="Only the bandwidth term depends on the link's bandwidth.",
            solution=_link_solution(), reference=lambda: faster_link(link_case())),
        "pingpong": Exercise(
            key="pingpong", title="write it: a ping-pong that measures α and β, on real ranks",
            prompt="Write <code>ping_pong(send, recv)</code>, run on 2 ranks: rank 0 sends "
                   "<code>send</code> to rank 1 and receives the reply into <code>recv</code>; rank 1 "
                   "receives into <code>recv</code> and sends it back. Use "
                   "<code>comm.send</code>/<code>comm.recv</code> (or <code>dist.send</code>/"
                   "<code>dist.recv</code>). The check sees each message, times the round trips at 4 KB, "
                   "256 KB and 4 MB (10 s timeout), fits t = α + m·β and feeds α and β to the cost model.",
            check=_check_pingpong,
            hint="Half a round trip is one message; the order of send and receive must differ between the "
                 "two ranks.",
            solution=source(ping_pong).text, reference=lambda: ping_pong),
    }
