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
# # Chapter 0 — Why distributed?
#
# Deep-learning models outgrew the devices that train them. This chapter measures why, on your own
# machine: first the memory bill of training; then **real data-parallel training in 1, 2 and 4 worker
# processes**, written with PyTorch's `torch.distributed`; then the three problems that data
# parallelism brings — communication overhead, stragglers and idle resources. Every number and
# figure below comes from a run made when you execute the cell.
#
# *Run the cells top to bottom (Run → Run All Cells). The distributed code is in the cells; the figures
# come from `lesson_lib.chapters.ch00`: after the first cell, `ch00.straggler??` (or any other of its
# functions) shows how a figure is made.*

# %% [markdown]
# **After this chapter you can:**
#
# 1. add up the memory a model's training needs — parameters, gradients, optimizer state — and say which devices it fits (§2);
# 2. start real ranks, send and all-reduce tensors between them, and train data-parallel on 1, 2 and 4 ranks to the same losses as one process (§3, first exercise);
# 3. measure data parallelism's three problems on this machine: the bytes and time of communication, a straggler's idle time, and each rank's time split into busy, waiting for a core and waiting for its peers (§4–6);
# 4. start each gradient's all-reduce from a hook during the backward and show on a timeline how much communication it hid (§4, second exercise).
#
# **Before it:** a PyTorch training loop (a model, `loss.backward()`, `optimizer.step()`); no distributed code.
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
from lesson_lib.chapters import ch00
from lesson_lib.chapters.timed import timed_claim

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Models outgrew devices
#
# In nine years the largest models grew by more than four orders of magnitude: AlexNet had 61 million
# parameters (Krizhevsky et al., 2012), GPT-2 1.5 billion (Radford et al., 2019), GPT-3 175 billion
# (Brown et al., 2020) and Switch-C 1.6 trillion (Fedus et al., 2021). Hover over a point for its
# source; all of them are in `data/model_sizes.csv`, whose checksum is verified when it is read.

# %%
ch00.model_growth()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. The memory bill of training
#
# Training keeps much more than the parameters: their gradients, and the optimizer's state. Together
# they are the **model state**. *Mixed precision* computes the forward and backward in 16-bit floats
# (fp16) and keeps an fp32 *master copy* of the weights for the update. With mixed-precision Adam
# that is 2 bytes of fp16 parameters + 2 bytes of fp16 gradients + 12 bytes of fp32 master weights and
# Adam's two running averages (momentum and variance): **16 bytes per parameter** (Rajbhandari et
# al., ZeRO, 2020), before any activation.
#
# Move the slider: which devices can hold the model state of a 1.5-billion-parameter GPT-2? Of GPT-3?

# %%
ch00.memory_calculator(params=1.5e9)

# %% [markdown] slideshow={"slide_type": "subslide"}
# GPT-3's training state is 175·10⁹ × 16 bytes = 2.8 TB: no single device in the table holds it, so the
# work *must* be spread over many devices. The cell below checks that claim against the calculator.

# %%
gpt3 = ch00.memory_bill(175e9)["total"]
assert not any(ch00.fits(gpt3).values()), "a device in the table holds GPT-3's training state?"

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The bill, measured
#
# The bill is a formula. Is it what training really allocates? Below, 2 **ranks** — worker processes,
# numbered 0 and 1, which §3 introduces properly — each build the same MLP (12 hidden layers of width
# 1024; its parameter count Ψ is printed). Each trains it alone for two steps of **fp32 Adam**: 4 bytes
# of parameter + 4 of gradient + 8 of Adam's two moments = 16 bytes per parameter (the calculator's
# "fp32 Adam" row). The batch is 16 samples, so that the model state dominates. The ranks do not talk
# to each other yet; §3 adds that.
#
# Three numbers per rank. The **measured peak**: `PeakMemory` counts every allocation and free that
# torch's allocator makes while it is open and keeps the peak of the live bytes (on a GPU,
# `torch.cuda.max_memory_allocated`; chapter 4 opens it). The **bill**, from the formula. The
# **inventory**: what the rank knows it holds at the end — the storages of its parameters, gradients
# and Adam state.

# %%
import torch
import torch.nn.functional as F

from lesson_lib import warm_cluster
from lesson_lib.metrics import optimizer_tensors, storage_bytes
from lesson_lib.models import mlp
from lesson_lib.peakmem import PeakMemory


def train_and_measure(hidden=1024, depth=12, batch=16, steps=2):  # runs on every rank
    with PeakMemory() as meter:  # counts from here: the model, its gradients, Adam, every temporary
        model = mlp(32, hidden, depth, 10, 0)   # the same seed, so the same model, on every rank
        adam = torch.optim.Adam(model.parameters())
        x, y = torch.randn(batch, 32), torch.randint(0, 10, (batch,))
        for _ in range(steps):
            adam.zero_grad()
            F.cross_entropy(model(x), y).backward()
            adam.step()
    params = list(model.parameters())
    grads, state = [p.grad for p in params], optimizer_tensors(adam)  # Adam's two moments per tensor
    held = storage_bytes(params) + storage_bytes(grads) + storage_bytes(state)
    return {"params": sum(p.numel() for p in params), "tensors": len(params), "measured": meter.peak,
            "inventory": held, "largest": max(p.nbytes for p in params)}


per_rank = warm_cluster(2).run(train_and_measure)
psi, largest = per_rank[0]["params"], per_rank[0]["largest"]
bill = ch00.memory_bill(psi, "fp32 Adam")
print(f"Ψ = {psi:,} parameters; the bill, {bill['bytes_per_param']} bytes × Ψ: {bill['total'] / 1e6:.1f} MB; "
      f"the largest tensor: {largest / 1e6:.1f} MB")
print(f"{'rank':>4} {'measured peak MB':>17} {'inventory MB':>13} {'measured − inventory':>21}")
for rank, r in enumerate(per_rank):
    excess = r["measured"] - r["inventory"]
    print(f"{rank:>4} {r['measured'] / 1e6:>17.1f} {r['inventory'] / 1e6:>13.1f} "
          f"{excess / largest:>10.3f} × largest")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The inventory is the bill, to a few bytes: Adam also keeps a step count per tensor, a scalar.
#
# The measured peak is above both, by about twice the largest parameter tensor. It falls inside
# Adam's step, when every parameter, gradient and moment is alive. Adam updates one tensor at a time
# and computes √v and then √v divided by its bias correction: two temporaries the size of the tensor
# it updates (chapter 4 measures one such step).
#
# The activations are not in the peak here: with 16 samples they are small, and the backward has
# freed them before the step. With a large batch the peak moves into the backward, where activations
# and gradients are alive together, and the bill ("before any activation") says less. The meter
# cannot see memory outside torch's allocator: Python objects, Gloo's own buffers.

# %%
for r in per_rank:
    assert r["params"] == psi and r["measured"] == per_rank[0]["measured"]  # the same model on every rank
    assert 0 <= r["inventory"] - bill["total"] <= 4 * r["tensors"], r      # + one float32 step count each
    excess = r["measured"] - r["inventory"]
    # Adam's two temporaries on the largest tensor; the rest (the batch, the loss, the step's scalars)
    # is far below 1% of the bill
    assert 2 * largest <= excess <= 2 * largest + 0.01 * bill["total"], (r, largest)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Data parallelism, for real
#
# First the vocabulary of `torch.distributed`. A **rank** is one worker process, numbered 0…N−1; the
# **world size** is N; the **process group** is the set of ranks that talk to each other (here all of
# them, the default group). The **backend** moves the bytes: Gloo on CPUs, NCCL on NVIDIA GPUs (one GPU
# per rank). `lesson_lib` starts the processes, calls `init_process_group` in each and keeps them warm
# between cells. `cluster.run(fn)` calls `fn()` on every rank and returns the results as a list indexed
# by rank; `fn` may be a function you write in a cell.
#
# **Data parallelism** is the simplest way to use many devices: **every rank holds a full copy of the
# model** and trains on its own slice of the batch. Before every update the ranks **sum their
# gradients** (an *all-reduce*, below), so all copies take the same step.

# %%
import torch.distributed as dist

from lesson_lib import numerics, show_source

cluster = warm_cluster(4)  # 4 worker processes, started once and kept warm


def hello():
    return dist.get_rank(), dist.get_world_size(), dist.get_backend()


cluster.run(hello)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Point to point**: `dist.send(t, dst)` on one rank, `dist.recv(t, src)` on another, which fills its
# own tensor in place. Every `send` needs a matching `recv`, or both ranks wait.


# %%
def pass_a_tensor():
    t = torch.zeros(3)
    if dist.get_rank() == 0:
        t = torch.tensor([1.0, 2.0, 3.0])
        dist.send(t, dst=1)
    elif dist.get_rank() == 1:
        dist.recv(t, src=0)  # t now holds rank 0's values
    return t


received = cluster.run(pass_a_tensor)
print(received)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **A collective** is a call that every rank of the group makes together. After `dist.all_reduce(t)`,
# every rank's `t` holds the element-wise **sum** over all ranks (in place).


# %%
def sum_over_ranks():
    t = torch.tensor([float(dist.get_rank()), 1.0])
    dist.all_reduce(t)
    return t


summed = cluster.run(sum_over_ranks)
print(summed)

# %%
assert torch.equal(received[1], torch.tensor([1.0, 2.0, 3.0])) and not received[2].any()
assert all(torch.equal(t, torch.tensor([0.0 + 1 + 2 + 3, 4.0])) for t in summed)  # 0+1+2+3, and N

# %% [markdown] slideshow={"slide_type": "subslide"}
# That is all data parallelism needs. Here is one training run written out. Every rank starts from
# the same model (built here once and sent to each rank) and takes *its* slice of each **global
# batch** (the batch all ranks share). It computes its gradients, all-reduces every gradient, divides
# by the number of ranks, then steps. The model and data are the chapter's small problem: a
# 38k-parameter MLP on a generated classification task, with a global batch of 64 samples.

# %%
from lesson_lib.data import batch_indices, shard, teacher_classification
from lesson_lib.milestones import data_parallel as dp


def train_data_parallel(model, data, cfg):  # every rank receives its own copy of the same model
    rank, world = dist.get_rank(), dist.get_world_size()
    x_all, y_all = data
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        batch = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)  # the same on every rank
        idx = shard(batch, rank, world)                                        # this rank's slice
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        for p in model.parameters():   # the data-parallel part: sum, then average, every gradient
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()               # every rank takes the same step
        loss = loss.detach()
        dist.all_reduce(loss)          # only to report the whole batch's loss
        losses.append(loss.item() / world)
    return losses


cfg = ch00.config()
model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
data = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
mine = {n: warm_cluster(n).run(train_data_parallel, model, data, cfg)[0] for n in (1, 2, 4)}
reference = dp.reference(cfg)  # one process, the whole global batch, no torch.distributed at all

# %% [markdown] slideshow={"slide_type": "subslide"}
# The mean over N equal slices of each slice's mean gradient is the mean over the whole batch. So the
# ranks must train exactly like one process on the whole batch, up to float rounding, because the sums
# happen in another order. The tolerance below follows from that: a few float32 roundings
# (ε ≈ 1.2·10⁻⁷, relative to the loss) per step, compounded over the steps. `numerics.sum_order_tolerance??`
# shows it; every chapter takes its tolerances from `lesson_lib.numerics`.

# %%
tol = numerics.sum_order_tolerance(reference)
for n, losses in mine.items():
    gap = numerics.max_gap(losses, reference)
    print(f"{n} rank(s): largest loss difference from one process = {gap:.1e} (tolerance {tol:.1e})")
    assert gap <= tol, (n, gap, tol)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same random numbers on every rank, or not
#
# Above, every rank started from the same weights because the model was built once and sent to each.
# A training script usually builds it on every rank instead, after `torch.manual_seed(seed)` with the
# seed from its config: the same seed on every rank, so **every rank draws the same random numbers**.
# That is right wherever the ranks must agree: data parallelism needs identical initial weights on
# every replica, and the batch order above (`batch_indices(..., cfg.seed)`) is the same on every rank
# by design, each rank then taking its own slice. It is wrong wherever the ranks must differ: weight
# shards that each rank of a tensor-parallel group initialises for its own slice of a layer (one seed
# gives every slice the same values), dropout masks on the activations split across that group
# (Megatron-LM keeps a second generator, seeded per tensor-parallel rank, for them), or random noise
# and augmentation applied to each rank's own data. It happens at scale: the SmolLM3 run had a
# tensor-parallel group initialised with one seed and needed a restart (Hugging Face, "The Smol Training
# Playbook", 2025). The fix is a seed per rank where the numbers must differ:
# `torch.manual_seed(base + rank)`.
#
# Without any seed, a process's CPU generator is seeded from the operating system when torch starts,
# so CPU ranks differ; CUDA generators, by torch's source, start from one fixed default seed, so
# unseeded GPU ranks all draw the same numbers (a CPU run here cannot show that case). The runtime here gives each job fresh generators, as a freshly started process
# has: a seed set in one job does not carry into the next (the last line below checks it).
# `ch00.seeding??` shows the jobs.

# %%
seeds = ch00.seeding(base=1234)  # torch.rand(4) on the 4 warm ranks, seeded three ways
assert seeds["same"]["torch.manual_seed(base) on every rank"]  # one seed: every rank draws the same
assert not seeds["same"]["torch.manual_seed(base + rank)"]  # a seed per rank: each its own numbers
assert not seeds["same"]["not seeded"]  # CPU generators are seeded from the OS at start-up
assert not seeds["carried_over"]  # the seed set in one job is gone in the next

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's version, which the figures below run, is the same loop plus counters and timers. It
# keeps all gradients in **one flat bucket** — a *bucket* is one contiguous buffer that holds several
# gradients (`dp.build`) — so a single all-reduce per step moves them all, then divides. The
# all-reduce is `comm.all_reduce`: our own ring, counted byte by byte, which chapter 2 opens.

# %%
show_source(dp.train)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the library's version with the same **global batch of 64 samples** split over 1, 2 and 4
# ranks. The loss and step time are drawn live while the workers train. Then the step time is split
# into compute and communication, and one rank's memory is broken down by category, measured from the
# tensors it holds. The three loss curves should lie exactly on top of each other: watch for it.
#
# Where ranks outnumber the cores they take turns on them (they are *oversubscribed*); the figures
# say so, and show each rank's **busy** time (its CPU time) beside the wall clock.

# %%
runs = ch00.data_parallel(world_sizes=(1, 2, 4))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same check for the library's runs: **data-parallel training must produce the same losses as one
# process training on the combined batch**, up to float rounding:

# %%
assert ch00.max_loss_gap(runs) < 1e-5

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Problem 1 — communication overhead
#
# Every step, each rank sends about 2(N−1)/N × the model's size to the others. That is the cost of a
# **ring all-reduce** (Patarasuk & Yuan, 2009), where the ranks pass pieces of the gradient round a
# ring; chapter 2 builds it. Below, the bytes `lesson_lib` **counted** on the wire, set against that
# formula, as the model grows. Then the share of the step spent communicating as the same global batch
# is split over more ranks: each rank computes less, but sends nearly as much.

# %%
overhead = ch00.comm_overhead(hidden_sizes=(32, 128, 512, 1024), world_size=2, results=runs)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Bigger models do not necessarily communicate *relatively* more. Per step the bytes grow like the
# parameter count Ψ, but so does the compute: about 6·B·Ψ floating-point operations for a batch of B
# samples, 2Ψ per sample forward and 4Ψ backward (the C ≈ 6·N per token of Kaplan et al., 2020,
# "Scaling Laws for Neural Language Models"). And tiny messages pay a fixed **latency**, a cost per
# message whatever its size.
#
# The communication share grows with the model when the devices compute much faster than the
# network carries bytes (GPUs on a shared network), or when a bigger model forces a smaller batch per
# device. Here the "network" is a memory copy, so read the measured lines in the right-hand panel.
#
# What grows exactly, when the same global batch is split over more ranks, is the traffic per
# sample: each rank computes fewer samples but sends almost as many bytes, 2(N−1)/N·S for S bytes of
# gradients. The counters below show it; the time share in the bar chart usually follows, noisily
# where ranks outnumber the cores.

# %%
# Counted bytes equal the exact ring formula; the traffic per computed sample grows with the ranks.
assert all(r["counted_bytes"] == r["exact_bytes"] for r in overhead["by_size"])
per_sample = [s["bytes_per_sample"] for s in overhead["by_world_size"]]
assert per_sample[0] == 0 < per_sample[1] < per_sample[2], per_sample
assert all(s["share"] > 0 for s in overhead["by_world_size"][1:])  # time spent communicating

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Hiding the communication behind the backward
#
# Our loop above waits for the whole backward before it sends a byte, and then computes nothing while
# the bytes travel. But the backward produces the gradients **last layer first**: the last layer's
# gradient is final long before the first layer's is computed. PyTorch's `DistributedDataParallel`
# (DDP; Li et al., 2020, "PyTorch Distributed", VLDB) starts all-reducing a gradient as soon as
# autograd has written it, while the backward goes on with earlier layers.
#
# Two tools do it. A **hook** is a function of yours that autograd calls at that moment
# (`register_post_accumulate_grad_hook`). A collective started with `async_op=True` returns at once,
# with a handle to wait on later. That is all it takes:


# %%
def train_overlapped(model, data, cfg):
    rank, world = dist.get_rank(), dist.get_world_size()
    x_all, y_all = data
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    in_flight = []

    def all_reduce_now(p):  # autograd calls this as soon as p.grad is complete
        in_flight.append(dist.all_reduce(p.grad, async_op=True))  # start it; do not wait

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(all_reduce_now)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()       # the last layers' all-reduces travel while the first layers compute
        for work in in_flight:  # every gradient must be summed before the update
            work.wait()
        in_flight.clear()
        for p in model.parameters():
            p.grad /= world
        optimizer.step()
        loss = loss.detach()
        dist.all_reduce(loss)
        losses.append(loss.item() / world)
    return losses


overlapped = cluster.run(train_overlapped, model, data, cfg)[0]
gap = max(abs(a - b) for a, b in zip(overlapped, reference))
print(f"4 ranks, all-reduces started during the backward: largest gap from one process = {gap:.1e}")
assert gap <= tol, (gap, tol)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Every rank's autograd finishes the gradients in the same order, so the ranks start the same
# all-reduces in the same order, as collectives require. One all-reduce per parameter tensor sends many
# small messages, each paying the fixed latency. DDP groups the gradients into **buckets** (25 MB by
# default) and all-reduces a bucket once its last gradient is written. The library does the same with
# `bucket_mb=`. Our ring is Python code that blocks until it is done, so it runs on a **communication
# thread** while the main thread goes on with the backward:

# %%
from lesson_lib import buckets

show_source(buckets.Overlap)
show_source(dp.overlapped)

# %% [markdown] slideshow={"slide_type": "subslide"}
# `overlapped` follows DDP in two details. A bucket closes once it *reaches* `bucket_mb`, so a
# layer's small bias travels with the weight beside it instead of paying a collective's fixed cost
# alone. (Chapter 4's ZeRO-2 closes a bucket *before* it would pass the cap, as DeepSpeed does,
# because there the cap bounds memory.) And each gradient is divided by the number of ranks on its
# way into its bucket: one pass moves and divides it, where zeroing the bucket, adding into it and
# dividing afterwards would take three.
#
# Below, one step of a wider model (hidden width 1024, about two million parameters) on 2 ranks:
# first with one all-reduce after the backward, then with buckets of 2 MiB all-reduced during it (our
# ring, counted). Each rank's bars start at its own backward. The bucketed all-reduces begin while the
# backward is still computing. Here that saves little or nothing, and varies from run to run: the
# "network" is a memory copy made by the same cores that compute the backward.
# `python -m lesson_lib bench ddp` times our step against DDP's.

# %%
ov = ch00.overlap(bucket_mb=2.0)

# %%
# Every bucket was launched before the backward returned, on every rank, and training did not change.
assert ov["buckets"] > 1 and ov["launched_during_backward"] == [ov["buckets"]] * 2, ov
assert ov["loss_gap"] <= tol, ov

# %% [markdown] slideshow={"slide_type": "subslide"}
# On a cluster the bytes cross a network card while the cores compute. To see that case here, the
# next run **emulates** a 2 Gbit/s link and gives the backward more work (a global batch of 1024).
# *Emulated* means that after each real transfer the rank sleeps out the rest of bytes ÷ bandwidth,
# leaving its core free, as waiting on a network card would (chapter 6's `comm.set_link`).
#
# Without buckets, every byte waits for the whole backward. With buckets, part of every rank's
# transfer can run during it. What holds in every run is asserted: every bucket is handed to the link
# before the backward ends. How much of the transfer then runs during the backward is measured from
# the buckets' timeline and printed: on a busy machine the transfers may not get a core until the
# backward is over, and the cell says so with the load instead of stopping. Both waits after the
# backward are printed; whether buckets shorten it varies from run to run.
#
# <details><summary>Why the wait after the backward varies here</summary>
#
# The transfers' real memory copies and Gloo's threads compete with the backward for the same cores.
# In a busy run (a browser beside it) the backward slows by what the overlap saved. On a cluster a
# network card moves the bytes while the cores compute.
#
# </details>

# %%
ov_link = ch00.overlap(bucket_mb=2.0, global_batch=1024, link_gbps=2.0)

# %%
flat_wait, bucketed_wait = ov_link["exposed_comm_ms"].values()
print(f"waiting after the backward (this run): {flat_wait:.1f} ms with one all-reduce, "
      f"{bucketed_wait:.1f} ms with buckets")
# the order of events holds in every run: each bucket is handed to the link before the backward ends
assert ov_link["launched_during_backward"] == [ov_link["buckets"]] * 2, ov_link
assert ov_link["loss_gap"] <= tol, ov_link
# how much of the transfer ran while the backward computed is time: shown, not asserted
timed_claim(min(ov_link["hidden_share"]) > 0.1, "every rank's backward hid part of its transfer",
            "hidden: " + ", ".join(f"{h:.0%}" for h in ov_link["hidden_share"]))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Problem 2 — stragglers
#
# A **straggler** is a rank slower than the others. A synchronous step ends only when the *slowest*
# rank has sent its gradients. Here rank 1 is made a straggler: it really does 3× the forward and
# backward work of the others (no `sleep`). The figure shows, per step, the wall time of the step and
# each rank's *work* (CPU time). The fast rank works far less than the straggler, yet its step lasts
# as long: it spends the difference waiting inside the all-reduce.
#
# These claims compare ranks within one run, so they hold in every run. A second run without a
# straggler is only printed, not compared: two runs share the cores with whatever else runs at the
# time, so their wall clocks can come out in either order.

# %%
slow = ch00.straggler(factor=3.0, rank=1)

# %%
# The straggler really works more; the fast rank's step lasts at least as long as the straggler's
# work, and the fast rank idles more.
# (3× the forward and backward, but the same all-reduce and update: between 1× and 3× the busy time;
# runs here gave 1.4× to 2.2×)
assert slow["straggler_busy_ms"] > 1.1 * slow["fast_busy_ms"], slow
assert slow["fast_rank_step_ms"] >= slow["straggler_busy_ms"], slow
assert slow["idle_share"][0] > slow["idle_share"][1], slow

# %% [markdown] slideshow={"slide_type": "subslide"}
# Try other slowdowns and ranks (each click starts real runs):

# %%
ch00.straggler_explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Problem 3 — idle resources
#
# While a rank waits for its peers — for the all-reduce, for a straggler — its processor does nothing
# useful. Each rank's wall time splits into three parts:
#
# * **busy**: its CPU time;
# * **waiting for a core**: ready to run, but the operating system gave the core to something else
#   (another rank, this notebook, a browser);
# * **waiting for peers**: the rest, blocked in communication, for the bytes and for slower ranks
#   (and a little time off the CPU for other reasons, system calls and page faults: all the rest is
#   of that kind at one rank, which has no peers).
#
# Only the last is the idle hardware of a real cluster, where each rank has its own device. The second
# comes from more ranks (and programs) than cores, and varies with whatever else the machine runs
# (Linux reports it in `/proc/<pid>/task/<tid>/schedstat`). On a quiet machine, more ranks on the same
# global batch spend a larger share waiting for peers. The shares are timings, though, and a busy
# machine moves them: in the course's workshop test (three learners running this notebook at once on
# one 2-core CI machine) the one-rank row once showed 70 % off the CPU for other reasons, more than the
# four-rank row's 53 % waiting for peers.
#
# What no load can change is the order of events. An all-reduce's output needs every rank's input,
# so no rank's all-reduce can end before the last rank has begun its own; every rank that began earlier
# waited at least the difference. The ranks share one clock, so the last step shows it:

# %%
idle = ch00.idle_resources(runs)

# %%
assert idle[1]["waited_for_the_last"] is None  # one rank: no all-reduce, no peer to wait for
for k in (2, 4):
    order = idle[k]["waited_for_the_last"]
    assert order["every_end_after_last_start"], (k, order)
    assert len(order["waited_ms"]) == k and min(order["waited_ms"]) == 0.0, (k, order)  # the last: none

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. When a rank fails
#
# A real cluster loses workers. `lesson_lib` never hangs on a failure: each collective has a timeout,
# and a rank that raises surfaces here as a `WorkerError` naming the rank, with its traceback. The
# other workers are stopped.

# %%
error_text = ch00.failure_demo()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercise: write the gradient step yourself
#
# Your function runs on real ranks: the check trains a few steps on 2 and on 4 ranks with your
# `average_gradients(model)` between `backward()` and the optimizer step, and compares the losses with
# one process training on the whole batch. If your ranks end up waiting for each other, the check stops
# after 15 s and says where each rank was waiting.

# %%
exercises = ch00.exercises()
exercises["average_gradients"]


# %%
def average_gradients(model):
    ...  # your code here: every rank's p.grad must become the whole batch's gradient


exercises["average_gradients"].submit(average_gradients)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: overlap the all-reduce with the backward
#
# Now start each gradient's all-reduce *during* the backward, as section 4 did, without looking back
# at it if you can. The check also records, on every rank, whether your `all_reduce` calls came while
# autograd was running and whether they blocked it.

# %%
exercises["start_overlap"]


# %%
def start_overlap(model):
    ...  # your code here: register hooks, and return finish()


exercises["start_overlap"].submit(start_overlap)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **the memory bill** — §2's table: GPT-3's training state fits no single device (asserted); and the bill measured on 2 ranks: the allocator's peak is the inventory of parameters, gradients and Adam state (the bill, 16 bytes per parameter) plus Adam's two temporaries (asserted).
# 2. **data parallelism equals one process** — §3's loss curves on 1/2/4 ranks, equal to float rounding (asserted), and your `average_gradients`.
# 3. **the three problems** — §4's counted bytes and communication share, §5's straggler timeline, §6's time waiting for peers: no rank's all-reduce ends before the last rank begins it (asserted).
# 4. **overlap** — §4's bucketed backward on a timeline, and your `start_overlap`, judged on whether an all-reduce was still running while autograd went on.
#
# **On a real cluster:** the all-reduce of every gradient, every step, is data parallelism's price: every later chapter cuts it, hides it, or removes the memory that forces it.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# Data parallelism replicates everything and talks a lot. The history of the field is a series of
# answers to these three problems: a central **parameter server** (chapter 1), the bandwidth-optimal
# **ring all-reduce** (chapter 2), **pipeline** parallelism to split the model itself (chapter 3),
# **ZeRO** to stop storing everything everywhere (chapter 4), and more.
#
# From a shell, the same experiment: `python -m lesson_lib run data-parallel --world-size 4 --straggler 1:3 --json dp.json`.
