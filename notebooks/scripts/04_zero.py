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
# # Chapter 4 — ZeRO: stop storing everything everywhere
#
# Plain data parallelism keeps a **full copy** of the parameters, the gradients and the optimizer
# state — together the **model states** — on every device. With mixed-precision Adam that is 16 bytes
# per parameter on *each* device, although every device only ever updates the same numbers as all
# the others. ZeRO — the Zero Redundancy Optimizer (Rajbhandari et al., SC 2020) — **shards** them: it
# cuts each into N slices, one per device, like students dividing the textbooks. Each device keeps
# its slice, its *shard*, and fetches the rest when it needs it.
#
# For a model of Ψ parameters on N devices, with K = 12 bytes of optimizer state per parameter (an
# fp32 master copy, Adam's momentum and variance), ZeRO comes in three **stages**:
#
# | stage | sharded over N devices | model states per device |
# |---|---|---|
# | 0 | nothing (data parallel) | 16Ψ |
# | 1 | optimizer state | 4Ψ + 12Ψ/N |
# | 2 | + gradients | 2Ψ + 14Ψ/N |
# | 3 | + parameters | 16Ψ/N |
#
# <details><summary>Which 16 bytes: the ZeRO paper's convention, and Megatron-LM's 18</summary>
#
# These formulas use the ZeRO paper's convention (Rajbhandari et al., 2020, §3.1): 2 bytes of fp16
# parameters + 2 of fp16 gradients + K = 12 of optimizer state = 16 bytes per parameter. Megatron-LM
# keeps its gradients in fp32 ("main gradients", accumulated and reduced in fp32, as Megatron-Core's
# distributed-optimizer documentation describes), so it counts 2 + 4 + 12 = **18 bytes per
# parameter**, and 6 + 12/N with its distributed optimizer, which shards only the 12.
# `zero_memory(..., grad_bytes=4)` gives that convention; everything in this chapter uses the paper's.
#
# </details>
#
# Stage 2 already approaches an 8× saving as N grows (16Ψ → 2Ψ), and stage 3 divides everything by
# N — which is what makes trillion-parameter training possible (Rajbhandari et al., 2020). Below we
# train with all four stages on 4 real processes and take each rank's **inventory**: the tensors it
# holds, category by category. Then we **measure** what each rank really allocated, with a meter that
# knows nothing of the formulas.

# %% [markdown]
# **After this chapter you can:**
#
# 1. state the memory per rank of ZeRO's stages 1–3, (4 + 12/N)Ψ, (2 + 14/N)Ψ and 16Ψ/N in mixed precision, tell the inventory from the allocator's measured peak per rank, and show why fp16 needs loss scaling where bf16 does not (§1, §5, §10, formula exercises);
# 2. show that sharding changes no result: every stage trains like stage 0 (§2);
# 3. write ZeRO-1's step — reduce-scatter, a step on your slice, all-gather — on real ranks (§3, first exercise);
# 4. count what each stage costs on the wire, 1.5× plain data parallelism for ZeRO-3 (§4), see on a timeline what prefetching the next layer's gather hides in the forward and when FSDP2 issues it in the backward (§3), and pick the smallest stage that fits a model (last exercise);
# 5. run PyTorch's FSDP2 (`fully_shard`) on the same model and name which of its steps does what our ZeRO-3 does, count hybrid sharding's bytes per group and the bytes a bf16 reduction saves (§8), and checkpoint its shards so that training survives a killed rank (§9).
#
# **Before it:** chapters 0 and 2 (all-reduce, reduce-scatter, all-gather).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_lib import comm, numerics, show_source, warm_cluster
from lesson_lib.chapters import ch04
from lesson_lib.chapters.timed import timed_claim
from lesson_lib.milestones import zero
from lesson_lib.peakmem import PeakMemory

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Four stages: the inventory
#
# Each rank keeps every layer's parameters, gradients and Adam state in flat buffers, padded to a
# multiple of N; rank r owns slice r of each. The bars are an inventory of what rank 0 holds between
# steps (the bytes of the storages it knows it keeps). The black marks are the paper's formulas for
# fp32 Adam: 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N.
#
# The purple part is the peak of the **transient** buffers, those that live only during part of a
# step:
#
# * the full gradient a stage-2 rank builds during the backward before scattering it (§3 scatters it
#   in buckets during the backward instead);
# * one layer's full parameters and gradient, which a stage-3 rank fetches just before using them
#   and frees right after;
# * the ring's receive buffer.
#
# On a model this small the transients are a visible share; the model states — the part that grows
# with Ψ — are what the formulas count.

# %%
results = ch04.stages(world_size=4, precision="fp32")

# %%
ratios = ch04.memory_ratios(results)
assert all(abs(v - 1) <= 0.05 for per_stage in ratios.values() for v in per_stage.values()), ratios

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same stages, measured
#
# The inventory shows the shards are 1/N, but it agrees with the formulas nearly by construction: it
# adds up what the code lists, and a temporary the code never lists is invisible to it. So we also
# **measure**. Torch's *allocator*, which hands out every tensor's memory, reports each allocation and
# free, with its size, to an active profiler (`profile_memory`). `PeakMemory` keeps the running total
# of the bytes allocated since it opened, and its peak: on CPU what `torch.cuda.max_memory_allocated`
# is on a GPU (where we use that). First on something we can check by hand, one Adam step on one
# tensor of a million numbers:

# %%
show_source(PeakMemory._replay)  # the running total of the allocator's events, and its peak
p = torch.zeros(2**20, requires_grad=True)
p.grad = torch.ones_like(p)
adam = torch.optim.Adam([p])
adam.step()  # the first step creates Adam's two moments; the next one only updates them
with PeakMemory() as meter:
    meter.reset_peak()
    adam.step()
print(f"one Adam step on a {p.nbytes / 1e6:.1f} MB tensor allocates {meter.peak / 1e6:.1f} MB at its peak")

# %%
# Adam's step computes sqrt(v) and then sqrt(v) / correction: two temporaries the size of the tensor
assert 2 * p.nbytes <= meter.peak < 3 * p.nbytes, meter.as_dict()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the four stages on a model large enough that its model states dominate: the `memory` preset
# (the run prints its size and layers), on 2 ranks. Stage 2 runs twice: scattering the whole gradient
# after the backward, and in buckets during it. Each rank's meter opens before its model is built and
# keeps the peak of the training steps. Every run is a fresh count, whatever the warm worker ran
# before; the process's resident memory could not say that, since the C allocator keeps freed pages
# for the next run.

# %%
measured = ch04.measured_memory()

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the measurement adds to the inventory, stage by stage:
#
# * **Everything listed, and more.** The measured peak is never below the model states and the
#   transient buffers the inventory lists, which are alive together; the activations are another
#   moment's (freed by the end of the backward). What is not listed includes Adam's
#   temporaries — the two we just measured, for each tensor it updates — and the fresh tensor the
#   backward computes a layer's weight gradient into before adding it to the gradient buffer.
# * **Stage 2 without buckets is above stage 1.** It builds the whole full gradient during the
#   backward and only then scatters it, so for a while it holds the full gradient *and* its
#   sharded one; stage 1 keeps the full gradient and uses its own slice in place. The saving of
#   ZeRO-2 needs the gradients reduced in buckets during the backward, as the paper does
#   (Rajbhandari et al., 2020): then it falls below stage 1.
# * **Stage 3 falls least below the formula:** besides its states it holds one layer's gathered
#   parameters and full gradient at a time, and the ring's receive buffer.
#
# What the meter does not see: memory outside torch's allocator (Python objects, Gloo's own
# buffers, pages the C allocator keeps after a free). And the formula is a model of the model
# states alone: the measured peak falls with the stage, by less than the formula, because the
# temporaries do not shrink with N.

# %%
rows = {row["label"]: row for row in measured["rows"]}
for row in rows.values():  # on every rank: the allocator saw all the model states and listed buffers
    assert all(m >= s + b for m, s, b in zip(row["measured"], row["states"], row["buffers"])), row
    assert all(s == row["states"][0] for s in row["states"]), row  # the shards are equal
# the model states dominate, except where stage 2 holds its whole full gradient
assert all(max(r["states"]) >= 0.75 * max(r["measured"]) for k, r in rows.items() if k != "stage 2"), rows
# the measured peak falls with the stage: every rank of a stage below every rank of the one before
order = ["stage 0", "stage 1", "stage 2, buckets", "stage 3"]
assert all(max(rows[b]["measured"]) < min(rows[a]["measured"]) for a, b in zip(order, order[1:])), rows
# stage 2 without buckets: the whole full gradient lives beside the model states, above stage 1
two = rows["stage 2"]
assert all(m - s >= two["whole_gradient"] for m, s in zip(two["measured"], two["states"])), two
assert min(two["measured"]) > max(rows["stage 1"]["measured"]), rows

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Without hurting results
#
# Sharding changes *where* the numbers live, not *what* is computed. Our stages even sum the
# gradients in the same order (one ring schedule for all of them), so they agree bit for bit; and in
# fp32 they equal single-process Adam on the combined batch up to float rounding.

# %%
same = ch04.agreement(results)

# %%
assert all(same["identical_to_stage_0"].values())
assert same["max_gap_vs_single_process"] <= same["tolerance"], same

# %% [markdown] slideshow={"slide_type": "subslide"}
# How close is "up to float rounding"? `ch04.tolerances` derives it from the run itself: Adam moves
# each parameter by at most about the learning rate per step (Kingma & Ba, 2015), so two correct
# runs that only round differently — another summation order, another CPU's kernels — drift apart
# by a small fraction of lr·steps; we allow 1/100 of it, less than the single step a real bug
# (a skipped step, a wrong slice) moves parameters by. Losses get a relative allowance from fp32's
# rounding (2⁻²⁴ per operation) times the sums in one forward pass, per step.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. The sharded step, written out
#
# Here is ZeRO stage 1 in about twenty lines, run on the 4 ranks. Each rank holds all parameters
# as views of one flat buffer padded to a multiple of N (`zero.Flat`) and owns slice `rank` of it.
# After its backward pass it has the gradient of its own share of the batch. Then two collectives
# (chapter 2 builds both), with a step between them:
#
# 1. **reduce-scatter** the gradient: rank r receives the sum over all ranks of slice r only,
#    (N−1)/N·Ψ elements sent per rank;
# 2. **Adam on my slice**: the optimizer was built for `mine` alone, so its two moments hold Ψ/N
#    numbers each — the saving of stage 1;
# 3. **all-gather** the parameters: every rank receives the other N−1 updated slices, another
#    (N−1)/N·Ψ.
#
# Stage 2 is the same step, except that the full gradient buffer is freed right after the
# reduce-scatter and only `mine.grad` lives on.

# %%
def my_zero1_adam(cfg):
    rank, n = dist.get_rank(), dist.get_world_size()
    model, batch = ch04.task(cfg)  # the same initial model on every rank; my share of each batch
    flat = zero.Flat(list(model.parameters()), n, rank)  # parameters become views of flat.full
    grad = torch.zeros(flat.padded)
    flat.point_grads(grad)  # ... and their gradients views of one flat gradient
    mine = flat.full[flat.lo:flat.hi]  # my slice of the parameters (a view)
    adam = torch.optim.Adam([mine], lr=cfg.lr)  # Adam's moments for my slice only: 8Ψ/N bytes
    losses = []
    for step in range(cfg.steps):
        x, y = batch(step)
        grad.zero_()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # the gradient of my micro-batch, all Ψ of it
        mine.grad = comm.ring_reduce_scatter(grad).div_(n)  # Σ over ranks of slice `rank`, averaged
        adam.step()  # updates my slice, nothing else
        comm.ring_all_gather(flat.full)  # every rank receives every updated slice
        losses.append(loss.item())
    return losses, flat.full[:flat.numel].tolist()


cfg = ch04.config(stage=1, world_size=4)
outs = warm_cluster(4).run(my_zero1_adam, cfg)
my_losses = [sum(o[0][s] for o in outs) / 4 for s in range(cfg.steps)]  # global loss: mean over ranks
tol = numerics.adam_drift(cfg)  # why these bounds: numerics.adam_drift??
loss_gap = numerics.max_gap(my_losses, zero.reference(cfg))
param_gap = numerics.max_gap(outs[0][1], results[1]["final_params"])
print(f"largest loss gap vs single-process Adam: {loss_gap:.1e} "
      f"(allowed {tol['loss_rel'] * max(my_losses):.0e}); "
      f"largest parameter gap vs the library's stage 1: {param_gap:.1e} (allowed {tol['params']:.0e})")

# %%
assert all(o[1] == outs[0][1] for o in outs)  # after the all-gather every rank holds the same model
assert loss_gap <= tol["loss_rel"] * max(my_losses)
assert param_gap <= tol["params"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's version, which the figures above ran, does the same per layer (one flat buffer
# per `Linear`, which stage 3 needs) and handles all four stages and mixed precision:

# %%
show_source(zero.sharded_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Stage 3 also shards the parameters, so a layer's weights must be fetched before it runs. Module
# hooks do it: all-gather just before a layer's forward, free right after; gather again before its
# backward; reduce-scatter its gradient as soon as autograd has finished it.

# %%
show_source(zero.fetch_layer_by_layer)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Fetching a layer only when it is needed leaves the network idle while a layer computes, and the
# layer waits for its own gather. ZeRO-3 **prefetches** — fetches ahead of need (Rajbhandari et al.,
# 2020). With `prefetch=d` the forward launches the gathers of the next d layers on a communication
# thread and goes on computing; a layer's forward waits only for what has not arrived. The room for a
# prefetched layer is allocated when its gather is launched, so the depth bounds the memory: at most
# d + 1 layers' full parameters at once. Prefetching changes when the bytes move, not which bytes or
# what is computed.

# %%
show_source(zero.Prefetch.fetch)
ahead = ch04.prefetch_depths(world_size=4, stage3=results[3])

# %%
assert all(row["same"] for row in ahead), ahead  # bit for bit the same training, the same bytes sent
assert all(row["peak"] == row["window"] for row in ahead), ahead  # the depth bounds the gathered layers
assert ahead[0]["peak"] < ahead[1]["peak"] < ahead[2]["peak"], ahead

# %% [markdown] slideshow={"slide_type": "subslide"}
# That is the memory side of the trade. The time side, on a timeline: rank 0's last forward, layer
# by layer, without prefetching and with one layer ahead. Here a gather is a memory copy that takes
# far less than a layer's compute, so the timeline uses chapter 6's **emulated** link at 1 Gbit/s:
# with `link_gbps`, each transfer takes at least bytes/bandwidth, the rank sleeping out the rest with
# its core free. The batch is large enough for a layer's compute to hide most of the next one's
# gather. One forward's timing depends on what else runs on the cores, so each depth runs five times,
# taking turns: the figure draws the last forward, the table gives the medians. Which gathers the
# forward waited for is counted in every run; how long it waited is printed with the machine's load.

# %%
timeline = ch04.prefetch_timeline()

# %%
# the same training and the same bytes with or without prefetching: only when the bytes move changes
assert timeline[0]["losses"] == timeline[1]["losses"] and timeline[0]["traffic"] == timeline[1]["traffic"]
# without prefetching the forward gathers every layer itself, standing still for each; with it, only
# the first layer's, and the others are gathered on the communication thread, in every run
layers = timeline[0]["gathers_in_forward"][0]
assert timeline[0]["gathers_in_forward"] == [layers] and timeline[0]["gathers_ahead"] == [0], timeline
assert timeline[1]["gathers_in_forward"] == [1] and timeline[1]["gathers_ahead"] == [layers - 1], timeline
# how much of a gather's time the compute hides is a time, which other work on the cores stretches
timed_claim(timeline[1]["waiting_ms"] < timeline[0]["waiting_ms"], "prefetching shortened the waits",
            f"medians {timeline[0]['waiting_ms']:.1f} ms without, {timeline[1]['waiting_ms']:.1f} ms with")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Whether the whole forward gets shorter here varies from run to run: the communication thread's
# copies and the compute share the same cores, so a layer that computes while the next one is
# gathered can itself take longer. On a GPU the gather runs on the interconnect and the compute on
# the device's own cores. FSDP's `forward_prefetch` and `backward_prefetch` (and DeepSpeed's prefetch
# bucket) make the same trade there: memory of d more layers for the waits they hide. Our prefetching
# covers the forward; our backward gathers each layer just before its backward.
#
# **The backward prefetch** is the one FSDP does by default, and the more useful one. A layer's
# backward needs its parameters gathered *again* (ZeRO-3 freed them after the forward), and it takes
# about twice its forward's compute, so there is more to hide behind. In a layer's `pre_backward`,
# FSDP2 issues the all-gather of the layer that comes next in the backward — the previous one in the
# model (`_backward_prefetch` in `_fsdp_param_group.py`). `set_modules_to_backward_prefetch`
# overrides the choice, and naming a module itself (already gathered) turns it off.
#
# Below, PyTorch's FSDP2 (§8 introduces it) on 2 ranks: rank 0's last backward with and without the
# prefetch, drawn from the collectives' own events. Our ring does FSDP2's all-gathers and
# reduce-scatters and notes each one's layer, start and end; "compute" is the time between a layer's
# last collective and its reduce-scatter. The count says, for each layer, whether its gather was
# issued before the layer after it in the model had finished its backward (its reduce-scatter
# began): an order of events, the same in every run, not a time.

# %%
back = ch04.backward_prefetch(world_size=2)

# %%
# FSDP2's default issues every layer's backward gather (but the last layer's, gathered first) before
# the layer after it has finished its backward; turned off, none; the same training either way
assert back[True]["prefetched"] == back[True]["layers"] - 1 and back[False]["prefetched"] == 0, back
assert back[True]["losses"] == back[False]["losses"] and back[True]["sent"] == back[False]["sent"], back

# %% [markdown] slideshow={"slide_type": "subslide"}
# On this CPU the gather still costs the time it costs: FSDP2 on Gloo runs its collectives on the
# rank's own thread, so the prefetched gather runs *before* the layer's compute rather than beside it.
# On a GPU it runs on a stream of its own (FSDP2's all-gather stream) while the compute stream computes
# the layer's gradients; issuing it early is what lets it overlap. Its memory price: one more layer's
# full parameters held while a layer computes.

# %% [markdown]
# Our stage 2 above still builds the whole gradient before scattering it, so for a moment it holds as
# much gradient as plain data parallelism. Real ZeRO-2 (Rajbhandari et al., 2020) reduce-scatters the
# gradients in **buckets during the backward**, as they are computed, and frees each bucket once
# scattered. With `bucket_mb=` the library does that on a communication thread, and bounds the memory:
# before a layer's gradient is allocated, the backward waits until the gradients not yet scattered fit
# in one bucket — so a rank never holds more than one bucket plus one layer of full gradients.

# %%
show_source(zero.scatter_during_backward)

# %%
buckets2 = ch04.stage2_buckets(world_size=4, stage2=results[2])

# %%
# The same training bit for bit, and never more than one bucket + one layer of full gradients.
assert all(buckets2["same_training"]), buckets2
assert all(r["peak"] <= r["bound"] for r in buckets2["rows"]), buckets2
assert all(r["peak"] < buckets2["whole"] for r in buckets2["rows"][1:3]), buckets2  # smaller buckets

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. What it costs on the wire
#
# Stages 1 and 2 move exactly what data parallelism moves: a reduce-scatter of the gradients and an
# all-gather of the parameters, 2Ψ per rank (times (N−1)/N). Stage 3 gathers the parameters twice,
# for forward and again for backward: 3Ψ, 1.5× (Rajbhandari et al., 2020). Counted by `lesson_lib`:

# %%
wire = ch04.traffic(results)

# %%
assert all(row["counted"] == row["formula"] for row in wire), wire
assert wire[3]["counted"] / wire[0]["counted"] == 1.5

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Mixed precision
#
# The paper's numbers assume fp16 parameters and gradients with an fp32 master copy and Adam
# moments (K = 12). A CPU has no fast fp16, so here the low precision is **bfloat16** (bf16: 16 bits
# with fp32's exponent range). The byte counts are the same; §10 shows why fp16 also needs a loss
# scale and bf16 does not. The bytes are the paper's convention — bf16 gradients, 16 bytes per
# parameter — not Megatron-LM's fp32 main gradients (18; see the introduction's note); §8 measures
# what reducing the gradients in bf16 rather than fp32 changes. Measured against 16Ψ, 4Ψ + 12Ψ/N,
# 2Ψ + 14Ψ/N, 16Ψ/N:

# %%
mixed = ch04.stages(world_size=4, precision="mixed")

# %%
mixed_ratios = ch04.memory_ratios(mixed)
assert all(abs(v - 1) <= 0.05 for per_stage in mixed_ratios.values() for v in per_stage.values())
assert all(ch04.agreement(mixed)["identical_to_stage_0"].values())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Against PyTorch's own ZeRO-1
#
# `torch.distributed.optim.ZeroRedundancyOptimizer` shards Adam's state like our stage 1. It leaves
# the gradient all-reduce to you (here the library's `all_reduce`, 2Ψ), and after each step every rank
# **broadcasts the whole parameter tensors it owns** to the others, where our stage 1 all-gathers one
# flat buffer with a ring. It partitions by whole tensors, so its shards are less even than our flat
# slices — compare the optimizer bytes per rank below.

# %%
theirs = ch04.torch_zero(world_size=4, ours=results[1])

# %%
assert theirs["param_gap"] <= theirs["param_tolerance"], theirs
assert theirs["loss_gap"] <= theirs["loss_tolerance"], theirs

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. At the scale of real models
#
# The paper's example: a 7.5-billion-parameter model on 64 GPUs needs 120 GB per device under data
# parallelism, 31.4 GB with stage 1, 16.6 GB with stage 2 and 1.9 GB with stage 3 (Rajbhandari et al.,
# 2020, Figure 1). The same formulas that our measurements just matched give:

# %%
paper = ch04.paper_example()

# %%
assert [round(paper[s], 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9], paper

# %% [markdown] slideshow={"slide_type": "subslide"}
# Play with the formulas: parameters, devices and precision → model states per device.

# %%
ch04.calculator()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Which landmark models could be trained on 64 devices of 80 GB (an A100 or H100) or 141 GB (an H200)?

# %%
table = ch04.fits(world_size=64)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. What PyTorch ships: FSDP2
#
# ZeRO-3's idea is in PyTorch as Fully Sharded Data Parallel (Zhao et al., "PyTorch FSDP", VLDB 2023).
# Its second version, `torch.distributed.fsdp.fully_shard` (FSDP2), keeps each parameter as a
# **DTensor** sharded on dim 0. A DTensor is PyTorch's distributed tensor: one logical tensor whose
# pieces live on different ranks, with a *placement* saying how they are cut. We call `fully_shard`
# on every `Linear` — a unit, like our `Flat` — and on the whole model, then train the same model on
# the same batches with Adam, on 2 ranks.
#
# Our stage 3's steps, and where FSDP2 does each (in
# `torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`; → means "calls"):
#
# | step | ours (`zero.fetch_layer_by_layer`) | FSDP2 |
# |---|---|---|
# | shard, keep my part | `Flat`: slice r of a layer's flat buffer | `FSDPParam`: dim 0 of each tensor |
# | all-gather before a forward | forward pre-hook → `Flat.gather` | `pre_forward` → `unshard` |
# | free it after the forward | forward hook → `Flat.free` | `post_forward` → `reshard` ¹ |
# | gather again before its backward | backward pre-hook | `pre_backward` → `unshard` ² |
# | reduce-scatter the gradient | gradient hook → `ring_reduce_scatter` | `post_backward` → `foreach_reduce` |
# | Adam on my shard | one flat tensor per layer | `torch.optim.Adam` on the DTensor shards |
#
# ¹ skipped if `reshard_after_forward=False`. ² and it prefetches the next layer (`_backward_prefetch`).
# `unshard` calls `foreach_all_gather`; FSDP2's shards come from `torch.chunk`; after the
# reduce-scatter both free the gathered layer and its full gradient (ours: `drop_grad`, `free`;
# FSDP2's `post_backward`: `reshard`), and `foreach_reduce` averages (`ReduceOp.AVG`).

# %%
show_source(zero.fsdp2_worker)

# %%
vs_fsdp2 = ch04.fsdp2(world_size=2)

# %%
# Equal training to float rounding (numerics.adam_drift: the bounds a skipped step would break) ...
assert vs_fsdp2["loss_gap"] <= vs_fsdp2["loss_tolerance"], vs_fsdp2
assert vs_fsdp2["param_gap"] <= vs_fsdp2["param_tolerance"], vs_fsdp2
# ... and the same shards: every layer's dims divide by 2, so dim-0 chunks and our flat slices coincide
assert vs_fsdp2["same_shards"], vs_fsdp2

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now memory, on §1's `memory` preset: each rank's peak **measured** by the same allocator meter as
# our stages, beside the **inventory** of the model states it keeps (its shards of parameters,
# gradients and Adam's moments).
#
# One change. The meter listens on the rank's own thread, but Gloo runs its collectives on threads of
# its own, so what Gloo's threads allocate or free would be counted or not depending on timing. FSDP2
# lets us replace its two collectives (`set_custom_all_gather`, `set_custom_reduce_scatter`): for this
# figure our ring does them, on the rank's thread, and counts their bytes. Everything else is FSDP2's.
#
# With `reshard_after_forward=False` FSDP2 keeps each layer's gathered parameters from its forward
# to its backward: one all-gather per step instead of two, at the price of every layer's full
# parameters held at once when the backward starts — between ZeRO-2 and ZeRO-3.

# %%
fsdp_mem = ch04.fsdp2_memory(measured)

# %% [markdown] slideshow={"slide_type": "subslide"}
# What to read in it:
#
# * **The same model states.** FSDP2 keeps 1/N of the parameters, gradients and Adam's moments, as
#   our stage 3 does (the inventory bars).
# * **Close, not equal, measured.** Beside the states each holds transients of its own: ours a layer's
#   gathered parameters and full gradient and the ring's receive buffer; FSDP2 a layer's gathered
#   parameters, the next layer's that it prefetches in the backward, and its reduce-scatter input.
#   The two peaks stay within two layers' full parameters of each other.
# * **`reshard_after_forward=False`** holds every layer's full parameters when the backward starts
#   (above ZeRO-3's peak) and saves the backward's all-gather: 2Ψ on the wire instead of 3Ψ.

# %%
ours3, f3, f2 = fsdp_mem["rows"]
full, layer = fsdp_mem["full_param_bytes"], fsdp_mem["largest_layer_bytes"]
for row in fsdp_mem["rows"]:  # on every rank the allocator saw at least the model states
    assert all(m >= s for m, s in zip(row["measured"], row["states"])), row
# FSDP2 keeps exactly 1/N of the parameters and of the gradients (inventory)
assert all(m["params"] == m["grads"] == full // 2 for m in fsdp_mem["memory"][True]), fsdp_mem["memory"]
# the two ZeRO-3s (measured): within two layers' full parameters of each other
assert all(abs(a - b) < 2 * layer for a, b in zip(ours3["measured"], f3["measured"])), fsdp_mem
# without resharding after forward: every layer's full parameters beside the shards and Adam's state
assert all(m > t for m, t in zip(f2["measured"], f3["measured"])), fsdp_mem
assert all(mm["measured_peak"] >= mm["params"] + mm["optimizer"] + full for mm in fsdp_mem["memory"][False])
# counted on the wire: 3Ψ(N-1)/N like our stage 3, 2Ψ(N-1)/N without the second all-gather
assert fsdp_mem["sent"][True] == fsdp_mem["formula"][3] and fsdp_mem["sent"][False] == fsdp_mem["formula"][2]

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same stages under the names practitioners meet them (the stages: Rajbhandari et al., 2020;
# FSDP: Zhao et al., 2023; DeepSpeed sets the stage as `"zero_optimization": {"stage": k}` in its
# configuration):
#
# | stage | sharded | PyTorch | here |
# |---|---|---|---|
# | 0 | nothing | `DistributedDataParallel` | stage 0 |
# | 1 | optimizer state | `ZeroRedundancyOptimizer` | §6 |
# | 2 | + gradients | FSDP1 `SHARD_GRAD_OP`; FSDP2 `reshard_after_forward=False` ¹ | §3's buckets |
# | 3 | + parameters | FSDP1 `FULL_SHARD`; FSDP2 `fully_shard` (its default) | §8 |
#
# ¹ ZeRO-2-like: FSDP2 also shards the parameters between steps. FSDP1's full name for stage 2 is
# `ShardingStrategy.SHARD_GRAD_OP`. In DeepSpeed, stage k is `"stage": k`.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Hybrid sharding: shard inside a group, replicate across groups
#
# ZeRO-3 over all N devices of a cluster makes every all-gather and reduce-scatter span all of them,
# across the slow links between *nodes* (machines of several devices each). **Hybrid sharding**
# shards over a *shard group* of S devices and keeps R = N/S replicas of those shards. All-gathers and
# reduce-scatters stay inside the shard group; only one all-reduce of each rank's gradient shard (Ψ/S)
# crosses the *replicate group*, the R ranks that hold the same shard. MiCS (Zhang et al., VLDB 2022)
# scales this way on cloud networks.
#
# <details><summary>MiCS and ZeRO++ in more detail</summary>
#
# MiCS is Zhang et al., "MiCS: Near-linear Scaling for Training Gigantic Model on Public Cloud", VLDB
# 2022. ZeRO++ (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model
# Training", 2023) adds to hybrid sharding **hpZ** (a secondary copy of the parameters partitioned
# inside each node, so the backward's all-gather stays in the node), **qwZ** (the forward's all-gather
# in quantized int8 weights) and **qgZ** (gradients reduced in quantized int4 by a hierarchical
# all-to-all), and reports up to 4× less communication volume than ZeRO-3.
#
# </details>
#
# In FSDP2, hybrid sharding (HSDP) is a 2-D `DeviceMesh`:
# `init_device_mesh("cpu", (R, S), mesh_dim_names=("replicate", "shard"))`, then
# `fully_shard(module, mesh=mesh)`. Per rank and step, for Ψ parameters of e bytes, with rings:
#
# | group | collective | bytes each rank sends |
# |---|---|---|
# | shard (S ranks) | all-gather the parameters, forward and backward | 2·(S−1)/S·Ψe |
# | shard (S ranks) | reduce-scatter the gradients | (S−1)/S·Ψe |
# | replicate (R ranks) | all-reduce my gradient shard (Ψ/S in) | 2·(R−1)/R·Ψe/S |
#
# Below: FSDP2 on 4 real ranks, once as plain FSDP (one shard group of 4) and once as HSDP with
# R = S = 2. Our ring does the shard group's collectives (counted, as in §8's memory figure); FSDP2's
# own all-reduce across the replicate group goes through Gloo and is **observed** (the course's
# `observe`, which the exercises' checkers use): its calls and the bytes handed to it. Memory is the
# allocator meter's peak over the first step (`zero.hsdp`'s docstring says why the first), beside the
# inventory of the model states.

# %%
show_source(zero.hsdp.mesh_worker, zero.hsdp.traffic_formula)  # the mesh, fully_shard; the formula
hybrid = ch04.hsdp(world_size=4, replicas=2)

# %%
for k in ("FSDP", "HSDP"):  # every group's bytes, counted, are the formula's
    h = hybrid[k]
    assert all(h["counted"][op] == h["formula"][op] for op in h["formula"] if op != "all_reduce_ring_sent"), h
    assert h["loss_gap"] <= hybrid["loss_tolerance"], h  # single-process Adam, to rounding
fsdp, hsdp = hybrid["FSDP"], hybrid["HSDP"]
# HSDP keeps twice FSDP's shards (1/2 instead of 1/4; FSDP pads its last layer's 10 rows to 12), and
# its measured peak is above FSDP's by at least the difference
assert 2 * min(fsdp["states"]) <= min(hsdp["states"]) <= max(hsdp["states"]) < 2 * max(fsdp["states"]), hybrid
assert min(hsdp["measured"]) - max(fsdp["measured"]) >= max(hsdp["states"]) - min(fsdp["states"]), hybrid
# in exchange fewer bytes per rank, of which only a quarter (2·(1/2)·Ψ/2 of 2Ψ) leaves the shard group
total = lambda h: sum(h[k] for k in ("param_all_gather", "grad_reduce_scatter", "all_reduce_ring_sent"))
assert total(hsdp) < total(fsdp) and 4 * hsdp["all_reduce_ring_sent"] == total(hsdp), hybrid

# %% [markdown] slideshow={"slide_type": "subslide"}
# What to read in it. Per rank, HSDP sends 3·(1/2)·Ψ in its shard group and 2·(1/2)·Ψ/2 across the
# replicate group, 2Ψ in all; FSDP over 4 ranks sends 3·(3/4)·Ψ = 2.25Ψ — all of it across every link
# between the 4. HSDP pays in memory: each rank keeps 1/S of the model states, not 1/N.
#
# **At cluster scale** the shard group is the devices of one node, on NVLink (hundreds of GB/s per
# GPU), and the replicate groups cross the nodes on InfiniBand or Ethernet (tens of GB/s per GPU):
# the 1.5Ψ of all-gathers and reduce-scatter stay on the fast links and only Ψ/S·2(R−1)/R per rank
# crosses the slow ones, while plain FSDP over all the nodes sends its 1.5Ψ·(N−1)/N through them.
# That is why large runs shard inside a node (or a few) and replicate across. We show no times: here
# Gloo's memory copies are no network, and 4 ranks may outnumber the cores.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### In which precision the gradients are reduced
#
# FSDP2's `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=...)` runs the forward, the
# backward and the all-gathers in bf16 and the reduce-scatter in `reduce_dtype`: bf16 halves its
# bytes; fp32 sums the bf16 gradients without rounding each partial sum to 8 bits (the choice of
# Megatron-Core's distributed optimizer, its 18 bytes per parameter). On 2 ranks, the `laptop` run, each run's loss beside
# single-process fp32 Adam:

# %%
reduced = ch04.reduce_precision(world_size=2)

# %%
fp32, bf, bf_fp32 = reduced["fp32"], reduced["bf16, reduce in bf16"], reduced["bf16, reduce in fp32"]
# the bytes: bf16 parameters halve the all-gathers; reducing in bf16 halves the reduce-scatter too
gathered = [r["sent"]["param_all_gather"] for r in (bf, bf_fp32, fp32)]
assert gathered[0] * 2 == gathered[1] * 2 == gathered[2], reduced
assert bf["sent"]["grad_reduce_scatter"] * 2 == bf_fp32["sent"]["grad_reduce_scatter"], reduced
assert fp32["max_gap"] <= reduced["fp32_tolerance"], reduced  # fp32: rounding only
for run in (bf, bf_fp32):  # bf16: within bf16's rounding of fp32, whichever precision reduces
    assert run["max_gap"] <= reduced["tolerance"], reduced

# %% [markdown] slideshow={"slide_type": "subslide"}
# Both bf16 runs stay within bf16's rounding of fp32; which of the two lands closer varies from step to
# step, and from one CPU's kernels to another's, so the chapter asserts only what holds everywhere.
# On 2 ranks the bf16 reduction rounds one sum of two bf16 values, a small error beside the bf16
# forward and backward. It grows with the number of ranks whose gradients are summed, which is why
# large runs often reduce in fp32 and pay the reduce-scatter's double bytes.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9. Surviving a failure: sharded checkpoints
#
# Chapter 1 killed a server and training stopped; so far every run in this course dies with its
# first lost rank. Production training survives by **checkpointing**: every few steps each rank
# writes what it cannot recompute, and after a failure a fresh world of processes loads the last
# checkpoint and goes on. With ZeRO-3 or FSDP2 no rank holds the whole model, so no rank can write it
# alone: each writes **its own shards**. PyTorch's `torch.distributed.checkpoint` (DCP) does exactly
# that, and knows FSDP2's DTensors: `get_state_dict` hands it each rank's shards of the parameters
# and of Adam's moments, `dcp.save` has every rank write its own file, and its coordinator writes a
# `.metadata` file last — a folder without one is a checkpoint the failure interrupted, never loaded.
# Besides the model states, a checkpoint must hold where training stands: the step counter and the
# data position (here the batch of step s is a function of the seed and s, and no random numbers are
# drawn while training, so there is no RNG state to keep). The two functions that do it:

# %%
show_source(zero.checkpoint.save, zero.checkpoint.load)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The run (`zero.checkpoint.train` on every rank, `zero.checkpoint.survive` in the notebook): §8's
# model with FSDP2 on 2 ranks, a checkpoint every 4 steps, into a temporary folder removed afterwards.
# First uninterrupted; then again, with rank 1 killed by a real `SIGKILL` in step 10, between its
# forward and its backward — no exception, no goodbye, as when a machine loses power. Rank 0 waits in
# the backward's collective, the runtime sees a dead peer and raises its `WorkerError` naming rank 1.
# Then fresh processes start, load the checkpoint of step 8 and train to the end.

# %%
ckpt = ch04.survive(world_size=2, steps=12, every=4, kill_step=10, kill_rank=1)

# %%
# the failure surfaced as the runtime's error, naming the killed rank
assert ckpt["failed_rank"] == 1 and "SIGKILL" in ckpt["error"], ckpt["error"]
# resumed at the last complete checkpoint before the kill
killed_at, restored = ckpt["kill_step"], ckpt["restored_step"]
assert restored == killed_at // ckpt["every"] * ckpt["every"], ckpt
# from the restored step on, the resumed run's losses are the uninterrupted run's, bit for bit: same
# world size, same shards, same order of every sum; the killed run agreed with it before the kill
assert list(ckpt["resumed"].values()) == ckpt["uninterrupted"][restored:], ckpt
assert list(ckpt["killed"].values()) == ckpt["uninterrupted"][:killed_at], ckpt
# each rank wrote its own file of shards, and DCP's metadata says which tensors each holds
assert set(ckpt["shards"]["keys"]) == {"__0_0.distcp", "__1_0.distcp"}, ckpt["shards"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# Bit for bit, not just close: the resumed ranks hold the same shards and Adam state as the ones that
# died, on the same world size, and add their gradients in the same order, so every float rounds the
# same way. On a *different* number of ranks DCP reshards the checkpoint as it loads (each rank reads
# the pieces of every tensor that its new shard covers, by their offsets in DCP's metadata); the sums
# then run in another order and the losses agree to float rounding only
# (`tests/test_checkpoint.py` resumes a 2-rank checkpoint on 1 rank).
#
# **At cluster scale.** The same code runs; what changes is the numbers. The folder is shared storage
# (a parallel file system or an object store) that every node reaches, and all ranks write their
# shards at once, so the write time δ is roughly one rank's shard over one node's share of the
# storage bandwidth. A checkpoint interval trades time spent writing against work redone after a
# failure: Young's (1974) first-order optimum is an interval of sqrt(2·δ·MTBF), where MTBF is the
# mean time between failures. The printout above puts this run's measured δ into it. On thousands of devices failures come often, so the interval
# shrinks and writing has to get cheap — `dcp.async_save` copies the shards to host memory and writes
# them while training goes on; and the restart itself (finding a healthy node, starting processes,
# loading) becomes a real share of the time lost.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 10. fp16 needs a loss scale, bf16 does not
#
# §5 counted mixed precision's bytes in bfloat16, where the paper's K = 12 assumes fp16 parameters
# and gradients. The bytes are the same; the numbers are not. fp16 keeps 5 exponent bits: its
# smallest (subnormal) value is 2⁻²⁴ ≈ 6·10⁻⁸, and a gradient below half of that rounds to zero —
# it *underflows*, and its weight stops learning. Micikevicius et al. (2018) found many of a real
# network's activation gradients down there and introduced **loss scaling**: multiply the loss by
# S before the backward, so that every gradient is S times larger; divide the fp32 gradients by S
# before the step; when a gradient overflows to inf, skip the step and halve S (dynamic scaling).
# `torch.amp.GradScaler` does it, on a CPU too. **bfloat16** (Kalamkar et al., 2019) keeps fp32's 8
# exponent bits: its range is fp32's, so small gradients survive without a scale, at the price of
# a coarser mantissa (8 bits against fp16's 11).
#
# A case where it shows: 12 tanh layers of 32 initialised small, so that the gradients shrink layer
# by layer on the way back, trained with Adam (which turns even a tiny gradient into a full step, if
# it survives). Each precision starts from the same weights on the same batches, its forward and
# backward under `torch.autocast` with fp32 master weights. One process is enough: the point is the
# number format, not the ranks. The loop, with the scaler's four calls:

# %%
from lesson_lib.milestones.zero import loss_scaling

show_source(loss_scaling.train)

# %%
precision = ch04.loss_scaling()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The table and the figure are measurements of this run. At the first step unscaled fp16 flushes
# most gradient values to zero — the first layers', whose gradients are the smallest; as the last
# layers learn, the gradients grow and fewer flush, but the first layers have lost their first steps,
# and in our runs the loss drifted from fp32's by more than rounding allows. With S = 2¹⁶
# (GradScaler's default) no value flushes and the loss follows fp32's within fp16's rounding. bf16
# flushes none with no scale at all; its tolerance is 8 times looser than fp16's (2⁻⁸ against 2⁻¹¹
# relative per rounding), since it rounds more coarsely. That is why bf16, where the hardware has
# it, has largely replaced fp16 with loss scaling for training.

# %%
assert precision["fp32"]["zero_max"] == 0, precision["fp32"]  # tanh: fp32 has no exact zeros here
assert precision["fp16"]["zero_first"] > 0.5, precision["fp16"]  # unscaled fp16: most values flush
for p in ("fp16+scaling", "bf16"):
    assert precision[p]["zero_max"] < 0.01, (p, precision[p])  # scaled fp16 and bf16: (almost) none
    assert precision[p]["loss_gap"] <= precision[p]["tolerance"], (p, precision[p])  # fp32, to rounding

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 11. Try it yourself
#
# Run all four stages on real processes, with 1, 2 or 4 ranks (the batch of 64 must split evenly)
# and either precision.

# %%
ch04.explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises

# %%
exercises = ch04.exercises()

# %%
exercises["zero1"]


# %%
def my_zero1_step(params, grad, step):
    # rank, n = dist.get_rank(), dist.get_world_size()
    # 1. reduce-scatter the gradients (every rank gets the sum of its own slice); average them
    # 2. step(...) on this rank's slice of params only
    # 3. all-gather the parameters, then return them
    ...

exercises["zero1"].submit(my_zero1_step)

# %%
exercises["stage2"]


# %%
def stage2(psi, n):
    ...  # your formula, in bytes

exercises["stage2"].submit(stage2)

# %%
exercises["stage1"]


# %%
def stage1_update(params, grads, rank, world_size, lr):
    ...  # return this rank's updated slice

exercises["stage1"].submit(stage1_update)

# %%
exercises["fit"]

# %%
exercises["fit"].submit(...)  # replace ... with a stage number

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **memory per rank** — §1's inventory against the paper's formulas, the measured peak beside it (never below it, asserted), §7's table at the scale of real models, and §10's precisions: unscaled fp16 flushing most gradient values to zero at the start, fp16 with loss scaling and bf16 flushing almost none and tracking fp32 within their rounding (asserted).
# 2. **the same training** — §2's identical results across stages, and §6's agreement with PyTorch's ZeroRedundancyOptimizer.
# 3. **ZeRO-1 by hand** — §3's sharded step, and your `my_zero1_step`, judged on the collectives it ran and on its result.
# 4. **the wire** — §4's counted bytes, equal to the formulas (asserted), and §3's prefetch timeline: the same bytes, moved while the previous layer computes, so the forward gathers only the first layer itself (asserted, from events; how much less it waits is printed, on an emulated link); FSDP2's backward prefetch issuing each layer's gather before the next layer's backward has finished (asserted, from events).
# 5. **what PyTorch ships** — §8's FSDP2 (`fully_shard`) beside our stage 3: equal training, equal shards, measured memory, the stage table; hybrid sharding (HSDP) on a 2 × 2 mesh, its bytes per group equal to the formulas and its training to one process's (asserted), and bf16 reduction halving the reduce-scatter's bytes within bf16's rounding of fp32 (asserted); §9's sharded checkpoints (DCP), a rank SIGKILLed mid-step and fresh processes resuming bit for bit.
#
# **On a real cluster:** ZeRO trades memory for traffic: stage 3 moves 1.5× data parallelism's bytes, so on a slow network the stage that just fits is the one to use.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# ZeRO lets every device hold only its share of the model states, but every device still processes
# its own batch: the *global* batch grows with N. Chapter 5 asks how far a batch can grow before
# training suffers — LARS and LAMB.
#
# From a shell: `python -m lesson_lib run zero --stage 3 --world-size 4 --precision mixed --json zero.json`.
