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
# # Chapter 10 — When machines fail and the network is slow
#
# Every "days" figure in this course so far assumed that no machine ever fails and that the network
# is a datacentre's. At the scale chapter 7 models, neither holds. Llama 3 405B's pre-training saw
# 419 unexpected interruptions in a 54-day snapshot on 16,384 GPUs (Dubey et al., 2024, §3.3.4): one
# every three hours. And since 2023, models have been trained across the internet, where a link is
# a thousand times slower than InfiniBand. Chapter 4 checkpointed and restarted after a killed rank;
# chapter 1 replicated a server shard. This chapter finishes the story: what failures cost, how
# today's systems survive them without stopping (per-step fault tolerance, torchft), and how to
# train when the network is the bottleneck (LocalSGD and DiLoCo).

# %% [markdown]
# **After this chapter you can:**
#
# 1. say why a job's mean time between failures falls with its size, measure a checkpoint's cost three ways (blocking, asynchronous, into a peer's memory), weigh the checkpoint's cost against the restart's, and pick the interval that wastes least (Young, Daly), checked against Llama 3's report (§1, interval exercise);
# 2. write per-step fault tolerance — a quorum each step, a step discarded when a peer vanishes mid-exchange, a returning replica healed from a live peer — run it with a replica SIGKILLed, and check torchft against it (§2, exchange exercise);
# 3. write DiLoCo's outer step (Nesterov on the averaged pseudo-gradient), check it against torchft's, count H times fewer bytes, and weigh quality against data parallelism and time over a slow link (§3, outer-step exercise);
# 4. read what INTELLECT-1 and Streaming DiLoCo report, and say what a CPU run here cannot show (§4).
#
# **Before it:** chapters 0, 4 (checkpoints with DCP) and 7 (the cost model's days).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import time

import torch
import torch.distributed as dist

from lesson_lib import comm, show_source
from lesson_lib.chapters import ch10, ch10_exercises
from lesson_lib.chapters.timed import timed_claim
from lesson_lib.milestones.resilience import failures, ft_step, torchft_glue
from lesson_lib.milestones.resilience import task as T

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. What failures cost
#
# Failures of independent devices add their rates: n GPUs that each fail once every M₁ hours fail,
# as a job, once every **M = M₁ / n** hours. A GPU that fails once in six years makes a 16,384-GPU job
# fail every three hours. A job that checkpoints after every τ seconds of work, each checkpoint
# stopping it for δ, and restarting in R, pays two separate costs. Per interval it pays δ. Per
# failure it loses on average half an interval, (τ + δ)/2, and the restart R. **Goodput**, useful
# time over wall time, is then about (1 − (R + (τ + δ)/2)/M) · τ/(τ + δ). It is largest near
# **τ = √(2δM)** (Young, 1974); Daly (2006) refines it for δ not small against M. δ sets the interval
# and its own overhead; R does not move the interval at all, it is paid once per failure:

# %%
show_source(failures.young)
show_source(failures.daly)
show_source(failures.goodput)
show_source(failures.waste)

# %% [markdown] slideshow={"slide_type": "subslide"}
# δ is how long the training loop stops, and that depends on how the checkpoint is taken. Measured
# here on 2 ranks, three ways, as the function below runs them: `dcp.save` (chapter 4's DCP) blocks
# until the files are written; `dcp.async_save` returns once the state is staged and writes in the
# background; a copy into the next rank's memory keeps a replica of each shard off its own machine
# (Gemini's approach, below). Then Llama 3's failure count and its storage's rate (Dubey et al., 2024,
# §3.3.1: 2 TB/s sustained) price its own checkpoint, and goodput is taken apart by cause for each
# restart time R, which the report does not give and is printed as the assumption:

# %%
show_source(failures.save_job)

# %%
cost = ch10.failure_cost()

# %%
save = cost["save"]
assert save["bytes"] > 16e6 and save["peer_bytes"] == 2 * 2 * 4 * 1_000_000  # written; each shard copied
assert save["async_equal"] and save["peer_equal"]  # the async checkpoint and the peers' copies read back
mtbf = [r["mtbf_h"] for r in cost["table"]]
assert all(a > b for a, b in zip(mtbf, mtbf[1:]))  # more devices, failures more often
assert 1 < cost["delta_s"] < 10  # 6.48 TB at 2 TB/s: seconds, not minutes
ten = cost["rows"][-1]  # R = 10 min
waste = ten["waste"]
assert ten["goodput"] > 0.9 and waste["restarts"] > waste["checkpoints"] + waste["lost work"]
assert cost["delta_max_s"] < 600  # 10-minute checkpoints could not reach 90 % with any restart

# %% [markdown] slideshow={"slide_type": "subslide"}
# Once δ is seconds, as a 2 TB/s store makes it for a 405B model (and an asynchronous save shrinks
# the stall further), checkpoints and the work lost between them cost about 2.4 % of the run; what
# remains is R, paid at every failure. At a 10-minute restart, restarts waste more than both together,
# and Llama 3's over 90 % holds for any R under the bound printed; the answer flips only for restarts
# under about 4.5 minutes (printed), where checkpoints and lost work outweigh them. The checkpoint interval is the smaller
# half of the problem; the restart is where the time goes, and every restart stops *every* GPU. §2 is
# about not stopping them.

# %% [markdown]
# Try other sizes and costs (a GPU failing as often as Llama 3's did):

# %%
ch10.calculator(cost["device_mtbf_h"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Per-step fault tolerance, written out
#
# Chapter 4 stopped the whole job and restarted it from the last checkpoint. Per-step fault tolerance
# keeps the job running. Google's Gemini report (Gemini Team, 2023, §3) describes the idea at scale:
# redundant in-memory copies of the model state, and recovery from an intact model replica instead of
# from a checkpoint on persistent storage. torchft (PyTorch, 2025) builds it for PyTorch: the model is
# trained by **replica groups** (each one data-parallel copy, which may itself be sharded inside), and
# every step:
#
# 1. each live replica **joins** the step; a **lighthouse** (one small server) answers with the
#    **quorum**, the replicas that take part, and which fresh one heals from which live one;
# 2. a fresh replica **heals**: it copies a live peer's weights, optimizer state and step;
# 3. the members **exchange** gradients; if a member vanishes before its gradient arrives, the step
#    is **discarded** by every survivor (nobody can have all the gradients), and the next quorum is
#    formed without it.
#
# Write step 3 yourself before you read ours: the check runs 2 and 3 replica processes on a
# `FileStore` (a folder; nothing listens on a port) and SIGKILLs one of them mid-exchange.

# %%
exercises = ch10_exercises.exercises()
exercises["exchange"]

# %%
def exchange(store, rnd, me, grad, members):
    ...  # send yours, wait for every member's; None if dead/{rnd} appears while one is missing


exercises["exchange"].submit(exchange)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Here is ours, on the same `FileStore`. Each replica:

# %%
show_source(ft_step.exchange)
show_source(ft_step.replica)

# %% [markdown] slideshow={"slide_type": "subslide"}
# and the lighthouse, a thread beside them:

# %%
show_source(ft_step.lighthouse)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two replica groups, each one process, 48 steps of a wider MLP (2,048 hidden units, 512 samples a
# step, so each step is a few milliseconds of real compute). Replica 1 SIGKILLs itself in step 5, after
# replica 0 sent its gradient and before its own: mid-exchange. A spare process, started with the
# others (as a cluster keeps spare machines), takes its place. The course's `warm_cluster` stops every
# rank when one dies — right for a job, wrong here — so these replicas run in the runtime's other
# mode, in which a process may die and the others carry on (`lesson_lib.runtime.replicas`).
#
# The demonstration takes **one fault**: one spare for the replica it kills. Kill that spare too
# (a second fault) and the run ends, saying the spare is spent; a real job asks its scheduler for
# another machine. The figure marks the step the survivor discarded and the step the spare healed at.

# %%
task = T.Task(steps=48, hidden=2048, batch=512)
ours = ch10.survive(task, n=2, kill=(1, 5))

# %%
assert ours["out"]["deaths"][0]["exitcode"] == -9  # a real SIGKILL
assert ours["equal"] and ours["replay"]  # all bit-equal, and equal to one process replaying the quorums
assert ours["healed"]["from"] == 0 and ours["alone"] == ours["healed"]["healed_at"] - 5  # alone until healed
assert ours["discarded"] == [5]  # the survivor dropped the step its peer died in, and no other
# our lighthouse has no timer: it sees the process die (milliseconds on a quiet machine; a busy one
# stretches every step, so that is printed, not asserted)
timed_claim(ours["stall_s"] < 1.0, "the survivor went on within a second of its peer's death",
            f"step 5 took {ours['stall_s'] * 1e3:.0f} ms, a median step {ours['median_s'] * 1e3:.0f} ms")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **A smaller quorum is a smaller batch.** While replica 1 was gone, each committed step averaged
# one replica's gradient instead of two: the mean keeps the gradient's scale, so the optimizer took a
# full step of the same learning rate from half the samples, a noisier gradient. torchft does the
# same (`Manager.allreduce` divides the sum by `num_participants()`). Under the linear scaling rule
# (Goyal et al., 2017: the learning rate proportional to the batch) the short quorum's batch would call
# for half the rate; neither torchft nor this chapter rescales it, which is harmless for a few steps
# and a choice to make for long outages. Step by step, from the survivor's log:

# %%
shrunk = ch10.quorum_batch(task, ours)

# %%
short = [r for r in shrunk if r["members"] < 2]
assert short and all(r["batch"] == task.batch and r["linear_rule_lr"] == task.lr / 2 for r in short)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The stall here is short: this lighthouse watches the processes themselves, so the discarded step
# took about one step's time. torchft's lighthouse cannot (the replicas are on other machines): it
# learns of a death from missed heartbeats (5 s by default, 2 s in this chapter), though a peer killed
# mid-exchange closes its sockets, so the survivors' all-reduce fails and the step is dropped; the
# next quorum waits for the lighthouse. torchft's run is below, beside its library. The returner
# waited for its spare machine to start; the last step waiting for every replica is this chapter's
# rule, so that the run ends with both to compare.
#
# Beside chapter 1's server, a single point of failure until it was replicated, and chapter 4's
# stop-and-restart, which loses everything since the last checkpoint and a restart of every process:
# here one replica's death cost the survivors one discarded step and a stall.
#
# ### torchft beside it
#
# torchft (PyTorch, 2025) is this design for real clusters: a `Lighthouse` (Rust) forms quorums from
# heartbeats, a `Manager` per replica group joins them (`start_quorum`), reconfigures the process group
# and heals a fresh replica, `Manager.allreduce` averages over the quorum, and `should_commit` says
# whether the step stands. The course reaches it through one module, which keeps every server on
# 127.0.0.1 (torchft binds all interfaces by default; the module's docstring lists how):

# %%
show_source(torchft_glue.replica)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two quirks change a number here: the Manager's default `use_async_quorum=True` lets a replica copy
# weights at step 0 while the sum still divides by 2, so the run is no longer equal to one process
# (this chapter sets it `False`); and torchft's own `DistributedDataParallel` wrapper crashes the
# survivor when its peer dies *during* the gradient exchange (torchft 0.2.0), so the failure
# demonstrations use `Manager.allreduce`. The same task without failure, ours and torchft's:

# %%
same = ch10.with_torchft(T.Task(steps=8))

# %%
assert same["equal"]  # bit for bit

# %% [markdown] slideshow={"slide_type": "subslide"}
# And with a failure: replica 1 SIGKILLs itself in step 4 under torchft, after computing its gradient
# and before `Manager.allreduce`; a spare takes its place 0.3 s later. The lighthouse's heartbeat
# timeout is 2 s here (5 s by default):

# %%
ft = ch10.torchft_survives(T.Task(steps=48, hidden=2048, batch=512), kill=(1, 4))

# %%
assert ft["out"]["deaths"][0]["exitcode"] == -9 and 4 in ft["discarded"]  # that step dropped
assert ft["healed_at"] is not None and ft["equal"]  # healed from the live replica, bit-equal at the end
timed_claim(ft["stall_s"] > 4 * ft["median_s"], "the survivor waited for a quorum without its dead peer",
            f"its longest step {ft['stall_s']:.2f} s, a median step {ft['median_s'] * 1e3:.0f} ms")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Fault tolerance in practice
#
# * **Detecting a failure.** A dead process is easy to see; a hung one is not. PyTorch's NCCL
#   backend runs a watchdog thread that aborts a collective stuck past its timeout
#   (`TORCH_NCCL_ASYNC_ERROR_HANDLING`) and a heartbeat monitor that kills a process whose watchdog
#   itself hangs (`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`); torchft's lighthouse drops a replica that misses
#   heartbeats; Llama 3's team built tools to find hung collectives and **stragglers**, the slow GPU
#   that a synchronous job waits on every step (Dubey et al., 2024, §3.3.4).
# * **Failures that are not crashes.** A loss spike is a failure too: PaLM's run restarted from a
#   checkpoint about 100 steps before each spike and skipped 200–500 data batches (Chowdhery et al.,
#   2022, §5.1). Such a **rollback** needs recent checkpoints even when per-step fault tolerance
#   handles the crashes.
# * **HSDP with torchft.** With hybrid sharding (chapter 4), each replica group is a whole FSDP job
#   sharding the model over its own ranks, and torchft manages only the **replicate** dimension: the
#   gradients are averaged across groups through `Manager.allreduce` (torchft's `ManagedProcessGroup`
#   reports the quorum's size as its world size). A rank lost inside a group takes that group down
#   (its shards are not replicated inside it); the other groups go on with a smaller quorum, and the
#   restarted group heals from a live one, as replica 1 did above.
# * **Elastic restarts.** Without per-step fault tolerance, `torchrun --max-restarts=K` restarts every
#   worker of the job when one fails (up to K times) and the script resumes from its checkpoint;
#   `--nnodes=MIN:MAX` lets it restart with fewer machines than it began with, down to MIN. Each
#   restart is a full R of §1, paid by every GPU. The worker below resumes from its checkpoint;
#   `ch10.elastic_restart()` runs it under `torchrun --nnodes=1:2 --max-restarts=1` with 2 workers,
#   rendezvous on 127.0.0.1, worker 1 crashing once (15 to 35 s on a 2-core machine: torchrun starts
#   its workers twice, so Run All leaves it to you): every worker restarts and the weights end equal
#   to an uninterrupted run's.

# %%
from lesson_lib.milestones.resilience import elastic

show_source(elastic.worker)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Communicate less often: LocalSGD and DiLoCo
#
# Data parallelism sends every gradient every step. **LocalSGD** lets each replica take H steps alone,
# then averages the weights. **DiLoCo** (Douillard et al., 2023) treats the change since the last sync
# as a gradient: the **pseudo-gradient** Δ = start − local, averaged over the replicas, is fed to an
# *outer* optimizer, SGD with Nesterov momentum (lr 0.7, momentum 0.9 in the paper), while the inner
# optimizer runs every step. LocalSGD is DiLoCo with outer lr 1 and no momentum. Before reading on,
# write that outer step yourself (the check runs it on real ranks):

# %%
exercises["outer"]

# %%
def outer_step(local, start, buf, lr, mu):
    ...  # average start − local over the replicas, then one Nesterov step from start


exercises["outer"].submit(outer_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Here is DiLoCo written in a cell, its outer step through `torch.optim.SGD(nesterov=True)`, DDP
# (H = None) beside it, every collective through the course's ring (`comm.all_reduce`), whose
# emulated link (`comm.set_link`) we use below:

# %%
def my_diloco(task, h, outer_lr=0.7, outer_momentum=0.9, gbps=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    train, held = T.data(task)
    model, inner = T.build(task)  # the same start on every replica (one seed)
    outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=True)
    start = [p.detach().clone() for p in model.parameters()]
    if gbps:
        comm.set_link(gbps)
    sent, curve, t0 = 0, [], time.perf_counter()
    for step in range(task.steps):
        T.gradient(model, T.batch(task, train, step, rank))
        if h is None:  # data parallel: every gradient averaged, every step
            for p in model.parameters():
                comm.all_reduce(p.grad)
                p.grad /= n
                sent += p.numel()
        inner.step()
        if h and (step + 1) % h == 0:  # the outer step, every h steps
            for p, p0 in zip(model.parameters(), start):
                delta = p0 - p.detach()  # the pseudo-gradient
                comm.all_reduce(delta)
                sent += delta.numel()
                p.data.copy_(p0)
                p.grad = delta / n
            outer.step()
            start = [p.detach().clone() for p in model.parameters()]
        if step % 8 == 7:
            curve.append((time.perf_counter() - t0, T.held_out_loss(model, held)))
    return {"params": T.flat_params(model), "floats_sent": sent, "held_out": T.held_out_loss(model, held),
            "curve": curve}


# %% [markdown] slideshow={"slide_type": "subslide"}
# Against `torchft.local_sgd.DiLoCo` on two replica groups, the same settings (torchft's
# `init_sync=False`: with the default, every replica first copies replica 0's weights, one exchange
# more; equal here anyway, since all start from one seed):

# %%
versus = ch10.diloco_against_torchft(my_diloco, T.Task(steps=12), h=4, outer_lr=0.7, outer_momentum=0.9)

# %%
assert versus["equal"]
assert versus["ours"][0]["floats_sent"] == versus["torchft"][0]["floats_sent"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Streaming DiLoCo** (Douillard et al., 2025) splits the model into **fragments** that take turns:
# with F fragments, one is synced every H/F steps, so each sync sends 1/F of the model and the peak
# bandwidth falls F times. Its all-reduce starts τ inner steps before the result is applied (the
# **delayed sync**, torchft's `fragment_sync_delay`), so it can run behind those steps; the applied
# global weights are then mixed with the local ones by α (`fragment_update_alpha`; α = 0 keeps the
# global ones). Written in a cell, two fragments (the MLP's two layers), τ = 1, against torchft 0.2.0's
# own `DiLoCo` given the same fragments, delay and α:

# %%
def my_streaming_diloco(task, h, n_fragments=2, delay=1, alpha=0.0, outer_lr=0.7, outer_momentum=0.9):
    rank, n = dist.get_rank(), dist.get_world_size()
    train, held = T.data(task)
    model, inner = T.build(task)
    frags = [list(m.parameters()) for m in T.fragments(model, n_fragments)]
    outers = [torch.optim.SGD(ps, lr=outer_lr, momentum=outer_momentum, nesterov=True) for ps in frags]
    start = [[p.detach().clone() for p in ps] for ps in frags]  # each fragment's last global weights
    period, local, synced, sent, pending = h // n_fragments, 0, 0, [], None
    for step in range(task.steps):
        T.set_gradient(model, T.gradient(model, T.batch(task, train, step, rank)))
        inner.step()
        local += 1
        f = synced % n_fragments  # the fragments take turns, one per period
        if local == period - delay:  # send fragment f's pseudo-gradient now...
            pending = [p0 - p.detach() for p, p0 in zip(frags[f], start[f])]
            for d in pending:
                comm.all_reduce(d)
            sent.append(sum(d.numel() for d in pending))
        if local == period:  # ...and apply it `delay` inner steps later
            mine = [p.detach().clone() for p in frags[f]]
            for p, p0, d in zip(frags[f], start[f], pending):
                p.data.copy_(p0)
                p.grad = d / n
            outers[f].step()
            outers[f].zero_grad()
            for p, p0, m in zip(frags[f], start[f], mine):
                p0.copy_(p.detach())
                p.data.lerp_(m, alpha)  # alpha = 0: the global weights; 1: keep the local ones
            synced, local = synced + 1, 0
    return {"params": T.flat_params(model), "floats_sent": sum(sent), "per_sync": sent,
            "held_out": T.held_out_loss(model, held)}


streaming = ch10.streaming_against_torchft(my_streaming_diloco, T.Task(steps=12), h=4, fragments=2, delay=1,
                                          alpha=0.0, outer_lr=0.7, outer_momentum=0.9)

# %%
assert streaming["equal"]
per = streaming["ours"][0]["per_sync"]
assert per[0] + per[1] == versus["ours"][0]["floats_sent"] // 3  # two syncs send one plain DiLoCo sync
assert max(per) < versus["ours"][0]["floats_sent"] // 3  # a smaller peak per sync

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same number of tokens (steps × batch per replica), DDP against DiLoCo at several H. The paper's
# outer settings (lr 0.7, momentum 0.9) were tuned for H = 500 with AdamW inside; here, with SGD and
# momentum inside and H = 4, they diverge (run `ch10.sweep(my_diloco, T.Task(steps=256),
# outer_lr=0.7, outer_momentum=0.9)` to see it), so this sweep uses lr 0.5 and momentum 0.5 for every H:

# %%
swept = ch10.sweep(my_diloco, T.Task(steps=256), outer_lr=0.5, outer_momentum=0.5)

# %%
ddp, *dilocos = swept["rows"]
for r in dilocos:
    assert ddp["floats_sent"] == r["h"] * r["floats_sent"]  # H× fewer, counted
assert all(r["held_out"] < 1.1 * ddp["held_out"] for r in dilocos[:2])  # H = 4, 16: within a tenth of DDP

# %% [markdown] slideshow={"slide_type": "subslide"}
# Over a slow link: the course's emulated link at 10 Mbit/s (each transfer padded to bytes /
# bandwidth), time to the same held-out loss. Beside DDP and DiLoCo with H = 16 goes chapter 6's answer
# to the same link: keep data parallelism and **compress every gradient**. The contender is PowerSGD at
# rank 2 with error feedback (Vogels et al., 2019): chapter 6's own class, checked there against torch's
# `powerSGD_hook`, built by name (`make`) and called as chapter 6's training loop calls it. The loop
# around it is your DDP's, on the same task, with one change: the gradient goes through the compressor,
# and its P and Q cross the same emulated link, paying the same cost per byte.
# `tests/test_ch10_compressed.py` replays it in one process from Vogels et al.'s algorithm and counts
# its bytes against (n + m)·r per matrix:

# %%
from lesson_lib.milestones.resilience import compressed

show_source(compressed.replica)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The three runs, each 128 steps of 32 samples on each replica: the same tokens. Every assumption the
# comparison depends on is printed first; bytes are counted by the comm layer, not by the functions:

# %%
slow = ch10.slow_link(my_diloco, T.Task(steps=128), gbps=0.01, h=16, rank=2)

# %%
runs = slow["runs"]
assert runs["DDP"]["bytes_sent"] == 4 * runs["DDP"]["floats_sent"]  # the comm layer's count and yours
assert runs["DDP"]["bytes_sent"] == 16 * runs["DiLoCo, H = 16"]["bytes_sent"]  # H× fewer
assert 6 * runs["PowerSGD, rank 2"]["bytes_sent"] < runs["DDP"]["bytes_sent"]  # 414 floats, not 2,762
assert max(runs, key=lambda name: runs[name]["bytes_sent"]) == "DDP"  # the longest time on the link

# %% [markdown] slideshow={"slide_type": "subslide"}
# Both ways of saving bytes beat DDP over this link. Between them, DiLoCo at H = 16 sends fewer bytes
# than PowerSGD at rank 2 and far fewer collectives (one per 16 steps against two per step; both
# printed above), so in the runs we made it arrived first. Only what time cannot change is asserted:
# the bytes, DDP's the most, so its time on the link is the longest. The order of arrival is measured
# on the wall clock and printed, not asserted: DDP arrived last in the runs we made (and in those
# `benchmarks/ch10-slow-link.md` records), but a heavily loaded machine stretches compute as well as
# the link and can reorder them; which of DiLoCo and PowerSGD is first also depends on the settings.
#
# **Could the ordering flip?** Yes. It is set by H against the compressor's ratio, and by how many
# collectives each pays for. At H = 4 DiLoCo sends *more* bytes than PowerSGD at rank 2 or 1, and top-k
# at 1 % sends fewer than DiLoCo at H = 16. Here are the bytes counted at other settings, each with its
# final held-out loss. They are counted without the link, which changes no byte:

# %%
settings = ch10.bytes_and_quality(my_diloco, T.Task(steps=128), slow, hs=(4, 64), ranks=(1, 4))

# %%
by = {name: r["bytes_sent"] for name, r in settings["rows"].items()}
assert by["DiLoCo, H = 4"] > by["PowerSGD, rank 2"] > by["PowerSGD, rank 1"] > by["DiLoCo, H = 16"]
assert by["top-k 1%"] < by["DiLoCo, H = 16"]  # (index, value) pairs for 1 % of 2,762: 28 a step

# %% [markdown] slideshow={"slide_type": "subslide"}
# On this task, for every compressed run some DiLoCo run sends fewer bytes and ends at a lower loss;
# fewer bytes alone do not buy quality: top-k at 1 % ends worst. Nor do bytes alone set the time on
# this link. Every collective also pays this machine's fixed cost (printed above), and PowerSGD makes
# 256 of them, against DiLoCo's 32 at H = 16 or 128 at H = 4. So at H = 4 against rank 2 the two arrive
# close together, in either order depending on the machine's load. On a link ten times slower the
# bytes decide, and the order flips: run `ch10.slow_link(my_diloco, T.Task(steps=128), gbps=0.001, h=4,
# rank=1)` (about 20 s) to see PowerSGD at rank 1 reach the target before DiLoCo at H = 4;
# `benchmarks/ch10-slow-link.md` records such runs, dated, with the machine.
#
# **At cluster scale** the numbers move:
#
# * **Compute** per step takes seconds, not milliseconds. DDP hides much of its all-reduce behind the
#   backward pass, and DiLoCo can hide its outer step behind the inner steps (Streaming DiLoCo). What
#   counts is the communication left exposed, and over a wide-area link that is most of it.
# * **The ratios grow differently.** DiLoCo's is H, in bytes and in collectives, whatever the model;
#   H = 100 to 500 in practice. PowerSGD's is set by the shapes: an n × m matrix sends (n + m)·r
#   instead of n·m. A 4,096 × 4,096 layer at rank 4 sends 4,096² / (8,192 × 4) = 512 times less, where
#   our 64 × 32 and 10 × 64 layers (and the uncompressed biases) give the ratio printed above. PowerSGD still pays two collectives every
#   step. Top-k's all-gathered pairs grow with the number of replicas (chapter 6).
# * **Quality** is measured in the papers, not here: at billions of parameters, compression changes
#   every step a little, while DiLoCo lets the replicas drift apart for H steps.
# * **They compose.** Any compressor applies to DiLoCo's pseudo-gradients, which are all-reduced like
#   gradients. INTELLECT-1 quantizes them to int8, 4 times on top of H = 100, about 400 times in all;
#   Streaming DiLoCo sends 4 bits.
# * **Memory**: DiLoCo keeps a copy of the weights and the outer momentum, 2Ψ more per replica;
#   PowerSGD keeps its error residual, Ψ, and Q.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### A DiLoCo replica killed and rejoining
#
# DiLoCo communicates once per outer step, so that is where §2's machinery goes: each round the
# replicas join a quorum, exchange pseudo-gradients, and either all apply the outer step or all
# discard the round — going back to the round's start and losing only its H inner steps — when a
# member dies mid-exchange. A returning replica heals from a live one: the global weights, the outer
# momentum, its optimizer state and the outer step; it then runs that round's H steps while the others
# wait for it. The lighthouse is §2's, unchanged:

# %%
from lesson_lib.milestones.resilience import ft_diloco

show_source(ft_diloco.replica)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two replica groups, H = 4, 30 outer steps of a wider MLP (2,048 hidden units, 512 samples a step, so
# that each inner step is real compute, a few milliseconds). Replica 1 SIGKILLs itself in outer step 3,
# after replica 0 sent its pseudo-gradient and before its own; a spare starts 0.3 s later. Beside it
# the same run with no failure:

# %%
dl = ch10.diloco_survives(T.Task(steps=120, hidden=2048, batch=512), h=4, kill=(1, 3))

# %%
assert dl["out"]["deaths"][0]["exitcode"] == -9 and dl["discarded"] == [3]  # that round dropped by all
assert dl["alone"] == [*range(3, dl["healed"]["healed_at"])] and dl["equal"]  # alone till healed; bit-equal
assert abs(dl["loss"] / dl["clean_loss"] - 1) < 0.1  # a failure cost one round, not the run

# %% [markdown] slideshow={"slide_type": "subslide"}
# How many rounds the survivor ran alone depends on how soon the spare started on this machine (none,
# on a busy machine where the spare joined the redone round); the rest holds in every run. On a
# cluster the returner copies gigabytes, not a small MLP, and the rounds between syncs last minutes (H = 500 in the paper): a death costs the survivors at most one round's
# inner steps, which is why DiLoCo and fault tolerance fit together (torchft ships both).

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. At internet scale
#
# * **DiLoCo** (Douillard et al., 2023): 8 replicas, H = 500 inner steps, matching synchronous
#   training's quality on C4 while communicating 500 times less.
# * **INTELLECT-1** (Prime Intellect, Jaghouar et al., 2024): a 10B-parameter model trained on 1T
#   tokens by DiLoCo across up to 14 nodes on three continents, H = 100 with int8 pseudo-gradients,
#   about 400× less communication than data parallelism, reporting 83–96 % compute utilisation.
# * **Streaming DiLoCo** (Douillard et al., 2025): the outer step is done one fragment of the
#   parameters at a time and overlapped with the inner steps, with 4-bit outer gradients: similar
#   quality with two orders of magnitude less bandwidth.
#
# What a CPU run here cannot show is said on the figure.

# %%
ch10.internet_scale()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The interval is a number; the outer step runs on real ranks (2 and 4), judged against the formula.
# The exchange came in §2, before ours was shown.

# %%
exercises["interval"]

# %%
exercises["interval"].submit(...)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **failures cost** — §1's MTBF table, δ measured three ways (blocking DCP, `dcp.async_save`, a peer's memory) with both copies read back, goodput taken apart into checkpoints, lost work and restarts at Llama 3's storage rate, the restart dominating once δ is seconds (asserted), Young's and Daly's intervals on the goodput curve, and your interval.
# 2. **per-step fault tolerance** — §2's quorum, discard and heal written out, a replica SIGKILLed mid-exchange while its peer carried on, discarding that step alone, the returner bit-equal (asserted; the stall measured and printed), torchft equal to ours and surviving the same SIGKILL with the step discarded and the heal (asserted; the stall printed), and your exchange surviving a killed peer.
# 3. **DiLoCo** — §3's outer step in a cell equal to torchft's, Streaming DiLoCo's fragments and delayed sync in a cell equal to torchft's (asserted), H× fewer floats counted (asserted), held-out loss against DDP at several H, time to a target over a slow link beside chapter 6's PowerSGD (fewer bytes than DDP for both, asserted; the order of arrival printed) with the bytes at other H, ranks and top-k, and your outer step.
# 4. **internet scale** — §4's reported figures and what this CPU run cannot show.
#
# **On a real cluster:** a replica group is a whole FSDP or HSDP job of many GPUs, the lighthouse watches heartbeats across machines, a healed replica copies gigabytes from a peer, and the network between groups is the slowest in the system — which is why DiLoCo-style training exchanges rarely and quantized.
#
# Back to the [table of contents](README.md).
