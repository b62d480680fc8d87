# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
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

# %% [markdown]
# # Chapter 3 — Pipeline parallelism
#
# Data parallelism (chapters 0–2) copies the whole model onto every device. When the model itself
# no longer fits, cut it instead: put layers 1–10 on device 1, layers 11–20 on device 2, and so on,
# like stations on an **assembly line**. Activations flow forward from station to station, gradients
# flow back, and each device holds only its share of the parameters.
#
# Cut naively, the line has a problem: while station 2 works, station 1 waits for its gradients — one
# station busy at a time. The fix is to cut the batch too, into **micro-batches**, so that station 1
# starts on micro-batch 2 while station 2 works on micro-batch 1. Two schedules made this practical:
#
# * **GPipe** (Huang et al., 2019): all M forwards, then all M backwards.
# * **1F1B**, or PipeDream-Flush (Narayanan et al., 2021; from PipeDream, Narayanan et al., 2019, and
#   used by Megatron-LM, Narayanan et al., 2021): after a short warm-up each stage alternates one
#   forward and one backward, so it holds far fewer micro-batches' activations at once.
#
# Everything below is measured from real processes: one rank per stage, activations and gradients
# sent point-to-point with `torch.distributed`. The model is a 9-layer MLP (a *layer* here is one
# `Linear` with the `ReLU` after it); stages get consecutive layers, balanced by parameter count.

# %%
from lesson_lib.chapters import ch03

# %% [markdown]
# ## 1. Cut the model
#
# Four stages, each holding two or three consecutive layers. The memory below is what each stage
# process really holds (the bytes of its parameter storage), beside the unsplit model.

# %%
split = ch03.split(stages=4)

# %%
assert sum(split["stage_bytes"]) == split["unsplit_bytes"]      # every parameter lives on exactly one stage
assert max(split["stage_bytes"]) < split["unsplit_bytes"] / 3   # each stage holds about a quarter

# %% [markdown]
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
for schedule, g in gaps.items():
    assert max(g.values()) < 1e-5, (schedule, g)

# %% [markdown]
# ## 3. Watch the assembly line
#
# GPipe with 4 stages and 4 micro-batches. Every stage records each forward (blue), backward (green),
# send (orange, above) and receive (grey, below — mostly *waiting* for a neighbour) with its real start
# and end; the chart fills in as the stages report each step. Then one step up close.
#
# This laptop has fewer cores than stages, so the stages take turns on the cores and the wall clock
# stretches. Each action's *busy* time (CPU time of the stage) is recorded as well; replaying the
# schedule with those times shows the timeline a machine with one core per stage would have. The
# two panels are labelled: measured on the wall clock, and replayed from busy time.

# %%
r = ch03.live(stages=4, microbatches=4, schedule="gpipe")

# %% [markdown]
# Now the three schedules on the same model and the same batch. Naive: the whole batch at once, one
# stage busy at a time. GPipe: the forwards of all micro-batches, then the backwards. 1F1B: the same
# number of slots, but the backwards start as early as possible.

# %%
runs = ch03.schedules(stages=4, microbatches=4)

# %%
# One micro-batch through 4 stages is a relay: exactly one stage works at any moment.
assert abs(runs["naive"]["bubble_busy"] - 3 / 4) < 1e-9
assert runs["gpipe"]["bubble_busy"] < 0.6 and runs["1f1b"]["bubble_busy"] < 0.6

# %% [markdown]
# ## 4. The bubble
#
# With equal stages, a step takes M+P−1 slots of one forward+backward, and each stage works in M of
# them: the idle share of every stage, the **bubble**, is (P−1)/(M+P−1). More micro-batches, smaller
# bubble. Below, the measured bubble for P = 2 and 4 stages as M grows: on the wall clock (crosses)
# and replayed from busy time (dots), beside the formula (dotted).

# %%
sweep = ch03.bubble_sweep(stages=(2, 4), microbatches=(1, 2, 4, 8))

# %%
for p in (2, 4):
    rows = [r for r in sweep if r["stages"] == p]
    busy = [r["busy"] for r in rows]
    assert all(a > b for a, b in zip(busy, busy[1:])), busy             # shrinks as M grows
    assert all(abs(r["busy"] - r["formula"]) < 0.1 for r in rows), rows  # and follows (P−1)/(M+P−1)
    assert abs(rows[0]["busy"] - rows[0]["formula"]) < 1e-9             # M = 1: exactly (P−1)/P

# %% [markdown]
# The measurement stays above the formula, for reasons worth knowing. The formula assumes every
# forward and every backward takes the same time. The stages are not equal: the first stage computes
# no gradient for its input, so it is lighter, and the slowest stage sets the pace. Actions vary from
# one micro-batch to the next, and a stage that waits for a slower neighbour turns that variation
# into idle time. And micro-batches are not free: each one re-reads the weights and adds into the
# gradients, so the work per sample grows as micro-batches shrink (look at the step times printed
# above). That is why real systems do not simply take M = 1000.
#
# ## 5. Memory: GPipe against 1F1B
#
# Activations saved for the backward are the other cost. Under GPipe every stage runs all M forwards
# before its first backward, so it holds all M micro-batches' activations. Under 1F1B stage k holds at
# most P−k of them: after its warm-up, every new forward is matched by a backward that frees one.
# Below, the peak of the activations each stage really held (measured with autograd's saved-tensor
# hooks, micro-batch by micro-batch, over the whole schedule), with 16 samples per micro-batch.

# %%
mem = ch03.activation_memory(stages=4, microbatches=(1, 2, 4, 8))

# %%
P, M = 4, 8
at = {(r["schedule"], r["stage"]): r for r in mem if r["microbatches"] == M}
for k in range(P):
    assert at["1f1b", k]["peak"] <= at["gpipe", k]["peak"]
    assert at["1f1b", k]["in_flight"] == min(P - k, M) and at["gpipe", k]["in_flight"] == M
assert at["1f1b", 0]["peak"] < 0.6 * at["gpipe", 0]["peak"]      # 4 micro-batches held instead of 8

# %% [markdown]
# Same bubble, a fraction of the activation memory: that is why 1F1B replaced GPipe's schedule in
# practice. (GPipe itself fought the memory with re-materialization: drop the activations and
# recompute them during the backward.)
#
# ## 6. Checked against `torch.distributed.pipelining`
#
# PyTorch ships pipeline schedules of its own. The same stages, the same initial weights and the same
# micro-batches, trained with its `ScheduleGPipe` and `Schedule1F1B` on the same Gloo processes:

# %%
lib = ch03.against_torch(stages=4, microbatches=4)

# %%
for schedule, c in lib.items():
    assert "error" not in c, c
    assert max(c["ours_vs_torch"].values()) < 1e-5, (schedule, c)

# %% [markdown]
# ## 7. Try it yourself
#
# Each click starts real processes (4 stages on a laptop take a second or two).

# %%
ch03.explorer()

# %% [markdown]
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch03.exercises(stages=4)

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

# %% [markdown]
# ## What comes next
#
# Pipelining splits the model by layers and pays with a bubble. Chapter 4 splits it another way:
# ZeRO keeps data parallelism but shards the optimizer state, the gradients and finally the
# parameters across the data-parallel ranks, so that no rank holds a full copy.
#
# From a shell:
# `python -m lesson_lib run pipeline --stages 4 --microbatches 8 --schedule 1f1b --steps 5 --global-batch 128 --json pp.json`
# (`--stages 1` runs the unsplit model).
