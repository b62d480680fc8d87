"""Writes notebooks/01_parameter_server.ipynb (run: python tools/build_ch01.py)."""
from pathlib import Path

from nb import write

CELLS = [
("md", r"""
# Chapter 1 — The parameter server

The first systems that trained one model on many machines put the model on a **central server**
(DistBelief, Dean et al., 2012; the parameter server, Li et al., OSDI 2014). Workers compute
gradients on their share of the data, **push** them to the server, and **pull** fresh parameters.

* **Synchronous**: everyone waits, the server averages, everyone moves together — simple, exact,
  but held back by the slowest worker.
* **Asynchronous**: each worker moves at its own pace and the server applies each gradient as it
  arrives — faster, but the gradients are *stale*, computed on parameters that others have since
  changed, and stale gradients optimize worse.

As workers are added the server becomes the choke point — a stadium emptying through one door —
and it is a single point of failure. Every figure below is measured from real processes: rank 0 is
the server, ranks 1…N the workers, talking point-to-point through `torch.distributed`.
"""),
("code", "from lesson_lib.chapters import ch01"),
("md", r"""
## 1. Sync against async

Three workers train the same small model, first synchronously, then asynchronously. Watch the loss
live; then the loss against wall time and against the number of updates the server applied, and
what each worker did at every moment: computing, pushing its gradient, or waiting for the server's
reply.
"""),
("code", "runs = ch01.sync_vs_async(workers=3)"),
("md", r"""
Synchronous SGD through a server averages the same gradients as one process would on the combined
batch, so its losses must equal single-process training (up to float rounding). Asynchronous
updates are stale: the histogram above shows how many other updates landed between a worker's pull
and its push. Compare the wall-clock axes too: whether async finishes first depends on the machine —
here one server process answers one message at a time, on cores it shares with the workers.
"""),
("code", r"""
assert ch01.max_loss_gap(runs["sync"]) < 1e-5
assert ch01.mean_staleness(runs["async"]) > 0 and runs["sync"]["staleness"] == {}
"""),
("md", r"""
## 2. Stragglers

Make worker 0 four times slower (it really does four times the work). In sync mode the fast
workers spend much of their time waiting for the server's reply, which waits for the straggler;
in async mode the server answers each worker as soon as it has applied its gradient, so they wait
less. (On a 2-core laptop, four processes share two cores, so even async workers queue: the
server handles one message at a time.)
"""),
("code", "slow = ch01.stragglers(workers=3, factor=4.0)"),
("code", r"""assert slow["fast_wait"]["sync"] > slow["fast_wait"]["async"], slow["fast_wait"]"""),
("md", r"""
## 3. The server is the bottleneck

Every synchronous step, each of N workers pushes S bytes of gradient in and pulls S bytes of
parameters out, so the server moves **2·N·S** bytes while each worker moves 2·S. The counter below is
what `lesson_lib` saw on the wire, set against the formula.
"""),
("code", "traffic = ch01.bottleneck(worker_counts=(1, 2, 4))"),
("code", r"""assert all(r["counted"] == r["formula"] for r in traffic), traffic"""),
("md", r"""
The historical fix is to **shard** the server: K servers each own 1/K of the parameters (Li et al.,
2014), so each carries 1/K of the traffic. (The total is unchanged — the door got wider, the crowd
did not get smaller.)
"""),
("code", "shards = ch01.sharding(workers=2, server_counts=(1, 2, 4))"),
("code", r"""
for row in shards:   # the busiest shard carries 2·N·S/K, up to rounding of uneven shards
    assert abs(row["counted"] - row["formula"]) <= 2 * 2 * 4 * row["servers"], row
"""),
("md", r"""
## 4. A single point of failure

Kill the server at step 3 (a real `SIGKILL` of its process). Every worker stops.
"""),
("code", "error = ch01.server_failure()"),
("code", r"""assert "rank 0" in error and "SIGKILL" in error"""),
("md", r"""
A worker that stops responding is another matter. The server declares it lost when it has not
heard from it for a while (a heartbeat timeout). Asynchronous training carries on with the others;
synchronous training cannot take a step without every gradient, so it fails and says which worker
it lost.
"""),
("code", r"""async_case = ch01.worker_failure("async")"""),
("code", r"""sync_case = ch01.worker_failure("sync")"""),
("code", r"""
assert async_case["finished"] and async_case["lost"] == [1]
assert not sync_case["finished"] and "worker 1" in sync_case["error"]
"""),
("md", "## 5. Try it yourself\n\nEach click starts real processes (4 workers on a laptop take a few seconds)."),
("code", "ch01.explorer()"),
("md", r"""
## Exercises

Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.
"""),
("code", r"""exercises = ch01.exercises(param_bytes=runs["sync"]["param_bytes"])"""),
("code", r"""exercises["average"]"""),
("code", r"""
def server_update(shard, grads, lr):
    ...  # your code here

exercises["average"].submit(server_update)
"""),
("code", r"""exercises["traffic"]"""),
("code", r"""exercises["traffic"].submit(...)  # replace ... with your number of bytes"""),
("code", r"""exercises["divergence"]"""),
("code", r"""exercises["divergence"].submit(...)  # replace ... with a learning rate"""),
("md", r"""
## What comes next

The server moves 2·N·S bytes a step through one door. Chapter 2 removes the door: the ranks form a
**ring** and each sends only about 2·S, however many there are.

From a shell: `python -m lesson_lib run parameter-server --mode async --workers 4 --straggler 0:3 --json ps.json`.
"""),
]

if __name__ == "__main__":
    write(str(Path(__file__).resolve().parent.parent / "notebooks/01_parameter_server.ipynb"), CELLS)
