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
# # Chapter 2 — Ring all-reduce
#
# Chapter 1's parameter server sends every gradient through one door: with N workers the server's link
# carries 2·N·S bytes per step (S: the gradient's bytes) while the workers' links idle. The fix that
# took over large-scale training is to **get rid of the central server**. Baidu's 2017 write-up brought
# it to deep learning from high-performance computing (HPC), and Horovod (Sergeev & Del Balso, 2018) made it
# a library.
#
# Arrange the ranks in a ring, each talking only to its two neighbours, and cut the gradient into N
# **chunks**. First pass the chunks round the ring, **summing** them on the way, until each rank holds
# one chunk summed over all ranks: a **reduce-scatter**. Then pass the finished sums round once more,
# until every rank has all of them: an **all-gather**. Every rank does the same work and sends the same
# ≈ 2·S bytes, however many ranks there are: *a roundabout instead of a traffic jam*.
#
# Patarasuk & Yuan (2009) proved that 2(N−1)/N·S per rank is the least any all-reduce can send when the
# ranks themselves do the adding. A network whose switches add lets each rank send less (§8).
#
# Everything below runs in real worker processes (`torch.distributed`, with Gloo, its CPU backend);
# bytes are **counted** on the wire by `lesson_lib.comm`, not computed. After the first cell, read any
# function with `??`: the library's ring with `comm.ring_all_reduce??`, a figure's code with
# `ch02.traffic_jam??`.

# %% [markdown]
# **After this chapter you can:**
#
# 1. write reduce-scatter by hand on real ranks and explain why N−1 steps of one chunk each make the ring bandwidth-optimal (§2–3, first exercise);
# 2. count a ring's bytes per rank, 2(N−1)/N·S, against the naive root's 2(N−1)·S (§1, §5, second exercise);
# 3. fit the α–β model to measured all-reduces, read published all-reduce bandwidths (algbw and busbw), and say where latency starts to dominate (§6, last exercise);
# 4. predict from a real interconnect's α and β how the ring, a tree and halving-doubling scale to 1,024 ranks (§8).
#
# **Before it:** chapter 0 (all-reduce, data parallelism); chapter 1 helps (the root's traffic).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch
import torch.distributed as dist

from lesson_lib import comm, show_source, warm_cluster
from lesson_lib.chapters import ch02
from lesson_lib.chapters.timed import timed_claim
from lesson_lib.comm import schedules

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. The traffic jam
#
# First the parameter-server pattern, written as an all-reduce: every rank sends its whole tensor to
# rank 0, which adds them up and sends the sum back to each (`comm.naive_all_reduce`). Then our ring
# (`comm.ring_all_reduce`). One all-reduce of 1 MiB on 4 ranks, bytes through each rank's link:

# %%
jam = ch02.traffic_jam(world_size=4, size_mb=1.0)

# %%
S, N = jam["size_bytes"], 4
assert jam["correct"]                                      # both produced the exact sum
assert jam["root_bytes"] == 2 * (N - 1) * S                # the root moves 2(N−1)·S
assert max(jam["ring_bytes"]) == min(jam["ring_bytes"])    # the ring: every rank the same ...
assert abs(max(jam["ring_bytes"]) - 2 * 2 * (N - 1) / N * S) <= 16   # ... 2(N−1)/N·S each way

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Round the ring
#
# Press ▶. Each rank starts with its own gradient: the squares are its 4 chunks, and a label lists the
# ranks whose values a chunk holds.
#
# * In each of the N−1 **reduce-scatter** steps every rank sends one chunk to its right neighbour,
#   which *adds* it to its own copy. After N−1 steps each rank owns one chunk summed over everyone.
# * In the N−1 **all-gather** steps the finished chunks travel round once more and are *copied*.
#
# All links are busy at every step, each carrying S/N bytes.
#
# The animation is not drawn by hand: it replays `lesson_lib.comm.schedules.ring_schedule(4)`, the very
# list of (phase, step, rank, chunk sent, chunk received) that `comm.ring_all_reduce` executes.

# %%
frames = ch02.ring_animation(world_size=4)

# %%
after_reduce_scatter = frames[3]["state"]                  # start + 3 reduce-scatter steps
assert all(sum(len(c) == 4 for c in rank) == 1 for rank in after_reduce_scatter)  # one full chunk each
assert all(c == [0, 1, 2, 3] for rank in frames[-1]["state"] for c in rank)      # then everyone has all

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. The ring in code
#
# Here is the whole algorithm, written with `torch.distributed` and run on 4 real ranks.
#
# * `t.tensor_split(n)` cuts the tensor into N chunks that are *views*: writing into a chunk writes
#   into `t`.
# * `comm.exchange(send_t, right, recv_t, left).wait()` *posts* (starts) a send to the right neighbour
#   and a receive from the left one at the same time, waits for both, and counts the bytes. Both at
#   once, or every rank would wait for its neighbour to listen first.


# %%
def my_ring_all_reduce(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = t.tensor_split(n)
    for s in range(n - 1):  # reduce-scatter: add what arrives into our copy of that chunk
        send_i, into_i = (rank - s) % n, (rank - s - 1) % n
        incoming = torch.empty_like(chunks[into_i])
        comm.exchange(chunks[send_i], right, incoming, left).wait()
        chunks[into_i].add_(incoming)  # in place: the chunk is a view into t
    for s in range(n - 1):  # all-gather: pass the finished chunks on, received in place
        send_i, into_i = (rank - s + 1) % n, (rank - s) % n
        comm.exchange(chunks[send_i], right, chunks[into_i], left).wait()
    return t


def ours_and_the_library(length):
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randint(-9, 10, (length,), generator=g).float()  # small integers: exact in any order
    library = x.clone()
    dist.all_reduce(library)
    return torch.equal(my_ring_all_reduce(x.clone()), library)


lengths = (1, 3, 10, 1001)  # shorter than the ring, and not divisible by it
same = {length: warm_cluster(4).run(ours_and_the_library, length, timeout_s=20) for length in lengths}
print("equal to dist.all_reduce on every rank, by length:", {k: all(v) for k, v in same.items()})

# %%
assert all(all(ranks) for ranks in same.values()), same  # equal to dist.all_reduce on every rank

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's `comm.ring_all_reduce` is the same loop, driven by the schedule the animation drew
# (`schedules.ring_schedule`), with one scratch buffer reused for the incoming chunks:

# %%
show_source(comm.ring_all_reduce, comm.ring._ring_steps)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Is it right?
#
# `comm.ring_all_reduce(t)` has the contract of `torch.distributed.all_reduce(t)`: an in-place sum.
# Four of our all-reduces are compared with `dist.all_reduce` on the same random inputs on 1–4 ranks:
#
# * our ring;
# * **recursive halving-doubling** (Thakur, Rabenseifner & Gropp, 2005): each rank swaps half its
#   data with a partner N/2 ranks away, then a quarter with one N/4 away, and so on, summing as it
#   goes; then it retraces the steps to gather. log₂N steps each way instead of N−1;
# * the naive pattern;
# * the pipelined ring of §7.
#
# The inputs have lengths 0, 1, 3, 5 (shorter than the ring, or not divisible by it), 1000 and 1001,
# in float32, float64 and bfloat16. Floats may differ in the last bits: the additions happen in
# another order.

# %%
checks = ch02.check_against_library(world_sizes=(1, 2, 3, 4))

# %%
assert all(r["ok"] for rows in checks.values() for r in rows)
assert all(r["bytes_sent"] == r["exact_bytes_sent"] for rows in checks.values() for r in rows)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Counted traffic against the formula
#
# Bytes each rank sent in one all-reduce of 1 MiB, as counted on the wire, against the exact count for
# the chunk sizes used and the textbook formula:
#
# * 2(N−1)/N·S for the ring, and for halving-doubling when N is a power of two;
# * S for a naive non-root rank and (N−1)·S for its root.
#
# They differ only by the rounding of chunks that do not divide evenly. The pipelined ring of §7 sends
# the ring's chunks in pieces: its rows match the ring's byte for byte.

# %%
table = ch02.traffic_table(world_sizes=(2, 3, 4), size_mb=1.0)

# %%
assert all(r["counted"] == r["exact"] for r in table)
assert all(abs(r["counted"] - r["formula"]) <= 4 * r["ranks"] for r in table)   # a few elements at most
sent = {(r["algorithm"], r["ranks"], r["rank"]): r["counted"] for r in table}
assert all(sent["pipelined-ring", n, i] == sent["ring", n, i] for _, n, i in sent)  # same bytes, in pieces

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Bandwidth: ours against Gloo's
#
# The **algorithm bandwidth** (algbw) of an all-reduce is S / time. Below, measured in one run from
# 4 KiB to 16 MiB on 2 and 4 ranks: our ring and the pipelined ring of §7, Gloo's own C++
# `dist.all_reduce`, and the naive pattern (`python -m lesson_lib bench allreduce` goes to 64 MiB).
# The algorithms take turns within each repeat, so load from other programs falls on all of them
# alike; the ratio ring / Gloo is a median of paired ratios.
#
# The dashed lines are the **α-β model** (Hockney, 1994) fitted to each ring's times. A message costs
# a fixed **latency α** (seconds) plus its bytes times **β** (seconds per byte; 1/β is the bandwidth),
# so a ring all-reduce costs **T = 2(N−1)·α + 2(N−1)/N·S·β**. Small messages are *latency-bound* (the
# flat left part: α dominates), large ones *bandwidth-bound* (β dominates).

# %%
bw = ch02.bandwidth(world_sizes=(2, 4), repeats=3)

# %%
big = [r for (n, s), r in bw["ratios"].items() if s >= 4 * 2**20]
print("ring / Gloo at ≥ 4 MiB:", [f"{r:.2f}" for r in big])
ring = {(r["world_size"], r["size_bytes"]): r["algbw_GBps"] for r in bw["rows"] if r["algorithm"] == "ring"}
# measured times, which other work on the cores stretches: printed with the load, never stopping Run All
timed_claim(ring[2, 16 * 2**20] > 10 * ring[2, 4096], "big messages use the link far better than small ones",
            f"{ring[2, 16 * 2**20]:.2f} GB/s at 16 MiB, {ring[2, 4096]:.3f} GB/s at 4 KiB")
timed_claim(sorted(big)[len(big) // 2] > 0.5, "our ring is in the library's league at ≥ 4 MiB",
            f"median ring / Gloo {sorted(big)[len(big) // 2]:.2f}")
timed_claim(bw["fits"][2]["rms_rel_error"] < 0.5, "the two-parameter model describes the ring",
            f"rms relative error {bw['fits'][2]['rms_rel_error']:.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Where the gap comes from.** Gloo's `all_reduce` is a ring too (`gloo/allreduce.cc`), so both send
# the same bytes over the same sockets. Fitting the same α-β model to Gloo's times (the table above)
# gives an α and a β of the same order.
#
# The ratio ring / Gloo is what moves most from run to run, with whatever else the machine is doing,
# and most where ranks outnumber the cores and also wait for one. Read this run's ratios in the table
# and rerun the cell to see them move; the cell claims only the same league (a median ratio above
# 0.5), and prints whether this run showed it, with the machine's load.
#
# The structural difference: our ring adds a chunk only after receiving all of it. Gloo's C++ loop
# cuts each chunk into segments and keeps two in flight, so reducing one overlaps receiving the next,
# and its per-step cost is C++ rather than a few Python calls and a wake-up. That matters most when
# cores are scarce. §7 builds the pipelined ring and measures what it changes.
#
# <details><summary>One fix made here</summary>
#
# Dropping each step's Gloo request object right after waiting for it put an extra thread hand-off on
# the critical path and made 4 ranks much slower; `comm.Pending` now keeps the last few alive.
#
# </details>
#
# **The naive pattern keeps up here.** Summed over all ranks, it copies the same 2(N−1)·S bytes as the
# ring. On one machine every "link" is a memory copy made by the same cores, so the total, not the
# busiest link, is the limit. On a real cluster each rank has its own link, and the root's 2(N−1)·S
# through one of them is what stalls (§8).

# %% [markdown]
# **Reading published numbers: algbw and busbw.** NVIDIA's `nccl-tests`, the source of most published
# all-reduce figures, prints two bandwidths:
#
# * the **algorithm bandwidth** (algbw), S / time, what we plotted above;
# * the **bus bandwidth** (busbw), algbw · 2(N−1)/N: what each rank's link carries per second if the
#   all-reduce sends the least it can, 2(N−1)/N·S per rank, as the ring does.
#
# An all-reduce's algbw falls towards half the link's speed as N grows, even when nothing is wrong. Its
# busbw stays comparable with the link's speed at any N, so a busbw near the link's speed means the
# network is used well. Below, for this run's largest message: both figures for our ring and Gloo's,
# and for our ring the bytes each rank sent (§5's exact count) over the same time, which is the bus
# bandwidth, measured.

# %%
buses = ch02.bus_bandwidth(bw)

# %%
for r in buses:
    assert abs(r["busbw"] - r["algbw"] * 2 * (r["ranks"] - 1) / r["ranks"]) <= 1e-12 * r["busbw"]
    if r["sent_per_s"] is not None:    # our ring: busbw is exactly the bytes a rank sends per second
        assert abs(r["sent_per_s"] - r["busbw"]) <= 1e-9 * r["busbw"], r

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. The next step: a pipelined ring
#
# Our ring adds a chunk only once all of it has arrived: during a reduce-scatter step the rank first
# waits for the link, then the link waits for the rank's addition. Gloo's ring (`gloo/allreduce.cc`)
# does not wait. It cuts each chunk into at least two **segments**, smaller pieces sent as separate
# messages, and keeps two on the wire, so that the addition of one segment happens while the next one
# is still crossing. Ours goes one step further: a segment does not wait for the rest of its step
# either.
#
# Below, the same ring with each chunk in 2 segments (the rows of each rank's grid), slot by slot:
#
# 1. segment 0 crosses;
# 2. segment 1 crosses *while segment 0 is added* (orange outline);
# 3. segment 0, now summed, already leaves for the next step while segment 1 is added; and so on.
#
# So the link never idles and every addition hides behind a transfer. In the all-gather the segments
# land in place and nothing is added. Like §2's, this animation replays a schedule,
# `schedules.pipelined_ring_schedule(4, 2)`: the ring's chunks, steps and neighbours, each chunk split
# into segments, in the very order `comm.pipelined_ring_all_reduce` posts them.

# %%
pframes = ch02.pipelined_animation(world_size=4, segments=2)

# %%
assert all(s == [0, 1, 2, 3] for rank in pframes[-1]["state"] for c in rank for s in c)  # everyone has all
assert all(f["moves"] for f in pframes[1:])                 # the link is busy in every slot ...
assert len(pframes) - 1 == 2 * 3 * 2                        # ... one slot per segment of each of 2(N−1) steps

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's code: the first step's segments go out at once. Each time a segment lands it is added
# (in the reduce-scatter), and the same segment of the next step is posted, while the others are still
# in flight.
#
# Segments have a size in bytes (`segment_bytes`, 2 MiB by default) rather than a count: a chunk of up
# to 2 MiB goes whole, exactly as in the plain ring, and a 32 MiB chunk goes as 16 segments. Gloo cuts
# every chunk in at least two, of at most a configurable size; below we measure why ours leaves small
# chunks whole.
#
# <details><summary>Two details the animation does not show</summary>
#
# On Gloo each *receive* is posted a step before its data can come (`comm.ring.RECV_AHEAD`). There a
# send leaves only once its receiver has posted the receive. With the receive already there, a
# neighbour that finishes its addition first sends at once instead of waiting for ours. That pays
# most when ranks share cores; the comment above `RECV_AHEAD` gives what `python -m lesson_lib bench
# allreduce` measured with and without it on 4 ranks sharing 2 cores.
#
# The reduce-scatter's segments alternate between two halves of a scratch buffer of two chunks (one
# chunk on 2 ranks, where each phase has a single step), reused from call to call.
#
# </details>

# %%
show_source(comm.pipelined_ring_all_reduce, schedules.pipelined_ring_schedule)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Run on 4 real ranks against `dist.all_reduce`, with segments of 2 bytes (half a float: some pieces are
# left empty), 4 bytes (one float), 12 bytes and the default (`comm.ring.SEGMENT_BYTES`):


# %%
def pipelined_and_the_library(length, segment_bytes):
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randint(-9, 10, (length,), generator=g).float()  # small integers: exact in any order
    library = x.clone()
    dist.all_reduce(library)
    return torch.equal(comm.pipelined_ring_all_reduce(x.clone(), segment_bytes=segment_bytes), library)


cases = [(length, b) for length in (1, 10, 1001) for b in (2, 4, 12, comm.ring.SEGMENT_BYTES)]
same_pipelined = {c: warm_cluster(4).run(pipelined_and_the_library, *c, timeout_s=20) for c in cases}
print("equal to dist.all_reduce on every rank, by length and segment bytes:")
for length in (1, 10, 1001):
    print(f"  length {length:>4}: " + ", ".join(f"{b:,} B {all(same_pipelined[length, b])}"
                                            for (n, b) in cases if n == length))

# %%
assert all(all(ranks) for ranks in same_pipelined.values()), same_pipelined

# %% [markdown] slideshow={"slide_type": "subslide"}
# **What pipelining changes, and what it does not.**
#
# * The **bytes** do not change: the same chunks go to the same neighbours, only in pieces (section 5's
#   table counts them equal, rank by rank), so the bandwidth term keeps its 2(N−1)/N·S.
# * The **messages** do: a chunk goes as one message per segment, and every message pays its own fixed
#   cost (its calls, its wake-ups). Below, one all-reduce of 4 MiB on 2 ranks with ever smaller
#   segments, from one per chunk (the plain ring's single message) to 128, taking turns with the plain
#   ring and Gloo. The dashed line is a least-squares fit; its slope is the price of one more segment.

# %%
sweep = ch02.segment_sweep(world_size=2, size_mb=4.0)

# %%
# what each message costs is a time, which other work on the cores stretches: shown, not asserted
timed_claim(sweep["slope_s"] > 0 and sweep["rows"][-1]["time_s"] > sweep["rows"][0]["time_s"],
            "more messages, more fixed costs: 128 segments cost more than one",
            f"{sweep['rows'][0]['time_s'] * 1e3:.2f} ms with one segment, "
            f"{sweep['rows'][-1]['time_s'] * 1e3:.2f} ms with {sweep['rows'][-1]['segments']}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# That fixed cost is why segments are sized in bytes and not too small: up to 2 MiB per chunk the
# pipelined ring sends exactly the plain ring's messages.
#
# * What pipelining can buy is time per **byte**: the addition, whose time grows with the bytes, hides
#   behind the transfer of the next segment, *if* a core is free to add while the data arrive. On a
#   cluster the network card moves the bytes while the core adds. Here the "transfer" is itself a
#   memory copy made by the same cores that add, so there is little to hide behind, and how much of
#   the addition disappears changes from run to run.
#
# §6's run timed both rings, so we can fit the same model to each: T = 2(N−1)·α + 2(N−1)/N·S·β, with
# α the fixed cost of one ring *step* and β the cost of one byte. The table shows this run's fitted α
# and 1/β side by side, and the lines under it which way they moved in this run (rerun §6 and this
# cell to see them move).

# %%
pipelining = ch02.pipelining_fit(bw)

# %%
worst = max(f["rms_rel_error"] for o in pipelining.values() for f in (o["ring"], o["pipelined"]))
timed_claim(worst < 0.5, "the α-β model describes both rings", f"worst rms relative error {worst:.2f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. What the model predicts beyond one machine
#
# **A fit made on loopback is not a cluster's.** *Loopback* is network traffic that never leaves the
# machine. The α fitted above is mostly waiting: on shared cores a ring step's fixed cost is the time
# the scheduler takes to run the peer process (hundreds of microseconds to milliseconds), and β is a
# memory copy. On a cluster α is a network's microseconds and β its link.
#
# So the model's predictions below use a real interconnect's α and β from `data/links.csv`:
# **InfiniBand HDR**, a cluster network, with one 200 Gb/s port per GPU as on a DGX A100. Its bandwidth
# is the datasheet's; its α is an assumed round figure, said on the figure. Three gradient sizes:
# 25 MB (one **bucket** of PyTorch DDP's default size: DDP all-reduces its gradients in groups of
# about 25 MB), 100 MB and 1 GB.
#
# * Left: the ring's predicted time, with this machine's fit beside it only to show how far apart the
#   two are (an illustration: nothing is claimed from it).
# * Right: the share of the ring's time spent in latency, 2(N−1)·α.
#
# All these figures are the model's, not measurements.

# %%
big = ch02.at_scale(bw["fits"][2], link="ib-hdr")

# %%
share = {(r["link"], r["algorithm"], r["size_bytes"], r["world_size"]): r["latency_share"]
         for r in big["rows"]}
ib, n_star = big["link"]["name"], big["crossover_n"]
assert n_star[25e6] == 25e6 * big["link"]["beta"] / big["link"]["alpha"]   # N* = S·β/α
assert share[ib, "ring", 25e6, 8] < 0.1            # a small cluster: the bandwidth term decides
assert share[ib, "ring", 25e6, 1024] > 0.5         # past N*, the ring's 2(N−1) latencies decide
assert share[ib, "halving-doubling", 25e6, 1024] < 0.1   # 2·log₂N latencies, the same bytes
assert n_star[1e9] > n_star[25e6]                  # bigger messages push N* up

# %% [markdown] slideshow={"slide_type": "subslide"}
# **"Near-linear scaling", with its condition.** The ring's bytes per rank stay at 2(N−1)/N·S, so its
# bandwidth term is flat in N (Patarasuk & Yuan, 2009, proved that volume optimal); its latency term
# is not. The ring scales nearly linearly while S·β ≫ N·α, that is while N < N* = S·β/α (printed
# above for each size). Past N* a ring all-reduce is mostly its 2(N−1) fixed costs. What clusters do
# about it:
#
# * **fewer, longer steps**: tree all-reduce, such as the double binary trees of NCCL, NVIDIA's
#   collective library (NCCL 2.4, Jeaugey, 2019; after the two-tree algorithm of Sanders, Speck &
#   Träff, 2009), and recursive halving-doubling (Thakur, Rabenseifner & Gropp, 2005), which §4
#   checked on real ranks. Both pay about log₂N latencies (the next figure);
# * **shorter rings**: hierarchical all-reduce, a ring inside each node over NVLink (NVIDIA's
#   GPU-to-GPU link), then one across nodes, so the long ring has nodes, not GPUs, as its members
#   (Jia et al., 2018, trained ImageNet on 2,048 GPUs that way);
# * **bigger messages**: gradients are bucketed (DDP's 25 MB) rather than all-reduced tensor by tensor,
#   which pushes N* up.
#
# **Ring, tree or halving-doubling.** A tree all-reduce reduces up a binary tree to its root and
# broadcasts the sum back down: log₂N levels each way. One tree wastes half the links (its leaves only
# ever send up). So Sanders, Speck & Träff (2009) used two, each rank an inner node in one and a leaf
# in the other, each tree carrying half the data: the **double binary tree**. Cut into chunks and
# pipelined, a rank's link then carries about S each way. NCCL made this its second all-reduce beside
# the ring in version 2.4. In this section's model, with the same α and β:
#
# * ring: 2(N−1)·α + 2(N−1)/N·S·β;
# * double binary tree: 2·log₂N·α + 2·S·β (its best case: the pipeline's per-chunk latencies left out);
# * halving-doubling: 2·log₂N·α + 2(N−1)/N·S·β.
#
# The ring sends a little less (2(N−1)/N·S against 2·S, the same as N grows); the tree pays far fewer
# latencies. The ring is faster only for messages above S = N·(N−1−log₂N)·α/β, a size that grows about
# as N², so in this model at a thousand ranks the tree wins for any gradient. Real libraries decide
# by measurement, not by this formula: NCCL picks its algorithm per message size and topology from
# its own tuning tables, and a ring still wins for large messages on many clusters.
#
# * Left: the three at 100 MB on InfiniBand HDR (the naive root, far slower, is printed rather than
#   drawn).
# * Right: that crossover size against N, with the three gradient sizes as dotted lines.

# %%
scale = ch02.model_scaling(link="ib-hdr", nbytes=100e6)

# %%
t = {(r["algorithm"], r["size_bytes"], r["world_size"]): r["time_s"] for r in scale["rows"]}
assert t["ring", 100e6, 128] < t["naive", 100e6, 128] / 5       # the naive root's N−1 copies
assert t["ring", 100e6, 8] < t["tree", 100e6, 8]                 # a few ranks: the ring's bytes win
assert t["tree", 100e6, 1024] < t["ring", 100e6, 1024] / 2       # a thousand: the tree's log₂N latencies
assert all(t["halving-doubling", s, n] <= min(t["ring", s, n], t["tree", s, n]) for _, s, n in t)

# %% [markdown] slideshow={"slide_type": "subslide"}
# In this model halving-doubling is never slower than either: it has the tree's latencies and the
# ring's bytes. MPI libraries (the standard message-passing libraries of HPC) do use it for large
# all-reduces (Thakur, Rabenseifner & Gropp, 2005).
#
# The model leaves out what keeps it out of NCCL. Its partner changes at every step and is N/2 ranks
# away at the first, so its messages cross the whole network at once and contend for the links between
# switches. And it needs a power of two ranks (others pay extra steps). A ring or a tree talks to the
# same few neighbours throughout, which a library can lay along NVLink inside a node and one network
# port per GPU. The α-β model's one uniform link per rank sees none of this.
#
# **Sending less than the least.** Patarasuk & Yuan's 2(N−1)/N·S is the least a rank must send when the
# ranks do the adding. A network can add instead. With SHARP (Graham et al., 2016, the COMHPC workshop
# at SC16), InfiniBand switches sum the data as it passes through them. Each rank sends its S once up a
# tree of switches and receives the sum once: about half the ring's bytes per rank, and latencies that
# grow with the switch levels rather than with N. NCCL can use it (its CollNet algorithm), as can MPI
# libraries; it needs switches that support it.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9. Training: the ring against the parameter server
#
# The same data-parallel training as chapter 0 (a 2.1M-parameter MLP, 8.4 MB of gradients) with our
# ring, against chapter 1's synchronous parameter server with one server, as the number of workers N
# grows. Left: step time. Right: bytes through the **busiest** rank per step — any rank of the ring,
# the server of the parameter server — counted.

# %%
scale = ch02.scaling(world_sizes=(1, 2, 4))

# %%
ring = {r["n"]: r["bytes"] for r in scale if "ring" in r["label"]}
assert all(r["bytes"] == r["exact"] for r in scale)            # counted = formula, every row
assert ring[4] < 2 * ring[2]                                   # the ring: bounded by 2 · 2S per rank
server = {r["n"]: r["bytes"] for r in scale if "server" in r["label"]}
if server:                                                     # (when chapter 1's experiment is installed)
    assert server[4] == 2 * server[2] and all(server[n] > ring[n] for n in (2, 4))
for r in scale:
    print(f"{r['label']:>30}, N={r['n']}: {r['step_ms']:7.1f} ms/step, {r['bytes'] / 1e6:6.2f} MB/step")

# %% [markdown] slideshow={"slide_type": "subslide"}
# On one machine the "network" is memory copies made by the same cores, so the server's single link is
# not a separate bottleneck the way it is on a real cluster. And with more ranks than cores the ranks
# take turns: each of the ring's 2(N−1) steps needs every rank to run, so at N = 4 on 2 cores each
# step also waits for ranks that are off their core, while the server takes the workers' messages as
# they come. So here the ring's step can be slower than the server's although it moves far fewer
# bytes through any one rank. The counted bytes show the structural difference; on a cluster, one
# device per rank, the busiest link sets the time, and §8 shows what that means at scale.
#
# ## 10. Try it yourself
#
# World size, tensor size and algorithm; each click runs real processes and shows counted bytes per
# rank against the formula, the time and the bandwidth.

# %%
ch02.explorer()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
# The crossover exercise uses the 4-rank fit: at N = 2 a formula without its /N gives the same number.
fit4 = bw["fits"][4]
exercises = ch02.exercises(alpha=fit4["alpha_s"], beta=fit4["beta_s_per_byte"], world_size=4)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The first one runs on real ranks (2, 3 and 4 of them). §3's loop is there to read; try to write the
# reduce-scatter without looking. If the ranks end up waiting for each other, the check stops after
# 10 s and says where each rank was waiting.

# %%
exercises["reduce_scatter"]


# %%
def my_reduce_scatter(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):  # noqa: B007 (you will need s)
        send_i = ...   # the chunk this rank sends at step s
        into_i = ...   # the chunk it adds what arrives into
        incoming = torch.empty_like(chunks[into_i])
        comm.exchange(chunks[send_i], right, incoming, left).wait()
        chunks[into_i] += incoming


exercises["reduce_scatter"].submit(my_reduce_scatter)

# %%
exercises["bytes"]


# %%
def ring_bytes(n, s):
    ...  # your code here

exercises["bytes"].submit(ring_bytes)

# %%
exercises["crossover"]

# %%
exercises["crossover"].submit(...)  # replace ... with a number of bytes

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **reduce-scatter by hand** — §2's animation, §3's code on real ranks, and your `my_reduce_scatter`, judged on its steps, its chunk sizes and the tensor it was given.
# 2. **bytes per rank** — §5's counted bytes equal to the exact formula (asserted).
# 3. **the α–β model** — §6's fit beside Gloo and its algbw and busbw, §7's pipelined ring, and your crossover size.
# 4. **cluster scale** — §8: N* = S·β/α on InfiniBand figures, where the ring's 2(N−1) latencies take over; the ring against the double binary tree and halving-doubling, and where each wins in the model (asserted).
#
# **On a real cluster:** The ring is bandwidth-optimal, but its 2(N−1) latencies grow with N: past a few hundred ranks on small messages, trees, halving-doubling and hierarchical rings take over.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# The ring fixed the communication pattern, but every rank still holds the whole model. Chapter 3
# splits the model itself into stages (**pipeline parallelism**), and chapter 4 stops storing every
# optimizer state on every rank (**ZeRO**), built on the same reduce-scatter and all-gather you just saw.
#
# From a shell: `python -m lesson_lib run ring-allreduce --world-size 4 --size-mb 16 --json ring.json`
# and `python -m lesson_lib bench allreduce`.
