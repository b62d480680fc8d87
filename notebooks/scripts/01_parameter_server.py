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
# # Chapter 1 — The parameter server
#
# The first systems that trained one model on many machines put the model on a **server**. From the
# start this was a group of server machines, each owning a **shard** (a slice) of the parameters
# (DistBelief, Dean et al., 2012; the parameter server, Li et al., OSDI 2014). **Workers** compute
# gradients on their share of the data, **push** them to the servers (send), and **pull** fresh
# parameters (receive). We begin with one server.
#
# * **Synchronous**: everyone waits, the server averages, everyone moves together. Simple and exact,
#   but held back by the slowest worker.
# * **Asynchronous**: each worker moves at its own pace and the server applies each gradient as it
#   arrives. No waiting, but the gradients are **stale**: computed on parameters that other workers'
#   updates have since changed. Whether that costs more than the extra updates bring depends on the
#   learning rate.
#
# As workers are added, a single server becomes the choke point, a stadium emptying through one door.
# With no copy of its state, it is also a **single point of failure**: if it dies, training stops
# (Li et al. kept copies: §6).
#
# Every figure below is measured from real processes: rank 0 is the server, ranks 1…N the workers,
# talking point-to-point through `torch.distributed`.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. A parameter server in one cell
#
# Rank 0 is the server: it holds the parameters and the optimizer. Ranks 1…N are workers: each computes
# the gradient of its slice of the batch, pushes it to the server (`dist.send`) and pulls the new
# parameters (`dist.recv`). The synchronous server waits for all N gradients, averages them and takes
# one SGD step (momentum 0.9). One such exchange, every worker pushing once, is a **round**. Every
# worker starts from the same model, built here and sent to each rank.

# %% [markdown]
# **After this chapter you can:**
#
# 1. write a worker's push and pull against sharded servers and train to the same losses as SGD on one process (§1, first exercise);
# 2. tell synchronous from asynchronous training by their losses and staleness, and find a rate at which stale gradients diverge (§2, last exercise);
# 3. show what a straggler costs each mode, counted in steps rather than seconds, and bound how far ahead workers run with stale synchronous parallel (§3–4);
# 4. predict the server's traffic, 2·N·S per step, and see sharding into K servers divide it (§5, traffic exercise);
# 5. explain what a dead server or worker does to each mode, and how a replicated shard survives its primary's death (§6).
#
# **Before it:** chapter 0 (ranks, `send`/`recv`, data-parallel training).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from lesson_lib import numerics, show_source, warm_cluster
from lesson_lib.chapters import ch01
from lesson_lib.chapters.timed import timed_claim
from lesson_lib.data import batch_indices, shard, teacher_classification
from lesson_lib.milestones import parameter_server as ps
from lesson_lib.milestones.parameter_server import replicas as ps_replicas
from lesson_lib.milestones.parameter_server import staleness as ps_staleness
from lesson_lib.models import mlp


def parameter_server(model, data, cfg):
    rank, n = dist.get_rank(), dist.get_world_size() - 1  # rank 0: the server; ranks 1…n: workers
    params = parameters_to_vector(model.parameters()).detach()
    if rank == 0:
        params.grad = torch.zeros_like(params)
        optimizer = torch.optim.SGD([params], lr=cfg.lr, momentum=0.9)
        incoming = torch.empty_like(params)
        for _ in range(cfg.steps):
            params.grad.zero_()
            for w in range(1, n + 1):        # push: wait for every worker's gradient
                dist.recv(incoming, src=w)
                params.grad += incoming
            params.grad /= n
            optimizer.step()
            for w in range(1, n + 1):        # pull: every worker gets the new parameters
                dist.send(params, dst=w)
        return None
    x_all, y_all = data
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank - 1, n)
        model.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        dist.send(parameters_to_vector(p.grad for p in model.parameters()), dst=0)  # push
        dist.recv(params, src=0)                                                      # pull
        vector_to_parameters(params, model.parameters())
        losses.append(loss.item())
    return losses


cfg = ch01.config(workers=3)
model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
data = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
out = warm_cluster(cfg.workers + 1).run(parameter_server, model, data, cfg)
mine = [sum(w[s] for w in out[1:]) / cfg.workers for s in range(cfg.steps)]  # mean over the workers
reference = ps.reference(cfg)  # one process, SGD on the combined batch

# %% [markdown] slideshow={"slide_type": "subslide"}
# The averaged gradient of N equal slices is the gradient of the combined batch, so a synchronous
# parameter server must train exactly like one process, up to float rounding: a few float32 roundings
# per step (ε ≈ 1.2·10⁻⁷ relative to the loss), compounded over the steps.

# %%
tol = numerics.sum_order_tolerance(reference)  # see numerics.sum_order_tolerance??
gap = numerics.max_gap(mine, reference)
print(f"largest loss difference from one process: {gap:.1e} (tolerance {tol:.1e})")
assert gap <= tol

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's version, which the rest of the chapter runs, adds what a real system needs:
#
# * the server sharded over K ranks, each owning a slice (§5);
# * asynchronous mode, with a receiver thread that takes pushes in arrival order;
# * a **heartbeat timeout**: a worker not heard from for a set time is declared lost (§6);
# * timers and counted bytes.
#
# The worker's loop, then the server's:

# %%
show_source(ps.work)

# %%
show_source(ps.serve)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Sync against async
#
# Three workers train the same small model, first synchronously, then asynchronously. Watch the loss
# live; then the loss against wall time and against the number of updates the server applied, and
# what each worker did at every moment: computing, pushing its gradient, or waiting for the server's
# reply.

# %%
runs = ch01.sync_vs_async(workers=3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's synchronous run equals single-process training too, up to float rounding.
#
# Asynchronous updates are stale. A gradient's **staleness** is the number of other updates that
# landed between its worker's pull and its push; the histogram above counts them.
#
# Whether async finishes first on the wall clock depends on the machine: one server process answers
# one message at a time, on cores it shares with the workers. And at this small learning rate,
# whether async ends above or below sync varies from run to run: it applies N updates per round, and
# staleness costs little when each step is small.

# %%
assert ch01.max_loss_gap(runs["sync"]) < 1e-5
assert ch01.mean_staleness(runs["async"]) > 0 and runs["sync"]["staleness"] == {}

# %% [markdown] slideshow={"slide_type": "subslide"}
# Staleness bites when the steps are large. At a learning rate of 0.3, synchronous training learns
# faster. Each asynchronous update is computed on parameters that several other updates have moved
# since, and momentum carries those late steps on: async ends well above sync, or diverges. Single
# rounds are noisy (each is one small batch per worker), so the claim compares the mean loss of the
# last five rounds.

# %%
bites = ch01.staleness_bites(workers=3, lr=0.3)

# %%
assert bites["last5"]["sync"] < bites["last5"]["async"], bites["last5"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Stragglers
#
# A **straggler** is a worker slower than the rest. Make worker 0 one: four times slower (it really
# does four times the work).
#
# In sync mode the fast workers spend much of their time waiting on the server. Their push waits
# while the server takes the straggler's gradient first, and their pull waits for the round's
# update, which waits for the straggler. In async mode the server answers each worker as soon as it
# has applied its gradient, so they wait less.
#
# The waiting shares move with the load on the machine; how far ahead the fast workers get, counted
# in steps, does not. So the cell below asserts the steps.
#
# <details><summary>Why each worker takes 512 samples a step here</summary>
#
# Where the four processes share fewer cores, even async workers queue: the server handles one
# message at a time. The step count is stable only while computing sets the pace. With a tenth of
# these samples, on a busy 2-core machine, the server's turnaround set everyone's pace and the async
# workers did not get ahead at all.
#
# </details>

# %%
slow = ch01.stragglers(workers=3, factor=4.0)

# %%
# What the straggler costs, in steps rather than seconds (seconds depend on what else shares the
# cores): in sync the fast workers can never be more than one step ahead of worker 0; in async they
# run ahead.
assert slow["lead"]["sync"] <= 1 < 1.5 < slow["lead"]["async"], slow["lead"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Between the two: bounded staleness
#
# Sync holds every worker to the slowest, round after round. Async never waits, and its gradients can
# be any number of updates old. **Stale synchronous parallel** (SSP; Ho et al., NeurIPS 2013) is a
# dial between the two.
#
# Call the number of gradients a worker has pushed its **clock**. With a **staleness bound** s, the
# server applies every gradient as it arrives, as async does. But it sends a worker its parameters
# back only while that worker's clock is at most s ahead of the slowest live worker's; a worker
# further ahead waits until the slowest catches up. So no worker computes more than s steps ahead of
# the slowest.
#
# s = 0 goes round by round, like sync, though each gradient is still applied on its own: a round
# moves the weights N small steps rather than one averaged step. An unbounded s is async. Li et al.
# (OSDI 2014) offered the same dial in their parameter server, as "bounded delay" consistency. The
# whole rule, as the library's asynchronous server runs it after every push:

# %%
show_source(ps_staleness.release)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Below, §3's straggler again (worker 0 three times slower) in asynchronous runs with bounds from 0 to
# unbounded:
#
# * left, the fast workers' time per step, computing and waiting;
# * middle, the loss;
# * right, how far ahead workers ran, measured twice: by the server (how many pushes ahead of the
#   slowest a worker was when the server let it go on) and by the workers' own clocks (§3's count of
#   pushes ahead of worker 0).

# %%
ssp_rows = ch01.staleness_sweep(bounds=(0, 1, 2, 4, -1))

# %% [markdown] slideshow={"slide_type": "subslide"}
# What holds in every run, however loaded the machine: the server never let a worker go on more than
# s pushes ahead, and the workers' clocks agree to within one push. (A push counts as done on the
# worker when it has left, and the server may have applied it already.)
#
# The rest moves from run to run. The fast workers' waiting tends to shrink as s grows, by an amount
# that depends on the load on the cores. At this learning rate staleness costs little, and which bound
# ends with the lowest loss depends on the order in which gradients arrive (§2's larger rate is where
# staleness bites). So only the bound is asserted.

# %%
for row in ssp_rows:
    if row["bound"] >= 0:   # −1: unbounded
        assert row["max_lead"] <= row["bound"], row           # the server's count
        assert row["worker_lead"] <= row["bound"] + 1, row    # the workers' own clocks

# %% [markdown] slideshow={"slide_type": "subslide"}
# Move the dial yourself: each click runs the straggler case on real ranks with the bound you choose and
# shows what each worker did, step by step.

# %%
ch01.staleness_explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. The server is the bottleneck
#
# Every synchronous step, each of N workers pushes S bytes of gradient in and pulls S bytes of
# parameters out, so the server moves **2·N·S** bytes while each worker moves 2·S. The counter below is
# what `lesson_lib` saw on the wire, set against the formula.
#
# Here the "network" is a memory copy between processes, far faster than any network card, so the
# bytes alone would not show in the step time. So the server sits behind an **emulated** link of
# bandwidth B = 0.05 Gbit/s: `comm.set_link` holds each of its transfers to the link's speed, as
# chapter 6 does for compression. The link is slow so that a model this small shows what a big model
# does on a real link: every byte of every worker passes this one door.
#
# A **full-duplex** link carries both directions at once, so N·S bytes in and N·S out take N·S / B.
# The step can take no less (the dotted line), and that floor grows with every worker added. How close
# the measured step comes to it says how little else a step costs here.

# %%
traffic = ch01.bottleneck(worker_counts=(1, 2, 4))

# %%
assert all(r["counted"] == r["formula"] for r in traffic), traffic
assert all(r["cycle_ms"] >= r["door_ms"] for r in traffic), traffic     # the door is the floor, N·S / B
timed_claim(traffic[-1]["step_ms"] > 1.5 * traffic[0]["step_ms"], "the median step widens with the workers",
            f"{traffic[0]['step_ms']:.0f} ms with 1 worker, {traffic[-1]['step_ms']:.0f} ms with "
            f"{traffic[-1]['workers']}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Real parameter servers were never one machine: DistBelief (Dean et al., 2012) already **sharded**
# its parameters over many server machines, and so did Li et al. (2014). K servers each own 1/K of
# the parameters, so each carries 1/K of the traffic, at the price of K server machines besides the
# workers. The total is unchanged: the door got wider, the crowd did not get smaller.
#
# With as many shards as workers, a server's link carries 2·S per step, as a worker's does: about
# what a ring all-reduce moves per rank (chapter 2). Chapter 7 prints what that means for GPT-3,
# server machines and each server's share of Adam's state included.

# %%
shards = ch01.sharding(workers=2, server_counts=(1, 2, 4))

# %%
for row in shards:   # the busiest shard carries 2·N·S/K, up to rounding of uneven shards
    assert abs(row["counted"] - row["formula"]) <= 2 * 2 * 4 * row["servers"], row

# %% [markdown] slideshow={"slide_type": "subslide"}
# The bytes per server fall as K grows, but the step time here does not: it can rise. With K servers
# and 2 workers there are K + 2 processes on this machine's 2 cores, so every server added is one more
# process taking turns on the same cores, and each worker now waits for K replies, from K processes
# that must each be scheduled, instead of one. Sharding pays where each server is its own machine
# with its own link, which a laptop cannot show: here, trust the counted bytes, not the clock.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. A single point of failure
#
# Kill the server at step 3 (a real `SIGKILL` of its process). Every worker stops.

# %%
error = ch01.server_failure()

# %%
assert "rank 0" in error and "SIGKILL" in error

# %% [markdown] slideshow={"slide_type": "subslide"}
# **One server with no copy of its state.** Li et al. (OSDI 2014, §4) did not run their servers that
# way. Each server owned a **key range**, a range of parameter indices. Servers and keys sat on one
# ring (**consistent hashing**: a key belongs to the next server round the ring), and each range was
# also kept by the next servers on the ring, its **replicas**.
#
# The master of a range copied every change, with its timestamp, to those replicas before a push
# counted as done. This is **chain replication** (van Renesse & Schneider, OSDI 2004): the head
# applies an update and passes it down the chain, and only the tail's acknowledgement completes the
# request. And it copied after aggregating: one copy of a round's summed update, not one per worker.
# When a server was lost, a replica took over its range and the job went on.
#
# The smallest version, on real ranks: the whole model is one shard, held by rank 0 (the **primary**) and
# rank 1 (its **backup**); ranks 2 and 3 are workers, training synchronously. Each step the primary sums
# the gradients, steps, forwards the averaged gradient (the update) and its step number to the backup, and
# waits for the backup's acknowledgement before it sends anyone the new parameters. The backup applies
# each update with the same optimizer, so after every acknowledged step it holds the primary's state,
# momentum included, bit for bit.
#
# At step 5 the primary receives the pushes and **leaves**: its function returns. That is the rank
# leaving the protocol, not a process dying; a real exit would tear down every rank's process group
# (the ranks' shared connections) here, as the `SIGKILL` above did.
#
# A real system notices a dead server because its connections close, or, when a whole machine goes
# silent, because its heartbeats stop and a timeout expires (the lost worker below). Here the
# primary's last act stands for that notice: a 4-byte farewell to the backup. The backup takes over
# and tells the workers. Each checks that the backup holds exactly the parameters it already has,
# pushes that step's gradient again, and training goes on. Every message is one its receiver is sure
# to get, so nothing can hang and nothing depends on timing. The primary, the backup and a worker:

# %%
show_source(ps_replicas.primary, ps_replicas.backup, ps_replicas.work)

# %%
failover = ch01.replicated_failover(workers=2, fail_at=5)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The backup had every acknowledged update, and the one update that was never acknowledged was pushed
# to it again. So the run ends with the very parameters of a run without failure, and trains like one
# process.
#
# Replication costs one more copy of each round's update per replica: S bytes, plus 4 for its step
# number and 4 for the acknowledgement (the middle bar). Beside the 2·N·S the server moves anyway,
# that is 1/(2N) more on its link. Copying every push instead of the round's sum would cost N·S. It
# also costs a round trip to the backup before every reply, and a second machine holding the shard and
# its optimizer state. After the take-over the backup serves alone; a real system would copy the shard
# to a fresh server to restore the replication.

# %%
failed = failover["failed"]
assert failed["took_over"] == 5 and all(w == {"step": 5, "same_params": True} for w in failed["switched"])
assert failover["same_params"]          # the final parameters of a run without failure, bit for bit
assert numerics.max_gap(failed["losses"], failover["reference"]) <= numerics.sum_order_tolerance(
    failover["reference"])              # and single-process SGD, up to float rounding
assert failed["replication_bytes"] == failed["replication_formula"] == 5 * (failed["param_bytes"] + 8)

# %% [markdown] slideshow={"slide_type": "subslide"}
# A worker that stops responding is another matter. The server declares it lost when it has not heard
# from it for a while (the heartbeat timeout). Asynchronous training carries on with the others, and
# keeps learning: the mean loss of its last rounds is below that of its first. Synchronous training
# cannot take a step without every gradient, so it fails and says which worker it lost.

# %%
async_case = ch01.worker_failure("async")

# %%
sync_case = ch01.worker_failure("sync")

# %%
# a server declares a worker lost after it is silent for lost_after_s: on a loaded machine a slow,
# live worker can be silent that long too, so both asserts ask for worker 1 among the lost, not alone
assert async_case["finished"] and 1 in async_case["lost"]
assert async_case["last5"] < async_case["first4"], async_case  # the survivors still learn
assert not sync_case["finished"] and "stopped responding" in sync_case["error"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Try it yourself
#
# Each click starts real processes; 4 workers take a few seconds.

# %%
ch01.explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch01.exercises()  # S: the chapter's model, as in the runs above
assert f"S = {runs['sync']['param_bytes']:,} bytes" in exercises["traffic"].prompt

# %% [markdown] slideshow={"slide_type": "subslide"}
# The first one runs on real ranks: your function is the push and pull of every worker, against server
# shards written like the cell of §1. If the ranks end up waiting for each other, the check stops after
# 15 s and says where each rank was waiting.

# %%
exercises["worker_step"]


# %%
def worker_step(grads, params, bounds):
    ...  # your code here: push each shard's slice of grads, then pull each slice of params


exercises["worker_step"].submit(worker_step)

# %%
exercises["average"]


# %%
def server_update(shard, grads, lr):
    ...  # your code here

exercises["average"].submit(server_update)

# %%
exercises["traffic"]

# %%
exercises["traffic"].submit(...)  # replace ... with your number of bytes

# %%
exercises["divergence"]

# %%
exercises["divergence"].submit(...)  # replace ... with a learning rate

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **push and pull** — §1's server in one cell and your `worker_step`, judged on the messages each worker sent to each shard.
# 2. **sync against async** — §2's losses and staleness histogram; your diverging learning rate.
# 3. **stragglers and bounded staleness** — §3's timelines and the steps the fast workers got ahead (asserted: sync at most 1); §4's staleness bounds, never exceeded (asserted, by the server's count and the workers' clocks).
# 4. **the bottleneck** — §5's counted server bytes, equal to 2·N·S (asserted), and the sharded servers' 1/K.
# 5. **a single point of failure** — §6: a killed server stops training with its rank named; a replicated shard survives its primary, to the same parameters bit for bit, for S + 8 bytes a step (asserted); async goes on without a lost worker.
#
# **On a real cluster:** At scale a parameter server must be sharded (DistBelief, Dean et al., 2012; Li et al., 2014), and then its bytes per worker are the ring's; what the ring removed was the hotspot and the extra server machines. Li et al. also replicated each shard, so a lost server cost a take-over, not the job.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# One server moves 2·N·S bytes a step through one door; N shards widen it to 2·S each, on N more
# machines. Chapter 2 removes the door and the extra machines: the ranks form a **ring** and each
# sends only about 2·S, however many there are — the bytes of a fully sharded server, with no
# server at all.
#
# From a shell: `python -m lesson_lib run parameter-server --mode async --workers 4 --straggler 0:3 --json ps.json`.
