"""The pipeline's results (chapter 3): the summary of a run (bubble measured, replayed and by cause;
memory per stage; bytes), and the checks against single-process training of the unsplit model.
"""

from __future__ import annotations

import statistics

import torch

from ...costmodel.terms import bubble_formula
from ...models import fit_whole_batch, flat_views, mlp, mlp_param_count
from . import interleaved as il
from . import zero_bubble as zb
from .config import Config
from .schedules import all_actions, bubble_breakdown, message_delays, step_bubbles
from .stage import worker


def summarize(cfg: Config, outs: list[dict]) -> dict:
    events = sorted((e for o in outs for e in o["events"]), key=lambda e: e["start"])
    measured = list(range(1, cfg.steps)) or [0]  # step 0 pays one-off costs
    if cfg.schedule == "interleaved":
        return _summarize_interleaved(cfg, outs, events, measured)
    if cfg.schedule == zb.SCHEDULE:
        return _summarize_zero_bubble(cfg, outs, events, measured)
    actions = all_actions(cfg.schedule, cfg.stages, cfg.m)
    bubbles = [step_bubbles(actions, events, s) for s in range(cfg.steps)]
    causes = [bubble_breakdown(actions, events, s) for s in measured]
    B, H = cfg.global_batch, cfg.hidden
    return {
        "losses": outs[-1]["losses"], "events": events,
        "bubble_wall": statistics.median(bubbles[s]["wall"] for s in measured),
        "bubble_busy": statistics.median(bubbles[s]["busy"] for s in measured),
        "bubble_formula": bubble_formula(cfg.stages, cfg.m), "bubble_per_step": bubbles,
        "bubble_breakdown": _median_breakdown(causes),
        "message_delays_s": sorted(d for s in measured for d in message_delays(events, s).values()),
        "microbatches_run": cfg.m, "partition": [list(b) for b in outs[0]["bounds"]],
        "layer_costs": outs[0]["costs"],
        "stage_memory": [{"stage": o["stage"], "layers": list(o["bounds"][o["stage"]]),
                          "param_bytes": o["per_rank"]["memory"]["params"],
                          "activation_peak": o["activation_peak"],
                          "activation_per_microbatch": o["activation_per_microbatch"],
                          "max_in_flight": o["max_in_flight"], **_measured(o)} for o in outs],
        "unsplit_param_bytes": 4 * mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes),
        # per step, each stage boundary carries the whole batch's activations one way, grads the other
        "bytes_per_step_formula": {"send_activation": 4 * B * H, "send_grad": 4 * B * H},
    }


def _summarize_interleaved(cfg: Config, outs: list[dict], events: list[dict], measured: list[int]) -> dict:
    """Interleaved 1F1B's run: the bubble on the wall clock and replayed from busy time against
    (P−1)/(v·M+P−1), and the messages it sent, counted, per micro-batch."""
    P, M, v = cfg.stages, cfg.m, cfg.chunks
    bubbles = [il.measured_bubbles(il.all_interleaved(P, M, v), events, s) for s in range(cfg.steps)]
    return {
        "losses": outs[-1]["losses"], "events": events, "bubble_per_step": bubbles,
        "bubble_wall": statistics.median(bubbles[s]["wall"] for s in measured),
        "bubble_busy": statistics.median(bubbles[s]["busy"] for s in measured),
        "bubble_formula": bubble_formula(P, M, v), "microbatches_run": M, "chunks": v,
        "messages_per_microbatch": _messages_per_microbatch(cfg, outs),
        "partition": [list(b) for b in outs[0]["bounds"]], "layer_costs": outs[0]["costs"],
        "max_in_flight": [o["max_in_flight"] for o in outs]}


def _messages_per_microbatch(cfg: Config, outs: list[dict]) -> dict:
    calls = {op: sum(o["per_rank"]["ops"].get(op, {"calls": 0})["calls"] for o in outs)
             for op in ("send_activation", "send_grad")}
    return {op: n / (cfg.steps * cfg.m) for op, n in calls.items()}


def _summarize_zero_bubble(cfg: Config, outs: list[dict], events: list[dict], measured: list[int]) -> dict:
    """ZB-H1's run: the bubble on the wall clock and replayed from busy time (F, B and W each its own
    action), beside the replay at F = B = W; the messages sent, counted, per micro-batch."""
    acts = zb.all_zb_h1(cfg.stages, cfg.m)
    bubbles = [zb.measured_bubbles(acts, events, s) for s in range(cfg.steps)]
    return {
        "losses": outs[-1]["losses"], "events": events, "bubble_per_step": bubbles,
        "bubble_wall": statistics.median(bubbles[s]["wall"] for s in measured),
        "bubble_busy": statistics.median(bubbles[s]["busy"] for s in measured),
        "bubble_formula": float(zb.idle(zb.replay(acts, zb.equal_durations(acts)))["idle_share"]),
        "microbatches_run": cfg.m, "messages_per_microbatch": _messages_per_microbatch(cfg, outs),
        "partition": [list(b) for b in outs[0]["bounds"]], "layer_costs": outs[0]["costs"],
        "max_in_flight": [o["max_in_flight"] for o in outs]}


def _measured(out: dict) -> dict:
    """With ``peak_memory``: the allocator's peak of the last step above what was alive at its start
    (parameters, gradients, momentum), a measurement beside the saved-tensor inventory."""
    m = out["per_rank"]["memory"]
    if "measured_peak" not in m:
        return {}
    return {"measured_step_peak": m["measured_peak"] - m["measured_at_reset"],
            "measured_at_reset": m["measured_at_reset"], "measured_method": m["measured_method"]}


def _median_breakdown(causes: list[dict]) -> dict:
    """Each rung of :func:`bubble_breakdown`, its pace and each per-stage figure: its median over steps."""
    med = {k: statistics.median(c[k] for c in causes) for k in ("busy", "messages", "wall")}
    # each step's busy lies in its range, so the median does in the medians' (order statistics keep order)
    med["busy_bounds"] = tuple(statistics.median(c["busy_bounds"][j] for c in causes) for j in (0, 1))
    # the lower median: a step's own figures, so that the stages rung stays paced_bubble of its pace
    # (one grows with the other)
    med.update({k: statistics.median_low(c[k] for c in causes) for k in ("stages", "pace")})
    figures = ("forward", "backward", "off_core", "recv", "between")
    med["per_stage"] = [{"stage": s["stage"], **{k: statistics.median(c["per_stage"][i][k] for c in causes)
                                                 for k in figures}}
                        for i, s in enumerate(causes[0]["per_stage"])]
    return med


def reference(cfg: Config) -> dict:
    """Single-process SGD (momentum 0.9) of the unsplit model on the whole batch, no process group:
    ``losses`` per step (those of ``data_parallel.reference(cfg, "sgd")``), the final ``params``
    and the last step's ``grads`` (flat, in layer order)."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    flat, grads = flat_views(model)
    losses = fit_whole_batch(cfg, model, torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9))
    return {"losses": losses, "params": flat.detach().clone(), "grads": grads.clone()}


def state(outs: list[dict]) -> dict:
    """The pipeline's losses, final parameters and last gradients, stages joined in layer order
    (interleaved: chunk c of rank r is piece c·P + r)."""
    if not {"params", "chunk_params"} & set(outs[0]):
        off = [name for name, p in Config.PRESETS.items() if p.get("return_params") is False]
        raise ValueError(f"these stages sent no parameters back: run with return_params=True "
                         f"(the {' and '.join(off)} presets turn it off)")
    if "chunk_params" in outs[0]:
        P, pieces = len(outs), len(outs) * len(outs[0]["chunk_params"])
        return {"losses": outs[-1]["losses"],
                **{key: torch.cat([outs[s % P][f"chunk_{key}"][s // P] for s in range(pieces)])
                   for key in ("params", "grads")}}
    return {"losses": outs[-1]["losses"], "params": torch.cat([o["params"] for o in outs]),
            "grads": torch.cat([o["grads"] for o in outs])}


def gaps(a: dict, b: dict) -> dict:
    """Largest absolute differences of losses, parameters and gradients between two runs."""
    return {"losses": max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True)),
            "params": (a["params"] - b["params"]).abs().max().item(),
            "grads": (a["grads"] - b["grads"]).abs().max().item()}


def verify(cfg: Config, cluster) -> dict:
    """Run the pipeline on ``cluster`` and compare it with :func:`reference` (``gaps``)."""
    cfg = cfg.replace(return_params=True)  # the checks need them, whatever the preset
    return gaps(state(cluster.run(worker, cfg)), reference(cfg))
