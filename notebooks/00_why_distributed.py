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
# # Chapter 0 — Why distributed?
#
# Deep-learning models outgrew the devices that train them. This chapter measures why, on your own
# machine: the memory bill of training, then **real data-parallel training in 1, 2 and 4 worker
# processes** (PyTorch `torch.distributed`: NCCL with one GPU per rank, Gloo on CPU otherwise), and
# the three problems that data parallelism brings — communication overhead, stragglers, and idle
# resources. Every number and figure below comes from a run made when you execute the cell.
#
# *Run the cells top to bottom (Run → Run All Cells). Each cell calls one function of `lesson_lib`;
# read its source with `ch00.data_parallel??` to see how it works.*

# %%
from lesson_lib.chapters import ch00

# %% [markdown]
# ## 1. Models outgrew devices
#
# In nine years the largest models grew by more than four orders of magnitude: AlexNet had 61 million
# parameters (Krizhevsky et al., 2012), GPT-2 1.5 billion (Radford et al., 2019), GPT-3 175 billion
# (Brown et al., 2020) and Switch-C 1.6 trillion (Fedus et al., 2021). Sources for every point are in
# `data/model_sizes.csv` (its checksum is verified when it is read). Hover over a point for its source.

# %%
ch00.model_growth()

# %% [markdown]
# ## 2. The memory bill of training
#
# Training keeps much more than the parameters: their gradients, and the optimizer's state. With
# mixed-precision Adam that is 2 bytes of fp16 parameters + 2 bytes of fp16 gradients + 12 bytes of
# fp32 master weights, momentum and variance — **16 bytes per parameter** (Rajbhandari et al., ZeRO,
# 2020), before any activation. Move the slider: which devices can hold the model state of a
# 1.5-billion-parameter GPT-2? Of GPT-3?

# %%
ch00.memory_calculator(params=1.5e9)

# %% [markdown]
# GPT-3's training state is 175·10⁹ × 16 bytes = 2.8 TB: no single device in the table holds it, so the
# work *must* be spread over many devices. The cell below checks that claim against the calculator.

# %%
gpt3 = ch00.memory_bill(175e9)["total"]
assert not any(ch00.fits(gpt3).values()), "a device in the table holds GPT-3's training state?"

# %% [markdown]
# ## 3. Data parallelism, for real
#
# The simplest way to use many devices: **every rank (process) holds a full copy of the model**, each
# trains on its own slice of the batch, and before every update the ranks **sum their gradients**
# (an *all-reduce*), so all copies take the same step. `lesson_lib` starts real worker processes and
# keeps them warm between cells. This is all it takes to run a function on every rank:

# %%
from lesson_lib import Cluster, probes

with Cluster(world_size=2) as cluster:
    print(cluster.run(probes.whoami))

# %% [markdown]
# Now train one small model (a 38k-parameter MLP on a generated classification task) with the same
# **global batch of 64 samples** split over 1, 2 and 4 ranks. The loss and step time are drawn live
# while the workers train; then the step time is split into compute and communication, and the memory
# of one rank is broken down by category — measured from the tensors the rank holds, not computed.
# The three loss curves should lie exactly on top of each other: watch for it.
# On a 2-core laptop, 4 ranks share 2 cores: the figures say so, and show each rank's *busy* time
# (CPU time) beside the wall clock.

# %%
runs = ch00.data_parallel(world_sizes=(1, 2, 4))

# %% [markdown]
# Summing gradients over equal slices and dividing by the number of ranks gives exactly the gradient of
# the whole batch, so **data-parallel training must produce the same losses as one process training on
# the combined batch** — up to float rounding, because the sums happen in another order. Checked:

# %%
assert ch00.max_loss_gap(runs) < 1e-5

# %% [markdown]
# ## 4. Problem 1 — communication overhead
#
# Every step, each rank sends about 2(N−1)/N × the model's size to the others (a ring all-reduce,
# Patarasuk & Yuan, 2009). Below, the bytes `lesson_lib` **counted** on the wire, set against that
# formula, as the model grows; and the share of the step spent communicating as the same global batch
# is split over more ranks: each rank computes less, but sends nearly as much.

# %%
overhead = ch00.comm_overhead(hidden_sizes=(32, 128, 512, 1024), world_size=2, results=runs)

# %% [markdown]
# Look at the right-hand panel before you conclude that bigger models communicate *relatively* more:
# per step, the bytes grow like the parameter count Ψ, but so does the compute (about 6·B·Ψ
# floating-point operations for a batch of B samples), and tiny messages pay a fixed latency. Whether
# the communication share grows with the model depends on the machine: it does when the devices
# compute much faster than the network carries bytes (GPUs on a shared network), and when a bigger
# model forces a smaller batch per device to fit in memory. On one laptop, where the "network" is a
# memory copy, it may well not — read the measured lines. What does grow, exactly, when the same
# global batch is split over more ranks is the traffic per sample: each rank computes fewer samples
# but sends almost as many bytes (2(N−1)/N·S), as the counters show below. The time share in the bar
# chart usually follows; with more ranks than cores and a browser on the same 2 cores, it is noisy.

# %%
# Counted bytes equal the exact ring formula; the traffic per computed sample grows with the ranks.
assert all(r["counted_bytes"] == r["exact_bytes"] for r in overhead["by_size"])
per_sample = [s["bytes_per_sample"] for s in overhead["by_world_size"]]
assert per_sample[0] == 0 < per_sample[1] < per_sample[2], per_sample
assert all(s["share"] > 0 for s in overhead["by_world_size"][1:])  # time spent communicating

# %% [markdown]
# ## 5. Problem 2 — stragglers
#
# A synchronous step ends only when the *slowest* rank has sent its gradients. Here rank 1 is made a
# straggler: it really does 3× the forward/backward work of the others (no `sleep`). Watch the step
# time follow the slow rank while the fast one waits inside the all-reduce.

# %%
slow = ch00.straggler(factor=3.0, rank=1)

# %%
# The fast rank's step lasts at least as long as the straggler's work, and it idles more.
assert slow["fast_rank_step_ms"] >= slow["straggler_busy_ms"], slow
assert slow["idle_share"][0] > slow["idle_share"][1], slow

# %% [markdown]
# Try other slowdowns and ranks (each click starts real runs):

# %%
ch00.straggler_explorer()

# %% [markdown]
# ## 6. Problem 3 — idle resources
#
# While a rank waits for its peers — for the all-reduce, for a straggler — its processor does nothing
# useful. The busy time (the rank's CPU time) against its wall time shows how much of the hardware we
# paid for sat idle. With more ranks on the same global batch, the idle share grows:

# %%
idle = ch00.idle_resources(runs)

# %%
assert idle[4] > idle[1], idle

# %% [markdown]
# ## 7. When a rank fails
#
# A real cluster loses workers. `lesson_lib` never hangs on a failure: each collective has a timeout,
# and a rank that raises surfaces here as a `WorkerError` naming the rank, with its traceback; its
# workers are stopped.

# %%
error_text = ch00.failure_demo()

# %% [markdown]
# ## What comes next
#
# Data parallelism replicates everything and talks a lot. The history of the field is a series of
# answers to these three problems: a central **parameter server** (chapter 1), the bandwidth-optimal
# **ring all-reduce** (chapter 2), **pipeline** parallelism to split the model itself (chapter 3),
# **ZeRO** to stop storing everything everywhere (chapter 4), and more.
#
# From a shell, the same experiment: `python -m lesson_lib run data-parallel --world-size 4 --straggler 1:3 --json dp.json`.
