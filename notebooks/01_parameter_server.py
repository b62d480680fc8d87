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
# # Chapter 1 — The parameter server
#
# The first systems that trained one model on many machines put the model on a **central server**
# (DistBelief, Dean et al., 2012; the parameter server, Li et al., OSDI 2014). Workers compute
# gradients on their share of the data, **push** them to the server, and **pull** fresh parameters.
#
# * **Synchronous**: everyone waits, the server averages, everyone moves together — simple, exact,
#   but held back by the slowest worker.
# * **Asynchronous**: each worker moves at its own pace and the server applies each gradient as it
#   arrives — faster, but the gradients are *stale*, computed on parameters that others have since
#   changed, and stale gradients optimize worse.
#
# As workers are added the server becomes the choke point — a stadium emptying through one door —
# and it is a single point of failure. Every figure below is measured from real processes: rank 0 is
# the server, ranks 1…N the workers, talking point-to-point through `torch.distributed`.

# %%
from lesson_lib.chapters import ch01

# %% [markdown]
# ## 1. Sync against async
#
# Three workers train the same small model, first synchronously, then asynchronously. Watch the loss
# live; then the loss against wall time and against the number of updates the server applied, and
# what each worker did at every moment: computing, pushing its gradient, or waiting for the server's
# reply.

# %%
runs = ch01.sync_vs_async(workers=3)

# %% [markdown]
# Synchronous SGD through a server averages the same gradients as one process would on the combined
# batch, so its losses must equal single-process training (up to float rounding). Asynchronous
# updates are stale: the histogram above shows how many other updates landed between a worker's pull
# and its push. Compare the wall-clock axes too: whether async finishes first depends on the machine —
# here one server process answers one message at a time, on cores it shares with the workers.

# %%
assert ch01.max_loss_gap(runs["sync"]) < 1e-5
assert ch01.mean_staleness(runs["async"]) > 0 and runs["sync"]["staleness"] == {}

# %% [markdown]
# ## 2. Stragglers
#
# Make worker 0 four times slower (it really does four times the work). In sync mode the fast
# workers spend much of their time waiting for the server's reply, which waits for the straggler;
# in async mode the server answers each worker as soon as it has applied its gradient, so they wait
# less. (On a 2-core laptop, four processes share two cores, so even async workers queue: the
# server handles one message at a time.)

# %%
slow = ch01.stragglers(workers=3, factor=4.0)

# %%
assert slow["fast_wait"]["sync"] > slow["fast_wait"]["async"], slow["fast_wait"]

# %% [markdown]
# ## 3. The server is the bottleneck
#
# Every synchronous step, each of N workers pushes S bytes of gradient in and pulls S bytes of
# parameters out, so the server moves **2·N·S** bytes while each worker moves 2·S. The counter below is
# what `lesson_lib` saw on the wire, set against the formula.

# %%
traffic = ch01.bottleneck(worker_counts=(1, 2, 4))

# %%
assert all(r["counted"] == r["formula"] for r in traffic), traffic

# %% [markdown]
# The historical fix is to **shard** the server: K servers each own 1/K of the parameters (Li et al.,
# 2014), so each carries 1/K of the traffic. (The total is unchanged — the door got wider, the crowd
# did not get smaller.)

# %%
shards = ch01.sharding(workers=2, server_counts=(1, 2, 4))

# %%
for row in shards:   # the busiest shard carries 2·N·S/K, up to rounding of uneven shards
    assert abs(row["counted"] - row["formula"]) <= 2 * 2 * 4 * row["servers"], row

# %% [markdown]
# ## 4. A single point of failure
#
# Kill the server at step 3 (a real `SIGKILL` of its process). Every worker stops.

# %%
error = ch01.server_failure()

# %%
assert "rank 0" in error and "SIGKILL" in error

# %% [markdown]
# A worker that stops responding is another matter. The server declares it lost when it has not
# heard from it for a while (a heartbeat timeout). Asynchronous training carries on with the others;
# synchronous training cannot take a step without every gradient, so it fails and says which worker
# it lost.

# %%
async_case = ch01.worker_failure("async")

# %%
sync_case = ch01.worker_failure("sync")

# %%
assert async_case["finished"] and async_case["lost"] == [1]
assert not sync_case["finished"] and "worker 1" in sync_case["error"]

# %% [markdown]
# ## 5. Try it yourself
#
# Each click starts real processes (4 workers on a laptop take a few seconds).

# %%
ch01.explorer()

# %% [markdown]
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch01.exercises(param_bytes=runs["sync"]["param_bytes"])

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

# %% [markdown]
# ## What comes next
#
# The server moves 2·N·S bytes a step through one door. Chapter 2 removes the door: the ranks form a
# **ring** and each sends only about 2·S, however many there are.
#
# From a shell: `python -m lesson_lib run parameter-server --mode async --workers 4 --straggler 0:3 --json ps.json`.
