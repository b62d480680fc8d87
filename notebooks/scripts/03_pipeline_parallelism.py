# ---
# jupyter:
#   jupytext:
#     formats: ipynb,scripts//py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] slideshow={"slide_type": "slide"}
# # Chapter 3 — Pipeline parallelism
#
# Data parallelism (chapters 0–2) copies the whole model onto every device. When the model itself
# no longer fits, cut it instead: put layers 1–10 on device 1, layers 11–20 on device 2, and so on,
# like stations on an **assembly line**. Each device's share of consecutive layers is a **stage**.
# Activations (the layers' outputs) flow forward from stage to stage, gradients flow back, and each
# device holds only its share of the parameters.
#
# Cut naively, the line has a problem: while stage 2 works, stage 1 waits for its gradients — one
# stage busy at a time. The fix is to cut the batch too, into M **micro-batches**, so that stage 1
# starts on micro-batch 2 while stage 2 works on micro-batch 1. A **schedule** says in which order each
# stage runs its forwards and backwards. Two schedules made this practical:
#
# * **GPipe** (Huang et al., 2019): all M forwards, then all M backwards.
# * **1F1B**, or PipeDream-Flush (Narayanan et al., 2021), which grew out of PipeDream (Narayanan et
#   al., 2019) and is what Megatron-LM uses (Narayanan et al., 2021): after a short *warm-up* of
#   forwards, each stage alternates one forward and one backward, so it holds far fewer
#   micro-batches' activations at once.
#
# Everything below is measured from real processes: one rank per stage, activations and gradients
# sent point-to-point with `torch.distributed`. The model is a 10-layer MLP, where a *layer* is one
# `Linear` with the `ReLU` after it; stages get consecutive layers, balanced by parameter count.

# %% [markdown]
# **After this chapter you can:**
#
# 1. cut a model into stages on real ranks and train it to the same gradients as one process (§1–3, first exercise);
# 2. run GPipe and 1F1B and read their schedules on a timeline (§4, order exercise);
# 3. predict the bubble, (P−1)/(M+P−1), and explain where a real run lands and why: unequal stages set the pace (and under 1F1B can even pull the mean idle share below it), micro-batches vary, messages cost; and what interleaving v chunks per rank trades for its (P−1)/(v·M+P−1): v-fold messages (§5, bubble exercises);
# 4. compare the activations GPipe and 1F1B hold, and check our schedules against `torch.distributed.pipelining` (§6–7).
#
# **Before it:** chapter 0 (backward passes, `send`/`recv`).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
from fractions import Fraction

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_lib import numerics, show_source, warm_cluster
from lesson_lib.chapters import ch03
from lesson_lib.milestones import pipeline as pp
from lesson_lib.milestones.pipeline import comm as stage_comm  # noqa: F401  (the text points at stage_comm.StageLink)
from lesson_lib.milestones.pipeline import interleaved as il
from lesson_lib.milestones.pipeline import zero_bubble as zb
from lesson_lib.milestones.pipeline import zero_bubble_stage as zbs
from lesson_lib.milestones.pipeline.schedules import paced_bubble, stage_actions

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Cut the model
#
# Four stages, each holding two or three consecutive layers. The memory below is what each stage
# process really holds (the bytes of its parameter storage), beside the unsplit model.

# %%
split = ch03.split(stages=4)

# %%
assert sum(split["stage_bytes"]) == split["unsplit_bytes"]      # every parameter lives on exactly one stage
assert max(split["stage_bytes"]) < split["unsplit_bytes"] / 3   # each stage holds about a quarter

# %% [markdown] slideshow={"slide_type": "subslide"}
# Balancing by parameter count is a proxy; what matters is *time*, since the slowest stage sets the
# pace of the whole line. `balance="time"` instead measures each layer's forward and backward on a
# micro-batch and cuts so that stages take equal time (try it in the explorer below).
#
# ## 2. The same training, on a different machine
#
# Pipelining changes *where* and *when* the work happens, not what is computed. Each micro-batch's
# loss is scaled by 1/M, so the gradients summed over micro-batches are exactly the gradients of the
# whole batch's mean loss. For every schedule the losses, the gradients and the updated parameters
# must equal single-process SGD of the unsplit model on the whole batch, up to float rounding.

# %%
gaps = ch03.equivalence(stages=4, microbatches=4)

# %%
small = pp.Config.tiny()  # the small model of the equality checks
# float32 rounding of sums in another order: numerics.pipeline_tolerance?? says how much
tol = numerics.pipeline_tolerance(microbatches=4, steps=small.steps, depth=small.depth)
for schedule, g in gaps.items():
    assert max(g.values()) <= tol, (schedule, g, tol)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. One stage's loop, written out
#
# What does a stage actually do? Below is the whole training step of one pipeline stage, run on 4
# real processes (rank k is stage k). `stage_actions` gives the stage its schedule — a list like
# `F0 F1 F2 B0 F3 B1 …` — and the loop walks it:
#
# * **F i**: take micro-batch i's input (stage 0 reads the data, the others `recv` the activation
#   from stage k−1), run the stage's layers, and send the output to stage k+1. The input and output
#   stay in `held` until the backward: that is the activation memory.
# * **B i**: `recv` the gradient of the output from stage k+1 (the last stage starts from its loss),
#   backpropagate through the stage, and send the gradient of the input back to stage k−1.
#
# Sends are *posted* with `dist.isend` (started, not waited for) and waited for at the end of the
# step. With a blocking `dist.send`, 1F1B would **deadlock**, every rank waiting on another: a stage
# sending micro-batch i+1's activation waits until its neighbour receives it, while the neighbour is
# itself blocked sending micro-batch i's gradient back.

# %%
def my_pipeline(cfg):
    k, P, M = dist.get_rank(), dist.get_world_size(), cfg.microbatches
    stage, x_all, y_all, width = ch03.stage_setup(cfg, k)  # my layers; the data; my input's width
    sgd = torch.optim.SGD(stage.parameters(), lr=cfg.lr, momentum=0.9)
    losses = []
    for step in range(cfg.steps):
        mbs = ch03.microbatch_indices(cfg, step)  # the batch cut into M micro-batches
        sgd.zero_grad()
        held, sends, loss_sum = {}, [], 0.0
        for kind, i in stage_actions(cfg.schedule, P, M, k):  # e.g. F0 F1 F2 B0 F3 B1 ... B3
            if kind == "F":
                if k == 0:
                    x = x_all[mbs[i]]
                else:
                    x = torch.empty(len(mbs[i]), width)
                    dist.recv(x, k - 1)  # micro-batch i's activation, from the stage before
                    x.requires_grad_()
                out = stage(x)
                if k == P - 1:
                    out = F.cross_entropy(out, y_all[mbs[i]])
                    loss_sum += out.item()
                else:
                    sends.append(dist.isend(out.detach(), k + 1))  # posted, not waited for
                held[i] = (x, out)  # kept until its backward
            else:
                x, out = held.pop(i)
                if k == P - 1:
                    (out / M).backward()  # the batch's loss is the mean over its micro-batches
                else:
                    g = torch.empty_like(out)
                    dist.recv(g, k + 1)  # the gradient of my output, from the stage after
                    out.backward(g)
                if k > 0:
                    sends.append(dist.isend(x.grad, k - 1))  # the gradient of my input, back
        for s in sends:
            s.wait()
        sgd.step()
        losses.append(loss_sum / M)
    return losses, torch.cat([p.detach().reshape(-1) for p in stage.parameters()])


mine, library = {}, {}
for schedule in ("gpipe", "1f1b"):
    cfg = pp.Config.tiny(stages=4, microbatches=4, schedule=schedule)
    outs = warm_cluster(4).run(my_pipeline, cfg, timeout_s=30)
    mine[schedule] = {"losses": outs[-1][0], "params": torch.cat([o[1] for o in outs])}
    library[schedule] = pp.state(warm_cluster(4).run(pp.worker, cfg))
    print(f"{schedule}: losses {mine[schedule]['losses']}")

# %%
# The same operations in the same order as the library's stage: equal bit for bit, not just close.
for schedule in mine:
    assert mine[schedule]["losses"] == library[schedule]["losses"]
    assert torch.equal(mine[schedule]["params"], library[schedule]["params"])

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's stage, which every figure of this chapter runs, is the same loop plus what the
# figures need; the steps around the actions (`run_steps`) are shared with §5's schedules. It times every action, measures the activations it holds, and can balance the stages
# by measured time. It sends and receives on threads of its own (`stage_comm.StageLink`), so that the
# stage never stalls handing a message to Gloo. Its receives are posted ahead — all of a step's for
# GPipe, two for 1F1B — so that a neighbour's message can leave the moment it is computed.

# %%
show_source(pp.stage._train_stage, pp.loop.run_steps, stage_actions)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Watch the assembly line
#
# GPipe with 4 stages and 4 micro-batches. Every stage records each forward (blue), backward (green),
# send (orange, above) and receive (grey, below — mostly *waiting* for a neighbour) with its real start
# and end; the chart fills in as the stages report each step. Then one step up close.
#
# Where stages outnumber the cores, they take turns on them and the wall clock stretches. So each
# action's **busy time** (the stage's CPU time) is recorded too. **Replaying** the schedule with those
# times — each action starts when its stage and its input are ready — gives the timeline of a machine
# with one core per stage. The two panels are labelled: measured on the wall clock, and replayed
# from busy time.

# %%
r = ch03.live(stages=4, microbatches=4, schedule="gpipe")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the three schedules on the same model and the same batch. Naive: the whole batch at once, one
# stage busy at a time. GPipe: the forwards of all micro-batches, then the backwards. 1F1B: the same
# number of slots, but the backwards start as early as possible.

# %%
runs = ch03.schedules(stages=4, microbatches=4)

# %%
# One micro-batch through 4 stages is a relay: exactly one stage works at any moment.
assert abs(runs["naive"]["bubble_busy"] - 3 / 4) < 1e-9
assert runs["gpipe"]["bubble_busy"] < 0.6 and runs["1f1b"]["bubble_busy"] < 0.6

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. The bubble
#
# With P equal stages, a step takes M+P−1 *slots*, each one forward and one backward long, and each
# stage works in M of them. The idle share of every stage, the **bubble**, is (P−1)/(M+P−1). More
# micro-batches, smaller bubble. Below, the measured bubble for P = 2 and 4 stages as M grows: on the
# wall clock (crosses) and replayed from busy time (dots), beside the formula (dotted).
#
# The **busy-time** bubble is what shrinks (asserted below). The wall clock need not: here 4 stages
# share 2 cores, so a stage also waits for a core, and that wait does not shrink with M: the crosses
# may even rise from one M to the next. On a cluster, one device per stage, the wall clock follows
# the busy time plus the messages.

# %%
sweep = ch03.bubble_sweep(stages=(2, 4), microbatches=(1, 2, 4, 8))

# %%
for p in (2, 4):
    rows = [r for r in sweep if r["stages"] == p]
    busy = [r["busy"] for r in rows]
    assert all(a > b for a, b in zip(busy, busy[1:])), busy             # shrinks as M grows
    assert abs(rows[0]["busy"] - rows[0]["formula"]) < 1e-9             # M = 1: exactly (P−1)/P, a relay
    print(f"P={p}: busy-time bubble minus the formula, M = 1, 2, 4, 8: "
          + ", ".join(f"{r['busy'] - r['formula']:+.3f}" for r in rows))

# The formula is exact for equal stages, not a floor: under 1F1B a heavier first stage works while
# the others wait, and the mean idle share falls below it. Replayed: P = 2, M = 2, stage 0 twice as slow.
slow_first = {(s, k, i): 2.0 if s == 0 else 1.0 for s in range(2) for k in "FB" for i in range(2)}
uneven = pp.schedules.idle_share(pp.schedules.replay(pp.schedules.all_actions("1f1b", 2, 2), slow_first))
print(f"1F1B, P = 2, M = 2, stage 0 twice as slow: idle share {uneven:.1%}, the formula {1 / 3:.1%}")
assert uneven < 1 / 3

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Where the extra idle time goes
#
# The formula assumes every forward and every backward takes the same time and that messages are
# free. A real run breaks both, and each cause can be measured in the same run. Rebuild the bubble
# one cause at a time, replaying the run's own schedule with:
#
# 1. each stage's *mean* forward and backward (busy time) — what **unequal stages** cost: the
#    slowest stage sets the pace of the whole line;
# 2. each action's own busy time — adds the **variation between micro-batches**: a stage that
#    waits for a slower neighbour turns that variation into idle time;
# 3. then the wall clock itself — adds what a real machine adds: **messages** (printed: how long
#    each took from the neighbour finishing to the message landing), the stage's own work
#    **between actions**, and **cores shared** with other threads and processes (a stage that is
#    off its core for a while makes its neighbour wait).
#
# Below: GPipe on 2 stages, on a model whose stages do equal work: 16 hidden layers, 8 per stage.
# Micro-batches of 128–256 samples make a forward take several milliseconds and a message a small
# fraction of one. Then the same model with one hidden layer fewer: 15 do not split evenly, so stage 0
# gets 7 and stage 1 gets 8.

# %%
causes = ch03.bubble_causes(microbatches=(4, 8), schedule="gpipe")

# %%
for r in causes:
    # The slowest stage sets the pace: replayed with the stages' mean times, the bubble is
    # 1 − M/(P + (M−1)·pace), never below the formula (pace 1).
    assert abs(r["stages"] - paced_bubble(2, r["microbatches"], r["pace"])) < 1e-9, r
    assert r["pace"] >= 1 and r["stages"] >= r["formula"] - 1e-9, r
    # Variation can cost only so much: the same work with every action as fast, or as slow, as its
    # stage's fastest or slowest of its kind brackets the replay, in every run.
    lo, hi = r["busy_bounds"]
    assert lo - 1e-9 <= r["busy"] <= hi + 1e-9, r
for m in (4, 8):  # at each M, the model whose stages are more unequal in time pays more idle time
    a, b = sorted((r for r in causes if r["microbatches"] == m), key=lambda r: r["pace"])
    assert b["stages"] >= a["stages"], (a, b)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **The slowest stage sets the pace.** In GPipe each phase is a *flow shop* (scheduling's name for
# jobs that visit the same machines in the same order; here micro-batches visiting stages). Its length
# is the sum of the stage times plus M − 1 times the slowest one. Define the **pace** as (slowest
# forward + slowest backward) ÷ (the mean stage's forward + backward). Then the bubble replayed from
# the stages' mean times is exactly 1 − M/(P + (M − 1)·pace): the formula at pace 1, more at any
# other. The cell above checks it on every run, and the table prints each run's pace. The faster stage
# waits for the slower one every micro-batch.
#
# **Which model is the more unequal *in time* depends on the machine.** With 7 + 8 layers, one stage
# does 8/7 of the other's arithmetic; but the "balanced" 8 + 8 cut is equal only in parameters, and
# the CPU's kernels do not treat every layer alike. Whichever it is, the one with the larger pace pays
# more idle time, which is what the cell checks.
#
# <details><summary>Two runs where the balance came out differently</summary>
#
# In one run with the portable kernels (`ATEN_CPU_CAPABILITY=default`) at M = 8, the 8 + 8 model's
# pace came out at 1.036 and the 7 + 8 model's at 1.028: there the 7 + 8 cut was the *better*
# balanced of the two. In a CI run on a loaded 2-core machine (the notebook in a browser), the 8 + 8
# model at M = 8 had a pace of 1.073: 15.9 % idle from unequal stages and 17.8 % with the variation,
# against the formula's 11.1 %.
#
# </details>
#
# **Variation between micro-batches** adds a different amount in every run. The range in brackets in
# the first table is where it can land: the run's work replayed with every action as fast, or as
# slow, as its stage's fastest, or slowest, of its kind.
#
# **Balancing stages by time**, not by parameter count, is what `balance="time"` and real systems do.
# But a cut between whole layers can only be so even: with 15 equal layers on 2 stages, one stage
# always gets 8.
#
# **Messages cost more than their bytes suggest.** Most land within a fraction of a millisecond, but
# each needs a few moments of a core (for Gloo's I/O thread and the link's threads) while both stages
# are computing, and now and then that takes milliseconds. In GPipe, messages matter mostly where the
# line fills and turns around. In 1F1B's steady state with 2 stages, each stage's next action depends
# on a message that went there and back, so the delays add up every micro-batch. The stages also share
# their cores with this notebook and anything else running: the *off its core* column shows how much.
# So the wall clock depends on the machine and its load, not on the schedule alone, and the cell above
# checks only the replayed bubble. `python -m lesson_lib bench bubble` repeats these runs for GPipe
# and 1F1B and prints each one.
#
# **Micro-batches are not free.** The sweep above shows one more cost: each micro-batch re-reads the
# stage's weights and adds into its gradients, so the work per sample grows as micro-batches shrink
# (compare the step times printed by the sweep). That is why real systems do not simply take M = 1000.
#
# ### Interleaving: shorter steps instead of more micro-batches
#
# The bubble is the line filling and draining: P − 1 steps of one stage's forward and backward at
# each end. Megatron-LM (Narayanan et al., 2021, SC21) makes each step shorter instead: cut the
# model into v·P pieces and give rank r v of them, its **chunks** — pieces r, r + P, …, r + (v−1)·P.
# A micro-batch now goes round the ranks v times (rank P−1's chunk c hands it to rank 0's chunk
# c+1), and each hop takes 1/v of a stage's time. The schedule, **interleaved 1F1B**, is 1F1B over
# chunks: micro-batches run in groups of P, each group through chunk 0, then chunk 1, and so on;
# backwards in the same groups, last chunk first. Rank r runs (P − r − 1)·2 + (v − 1)·P forwards
# before its first backward (Megatron's count; at v = 1 it is plain 1F1B, P − r − 1), then
# alternates one forward and one backward, then drains. It needs M to be a multiple of P. The
# schedule, as the library writes it (its docstring says where it follows Megatron-LM and torch's
# `ScheduleInterleaved1F1B`, and where it differs):

# %%
show_source(il.interleaved_actions, il.action_order, il.warmup_forwards)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Replayed on the ideal machine — one core per rank, which its chunks take in turn, and free
# messages — with a forward of a whole stage taking 1 and a backward 2 (so 1/v and 2/v per chunk):
# 1F1B beside v = 2, then the bubble for v = 1, 2 and 4 against the formula, the messages counted in
# the schedule, and how many chunks' activations each rank holds at once.

# %%
inter = ch03.interleaving(stages=4, microbatches=8, chunks=(1, 2, 4))

# %%
P, M = inter["stages"], inter["microbatches"]
for r in inter["rows"]:
    v = r["chunks"]
    # work per rank 3M; the line fills and drains in P − 1 chunk steps of 3/v each
    assert r["makespan"] == 3 * M + Fraction(3 * (P - 1), v), r
    assert r["replayed"] == Fraction(P - 1, v * M + P - 1), r  # the formula, exactly
    # each micro-batch crosses v·P − 1 boundaries each way (P − 1 without interleaving)
    assert r["per_microbatch"] == {"activations": v * P - 1, "grads": v * P - 1}, r
    assert r["in_flight"] == r["bound"], r  # the warm-up forwards and one more, min(w + 1, v·M)
by_v = {r["chunks"]: r for r in inter["rows"]}
assert by_v[1]["replayed"] > by_v[2]["replayed"] > by_v[4]["replayed"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# Where the formula comes from. Each rank still does M·(F + B) of work, but the line now fills and
# drains in P − 1 *chunk* steps of (F + B)/v: the idle time falls v-fold, to (P − 1)·(F + B)/v. As
# a share of the ideal time that is (P − 1)/(v·M); as the idle share of each rank's step — what the
# replay measures and the cell asserts — (P − 1)/(v·M + P − 1), which is 1F1B's (P − 1)/(M + P − 1)
# with v·M micro-batches. The replay meets it exactly, for every v in the table.
#
# The same schedule runs on real ranks: `schedule="interleaved", chunks=v` gives each rank v chunks
# of the model, and the links become a ring (rank P−1's chunk c sends on to rank 0's chunk c+1;
# `pp.interleaved_stage.train_interleaved`). Like every schedule, it must train to the same losses,
# gradients and parameters as one process: 2 ranks, 2 chunks each, 4 micro-batches.

# %%
cfg = pp.Config.tiny(stages=2, schedule="interleaved", chunks=2, microbatches=4)
g = pp.verify(cfg, warm_cluster(2))
print(f"interleaved, v = 2: largest difference from one process — losses {g['losses']:.1e}, "
      f"gradients {g['grads']:.1e}, parameters {g['params']:.1e}")
assert max(g.values()) <= numerics.pipeline_tolerance(microbatches=4, steps=cfg.steps, depth=cfg.depth), g

# %% [markdown] slideshow={"slide_type": "subslide"}
# What it costs, read from the same schedule: **messages**, v·P − 1 per micro-batch each way
# instead of P − 1 (the table's messages column), each of the same size, since every boundary
# carries one micro-batch's activation; and **memory**: the longer warm-up keeps more chunks in
# flight. A chunk holds 1/v of a stage's layers, so rank 0's w + 1 chunks are P + (P − 1)/v
# stages' worth of activations, against 1F1B's P (the table's last column): a little more, not
# v times more.
#
# **At cluster scale.** Megatron-LM uses interleaving where the bubble dominates: many pipeline
# stages and few micro-batches per step, as with a large model at a modest batch. Narayanan et al.
# (2021) find the interleaved schedule faster than plain 1F1B at small batches, and the gap closing
# as the batch grows — the bubble shrinks by itself, while the v-fold point-to-point traffic grows
# with the batch. So it needs a fast interconnect between pipeline ranks (they also split each
# message over the tensor-parallel ranks' links, their scatter/gather optimization), a few chunks
# per rank rather than many, and M a multiple of P (Megatron's current code lets the last group of
# micro-batches absorb a remainder). Here, on shared cores, a message costs more than its bytes (see
# above), so this section shows the schedule's gain on the ideal machine.
#
# ### Zero bubble: split the backward
#
# Interleaving makes the fill and the drain shorter; Qi et al. (2024, ICLR, "Zero Bubble Pipeline
# Parallelism") fill them instead. A backward is two jobs. **B**: the gradient of the loss with
# respect to the stage's *input*, which stage k − 1 is waiting for. **W**: the gradients with respect
# to the stage's *weights*, which no other stage waits for — only the optimizer step, at the end.
# 1F1B runs both in one `backward()` call, so stage k − 1 waits for stage k's W as well. Split them,
# send B's gradient at once, and W can run any time later: in the idle time.
#
# **ZB-H1**, the paper's memory-efficient handcrafted schedule: stage k runs 1F1B's P − k − 1
# warm-up forwards, then one F and one B in turn, then its last B's. Its j-th B is followed by a W
# from j = k on, so stage k holds k W's back and runs them at the end of the step, where 1F1B idles.
# Each stage then keeps at most P micro-batches between their F and their W, what 1F1B's stage 0
# keeps, so the most any stage holds does not grow. (torch's `ScheduleInterleavedZeroBubble` builds
# the same order with one stage per rank; the tests compare the two.)

# %%
show_source(zb.zb_h1_actions)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Replayed on the ideal machine under the paper's assumption F = B = W (a whole backward is 2
# units), three ways: 1F1B as our stages run it (one backward call: the gradient leaves after W),
# 1F1B's order with the gradient sent right after B, and ZB-H1 — at P = 4 for M = 2, 4 and 8. What
# the replay measures: each stage's idle time (the step's length minus the stage's own work) in
# units of one F, and from it the idle share of the step (§5's bubble, and what Qi et al. §5.3 call
# the *bubble rate*: (cost − work)/cost) and the idle time over the work.

# %%
zbr = ch03.zero_bubble(stages=4, microbatches=(2, 4, 8))

# %%
P = zbr["stages"]
for r in zbr["rows"]:
    M, z, one = r["microbatches"], r["zb-h1"], r["1f1b"]
    assert one["idle"] == [3 * (P - 1)] * P, r                    # 1F1B: (P − 1)(F + B + W) per stage
    if M >= P:  # the paper's statement, exactly
        assert z["idle"] == [P - 1] * P, r                         # ZB-H1: (P − 1)(F + B − W) per stage
        assert r["third"] == Fraction(1, 3), r
        assert (one["idle_over_work"], z["idle_over_work"]) == (Fraction(P - 1, M), Fraction(P - 1, 3 * M)), r
        assert z["idle_share"] == Fraction(P - 1, 3 * M + P - 1), r
    assert z["idle"][0] <= r["1f1b, B sent first"]["idle"][0] <= one["idle"][0], r
    assert max(r["in_flight"]["zb-h1"]) == max(r["in_flight"]["1f1b"]), r  # the most a stage holds
    assert r["messages"]["zb-h1"] == r["messages"]["1f1b"], r               # W sends nothing

# %% [markdown] slideshow={"slide_type": "subslide"}
# At M ≥ P the replay gives exactly what the paper states: 1F1B leaves each stage idle for
# (P − 1)(F + B + W) = 9 units, ZB-H1 for (P − 1)(F + B − W) = 3 — a third. Against the M·(F + B + W)
# of work, idle over work falls from (P − 1)/M to (P − 1)/(3M); as the idle share of the step (the
# paper's bubble rate), from (P − 1)/(M + P − 1) to (P − 1)/(3M + P − 1).
#
# The *B first* column shows the two halves of the gain: sending the gradient after B alone saves
# (P − 1)·W, since stage k − 1 no longer waits for stage k's W; moving the W's into the tail saves
# another (P − 1)·W. With fewer micro-batches than stages (M = 2) there are too few W's to hold back
# and ZB-H1 saves less.
#
# Two conditions. The third needs W no longer than F or B: the replay gives (P − 1)(F + B − W)
# exactly then (the tests check a grid of durations). And the order needs the early gradient: with
# the gradient sent only after W, ZB-H1 deadlocks (a test shows where).
#
# Memory: every stage keeps up to P micro-batches from F to W, where 1F1B's stage k keeps P − k; the
# peak, stage 0's, is the same (the *held* column). The paper counts a micro-batch waiting only for its
# W as holding less than a whole one (W needs each layer's input and output gradient, not every
# activation); our stages keep its whole graph until W.
#
# On real ranks the stage loop splits the backward with `torch.autograd.grad`. F keeps each
# `Linear`'s output. B asks autograd for the gradient with respect to the stage's input — sent to
# stage k − 1 at once — and to each `Linear`'s output, and for nothing else: autograd runs only what
# leads to the tensors asked for, so it computes no weight gradient (a test counts the FLOPs), and
# it keeps the graph. W, later, turns each `Linear`'s output gradient into its weight and bias
# gradients and adds them into `.grad` in micro-batch order, as 1F1B's backward does:

# %%
show_source(zbs.forward_keeping, zbs.backward_input, zbs.backward_weight)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Run on 4 ranks: the `tiny` model against one process (the check of §2, with its tolerance) and
# against 1F1B; then the chapter's `laptop` model timed, with the messages counted beside §4's 1F1B
# run of the same shape (4 stages, 4 micro-batches). Where the four ranks outnumber the cores the wall
# clock stretches, so the timeline shows the wall clock and, below it, the step replayed from each
# action's busy time.

# %%
zrun = ch03.zero_bubble_run(stages=4, microbatches=4, against=runs["1f1b"])

# %%
assert max(zrun["gaps"].values()) <= tol, zrun["gaps"]   # §2's check: equal to one process
assert all(zrun["same_as_1f1b"].values()), zrun           # the same matmuls, added in the same order
assert zrun["messages"]["zb-h1"] == zrun["messages"]["1f1b"] == {"send_activation": 3, "send_grad": 3}
assert zrun["max_in_flight"] == [4, 4, 4, 4]              # F to W: P on every stage

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same training as 1F1B, bit for bit, with the same messages: P − 1 = 3 each way per
# micro-batch, since W sends nothing. What the real run's clocks say varies with the machine and its
# load, which is why the cell asserts only the equality and the counts.
#
# The busy times printed above test the paper's assumption F = B = W. In our runs a W has cost more
# than an F or a B (it calls autograd once per layer and adds into `.grad`), and where W is the
# longest the third no longer holds even on the ideal machine. Compare the replayed bubble with
# ZB-H1's ideal and with §4's 1F1B run, both printed above.
#
# **At cluster scale.** The paper goes further: ZB-H2 lets each stage hold up to 2P − 1 micro-batches
# and reaches a zero bubble; an automatic scheduler places F, B and W from their measured times and
# a memory limit; and the optimizer's own synchronization (a global gradient norm for clipping, a
# check for inf and NaN), an all-reduce across the stages that would stall the line, becomes a
# check after the step that rolls it back in the rare case it fails. Qi et al. report up to 23 % more
# throughput than 1F1B at a similar memory limit, 31 % with more memory. torch ships
# `ScheduleInterleavedZeroBubble` and `ScheduleZBVZeroBubble`.
#
# ## 6. Memory: GPipe against 1F1B
#
# Activations saved for the backward are the other cost. Under GPipe every stage runs all M forwards
# before its first backward, so it holds all M micro-batches' activations. Under 1F1B stage k holds at
# most P−k of them: after its warm-up, every new forward is matched by a backward that frees one.
#
# We count them two ways.
#
# * The **inventory**: autograd's *saved-tensor hooks* report each tensor a micro-batch's forward
#   keeps for its backward, and the stage adds up those alive at once, over the whole schedule.
# * The **measurement**: `PeakMemory` (chapter 4 opens it) counts every allocation and free that
#   torch's allocator makes during the stage's last step, and keeps the peak above what was alive at
#   the step's start (parameters, gradients, momentum). It knows nothing of what the code holds.
#   The stage's receive buffers are allocated on the link's own threads (`stage_comm.StageLink`),
#   which the stage's count does not see: each of those threads opens a count of its own
#   (`PeakMemory.thread`), and the counts are merged in time order.
#
# The model is the `memory` preset (its shape is in the titles), on which a micro-batch's activations
# outweigh what the backward builds on the side; 128 samples per micro-batch.

# %%
mem = ch03.activation_memory(stages=4, microbatches=(1, 2, 4, 8))

# %%
P, M = 4, 8
at = {(r["schedule"], r["stage"]): r for r in mem if r["microbatches"] == M}
for k in range(P):
    assert at["1f1b", k]["peak"] <= at["gpipe", k]["peak"]
    assert at["1f1b", k]["in_flight"] == min(P - k, M) and at["gpipe", k]["in_flight"] == M
    for schedule in ("gpipe", "1f1b"):  # every saved tensor was allocated in the step, all alive at once
        assert at[schedule, k]["measured"] >= at[schedule, k]["peak"], at[schedule, k]
assert at["1f1b", 0]["peak"] < 0.6 * at["gpipe", 0]["peak"]          # 4 micro-batches held instead of 8
assert at["1f1b", 0]["measured"] < 0.6 * at["gpipe", 0]["measured"]  # and the allocator agrees

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two counts agree on the order, and the measurement is above the inventory in every stage, by
# what saved-tensor hooks never see: the receive buffers posted ahead (GPipe posts all M of a
# step's at its start, 1F1B two at a time) and what one backward builds while it runs — the
# gradients of a micro-batch's activations and a weight gradient, before it is added into the
# stage's gradient.
#
# <details><summary>A leak the measurement found and the inventory could not</summary>
#
# The link's send thread used to keep every activation it had sent until the end of the step, so a
# 1F1B stage held all M of its outputs after all. It now lets each go once sent
# (`tests/test_pipeline_memory.py` bounds what stage 0 allocates beyond its saved tensors, and fails
# with the old thread).
#
# </details>
#
# Same bubble, a fraction of the activation memory: that is the case Narayanan et al. make for 1F1B
# ("PipeDream-Flush", Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021), and the schedule
# Megatron-LM uses for its pipeline parallelism (Narayanan et al., SC 2021).
#
# ### Recomputing the activations
#
# GPipe itself fought the memory another way: keep fewer activations and recompute them during the
# backward — *re-materialization* (Huang et al., 2019), after Chen et al. (2016), "Training Deep
# Nets with Sublinear Memory Cost". With `recompute=True` each stage runs its forward, one
# micro-batch at a time, under `torch.utils.checkpoint`: autograd keeps only the stage's input, and
# the backward first runs the forward again to rebuild what it needs. The model's expectation: one
# stage input per micro-batch held, for one extra forward of compute — (F + F + B)/(F + B) of the
# work, about 4/3 when a backward costs two forwards (2Ψ forward and 4Ψ backward FLOPs per sample,
# Kaplan et al., 2020). Chapter 7's cost model assumes exactly this by default: 8·Ψ FLOPs per token
# instead of 6·Ψ, "+ 2·Ψ recomputing the forward" (`costmodel.Plan(recompute=True)`, after Narayanan
# et al., 2021). The stage's forward, as every run of this chapter calls it:

# %%
show_source(pp.stage_forward)

# %% [markdown] slideshow={"slide_type": "subslide"}
# GPipe and 1F1B at M = 8 again, each with and without recomputation, on the same `memory` preset.
# Then the busy time of one step's forwards and backwards on the chapter's `laptop` model, 128 samples
# per micro-batch, with the meter off (its profiler costs every small operation time). Of its timed
# steps, each variant keeps the one that other processes on the cores disturbed least.

# %%
rc = ch03.recomputation(stages=4, microbatches=8)

# %%
shape = pp.Config.from_preset("memory")
held = {(r["schedule"], r["recompute"], r["stage"]): r for r in rc["rows"]}
for (_, recompute, k), r in held.items():
    assert r["measured"] >= r["inventory"] > 0, r
    if recompute:  # the model, exactly: one stage input per micro-batch in flight, nothing else saved
        width = shape.d_in if k == 0 else shape.hidden
        assert r["inventory"] == r["in_flight"] * rc["rows_per_microbatch"] * width * 4, r
for k in range(P):  # measured: clearly lower wherever a stage holds many micro-batches
    assert held["gpipe", True, k]["measured"] < 0.75 * held["gpipe", False, k]["measured"], k
assert held["1f1b", True, 0]["measured"] < 0.75 * held["1f1b", False, 0]["measured"]
# The backward reruns the same kernels on the same inputs: the same training, bit for bit.
for schedule, g in rc["equal"].items():
    assert max(g.values()) == 0, (schedule, g)
# One extra forward: the model says 1 + F/(F + B). Busy time varies from run to run on shared cores
# (4 ranks on 2 cores here; the runs take turns and each keeps its least disturbed step, and the
# course's measurements are in benchmarks/history/pipeline-recomputation.md), so the check allows
# from a quarter of a forward to three: recomputation costs time, about a forward's worth.
f = rc["forward_share"]
assert 1 + 0.25 * f < rc["busy_ratio"] < 1 + 3 * f, (rc["busy_ratio"], f)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The inventory falls to the model's figure exactly: one input per micro-batch, which on stage 0 is
# the data itself (32 features, not the hidden width). The allocator's peak falls by less, for two
# reasons the table shows. Each stage still keeps each micro-batch's *output* until its backward —
# the tensor the backward starts from, no longer a saved tensor — and the backward rebuilds one
# micro-batch's activations at a time, on top of the inputs. A stage that holds one micro-batch
# (1F1B's last) saves nothing: it keeps the input and rebuilds the same activations. Megatron-LM's
# pipeline frees an output's data once it has been sent and keeps only its autograd node
# (`deallocate_output_tensor` in its schedules); we leave the output in place. What recomputation
# buys is the freedom to trade compute for memory, layer by layer: Chen et al. keep an input every
# √n layers and reach O(√n) memory for one extra forward.
#
# ## 7. Checked against `torch.distributed.pipelining`
#
# PyTorch ships pipeline schedules of its own. The same stages, the same initial weights and the same
# micro-batches, trained with its `ScheduleGPipe` and `Schedule1F1B` on the same Gloo processes:

# %%
lib = ch03.against_torch(stages=4, microbatches=4)

# %%
for schedule, c in lib.items():
    assert "error" not in c, c
    assert max(c["ours_vs_torch"].values()) <= tol, (schedule, c, tol)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. Try it yourself
#
# Each click starts real processes; 4 stages take a second or two.

# %%
ch03.explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch03.exercises(stages=4)

# %%
exercises["gpipe"]


# %%
def my_gpipe_stage(stage, xs, ys):
    # k, P, M = dist.get_rank(), dist.get_world_size(), len(xs)
    # 1. all forwards: receive (k > 0), run the stage, send (k < P-1); keep each output
    # 2. all backwards: the last stage from its loss / M, the others from the gradient they receive;
    #    then send the input's gradient back (k > 0)
    ...

exercises["gpipe"].submit(my_gpipe_stage)

# %%
exercises["bubble"]

# %%
exercises["bubble"].submit(...)  # replace ... with a fraction

# %%
exercises["order"]

# %%
exercises["order"].submit(...)  # replace ... with a string like "F0 F1 B0 ..."

# %%
exercises["smallest_m"]

# %%
exercises["smallest_m"].submit(...)  # replace ... with M; the check runs it

# %%
exercises["in_flight"]

# %%
exercises["in_flight"].submit(...)  # replace ... with a number of micro-batches

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **stages on real ranks** — §3's stage loop and your GPipe stage, judged on its messages and its gradients.
# 2. **the schedules** — §4's timelines and your 1F1B order.
# 3. **the bubble** — §5's sweep against the formula and the bubble rebuilt one cause at a time (the replay checked to equal 1 − M/(P + (M−1)·pace)); interleaved 1F1B replayed to exactly (P−1)/(v·M+P−1) for v = 1, 2, 4, with its v·P − 1 messages per micro-batch counted in the schedule; ZB-H1 (Qi et al., 2024) replayed to exactly a third of 1F1B's idle time at F = B = W, and run on real ranks with the backward split into B and W by `torch.autograd.grad`, training bit for bit as 1F1B with the same messages.
# 4. **memory and torch** — §6's peak activations, inventoried and measured by the allocator (1F1B's stage 0 under 0.6× GPipe's in both, asserted); recomputation keeping one input per micro-batch for about one extra forward, training bit for bit the same (asserted); and §7's agreement with torch.
#
# **On a real cluster:** Pipelines pay a bubble of (P−1)/(M+P−1) at best; real systems add micro-batches, balance stages by time, and interleave several stages per device (Narayanan et al., 2021), which shrinks it to (P−1)/(v·M+P−1) for v-fold point-to-point messages — worth it where the interconnect is fast and the bubble dominates; zero-bubble schedules (Qi et al., 2024) split each backward and fill the bubble with weight gradients, at no extra messages.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# Pipelining splits the model by layers and pays with a bubble. Chapter 4 splits it another way:
# ZeRO keeps data parallelism but shards the optimizer state, the gradients and finally the
# parameters across the data-parallel ranks, so that no rank holds a full copy.
#
# From a shell:
# `python -m lesson_lib run pipeline --stages 4 --microbatches 8 --schedule 1f1b --steps 5 --global-batch 128 --json pp.json`
# (`--stages 1` runs the unsplit model).
