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
# # Chapter 6 — Communication compression: less talk, more work
#
# Even with the ring (chapter 2) and larger batches (chapter 5), every step still ships the whole
# gradient. **Compression** ships less, in three ways:
#
# * **Sparsification** sends only some coordinates. **Top-k** sends the k largest: those above a
#   threshold (Strom, 2015) or a fixed fraction (Aji & Heafield, 2017). Deep Gradient Compression
#   (Lin et al., 2018) added momentum correction, local gradient clipping and a warm-up, to keep the
#   accuracy while sending far fewer. **Random-k** sends k random coordinates.
# * **Quantization** sends fewer bits per number: 16-bit floats, a few levels (QSGD, Alistarh et al.,
#   2017) or just the sign (1-bit SGD, Seide et al., 2014; signSGD, Bernstein et al., 2018). EF-SignSGD
#   (Karimireddy et al., 2019) adds a scale and error feedback.
# * **Low rank** sends two thin matrices instead of each weight gradient (PowerSGD, Vogels et al.,
#   2019).
#
# What a compressor drops is not lost if each rank keeps it and adds it to its next gradient. That is
# **error feedback**, which 1-bit SGD introduced (Seide et al., 2014); what a rank keeps is its
# **residual**.
#
# This chapter runs each of them in real data-parallel training on your machine, counts the bytes
# that cross, and asks the question users of real systems ask: *I turned compression on — why is it
# not faster?*

# %% [markdown]
# **After this chapter you can:**
#
# 1. write top-k and random-k with error feedback on real ranks and show what error feedback saves (§1, §3, random-k exercise);
# 2. check our PowerSGD against torch's `powerSGD_hook`, to the bit (§2);
# 3. count each scheme's bytes on 2, 4 and 8 ranks and say which grow with N — all-gathered ones — and which do not (§4–5, top-k exercise);
# 4. find, from measured times and the α–β model, the bandwidth below which compression pays, and check it on an emulated link (§6, crossover exercise);
# 5. write the QSGD quantizer and check it is unbiased (QSGD exercise).
#
# **Before it:** chapters 0 and 2 (all-reduce, all-gather, the α–β model).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_lib import comm, show_source, warm_cluster
from lesson_lib.chapters import ch06
from lesson_lib.chapters.timed import timed_claim
from lesson_lib.data import teacher_classification
from lesson_lib.milestones import compression
from lesson_lib.milestones.compression import PowerSGD, SignAllReduce, TopK, ddp_hook
from lesson_lib.milestones.compression.allreduce import all_to_all
from lesson_lib.models import mlp

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Top-k with error feedback, on real ranks
#
# Each rank adds its residual (what it did not send before) to its gradient, keeps the k largest
# magnitudes and sends them with their indices. Ranks keep **different** coordinates, so their
# messages cannot be added in place on the way, as a ring all-reduce does. Instead every rank gathers
# everyone's (index, value) pairs — an **all-gather**: every rank receives every rank's message — and
# adds them where they land. Written in this cell, run on 2 real ranks, and compared with
# `lesson_lib.milestones.compression.TopK` on the same gradients:

# %%
def topk_error_feedback(steps: int = 4, numel: int = 1000, k: int = 20):
    rank, n = dist.get_rank(), dist.get_world_size()
    grads = [torch.randn(numel, generator=torch.Generator().manual_seed(10 * rank + s)) for s in range(steps)]
    residual, mine = torch.zeros(numel), []
    for g in grads:
        acc = g + residual                          # error feedback: what was not sent comes back
        idx = acc.abs().topk(k).indices             # the k largest magnitudes
        vals = acc[idx]
        all_idx = [torch.empty_like(idx) for _ in range(n)]
        all_vals = [torch.empty_like(vals) for _ in range(n)]
        dist.all_gather(all_idx, idx)               # everyone's indices ...
        dist.all_gather(all_vals, vals)             # ... and values
        avg = torch.zeros(numel)
        for i, v in zip(all_idx, all_vals):
            avg.index_add_(0, i, v)                 # sparse contributions added where they land
        mine.append(avg / n)
        residual = acc.clone()
        residual[idx] = 0                           # keep what was not sent
    library = TopK(ratio=k / numel)
    theirs = [library.reduce(g.clone()).clone() for g in grads]
    return mine, theirs


outs = warm_cluster(2).run(topk_error_feedback)
mine, theirs = outs[0]
print("largest difference from lesson_lib's TopK over 4 steps:",
      max(float((a - b).abs().max()) for a, b in zip(mine, theirs)))

# %%
for rank_out in outs:
    for a, b in zip(*rank_out):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a - b).abs().max()
assert all(torch.equal(a, b) for a, b in zip(outs[0][0], outs[1][0])), "ranks disagree"

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's version packs each (int32 index, float32 value) pair into one byte buffer and
# all-gathers it with our counted ring, so every byte that crosses is counted; error feedback lives
# in the shared `reduce` of every compressor:

# %%
show_source(TopK._reduce, compression.Compressor.reduce)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. PowerSGD, checked against torch's
#
# PowerSGD treats each weight gradient M (n × m) as a matrix and sends P = MQ (n × r) and then
# Q = MᵀP (m × r) — both **add in place**, because (Σᵢ Mᵢ)Q = Σᵢ MᵢQ — one power iteration per step,
# warm-started from the last step's Q. The ranks end with P Qᵀ ≈ the average of M. Biases (1-D)
# travel uncompressed, in the same all-reduce as P: two all-reduces per step.
#
# Torch's hook and the paper's code post a third all-reduce for the biases and overlap it with
# computing P. Our ring blocks, so the biases ride with P instead: the same bytes, one all-reduce's
# latency fewer. Our step:

# %%
show_source(PowerSGD._reduce)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Every compressor is also a **DDP communication hook** (`ddp_hook(compressor)`): DDP hands it a
# bucket of gradients, and it returns a *future* (a handle that completes with a result) of the
# averaged bucket. Here our PowerSGD hook and torch's own `powerSGD_hook` train
# the same model under `torch.nn.parallel.DistributedDataParallel` on 2 real ranks with the same
# settings (rank 2, compression from step 2, torch's seed):

# %%
def ddp_powersgd(ours: bool, steps: int = 6):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    model = mlp(16, 64, 2, 10, seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if ours:
        ddp.register_comm_hook(None, ddp_hook(PowerSGD(rank=2, start_iter=2)))
    else:
        ddp.register_comm_hook(psgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2),
                               psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = teacher_classification(512, 16, 10)
    rank, n = dist.get_rank(), dist.get_world_size()
    for s in range(steps):
        batch = torch.arange(64 * s, 64 * (s + 1))[rank::n]
        opt.zero_grad()
        F.cross_entropy(ddp(x[batch]), y[batch]).backward()
        opt.step()
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


ours, torchs = (warm_cluster(2).run(ddp_powersgd, flag)[0] for flag in (True, False))
print("largest parameter difference after 6 steps, ours vs torch's powerSGD_hook:",
      float((ours - torchs).abs().max()))

# %%
# Same seed, same order of operations; on 2 ranks each sum has two terms, so even Gloo's and our
# ring's additions agree exactly. On more ranks they may differ in the last bits.
assert torch.equal(ours, torchs)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Does it still learn? Loss against steps and against bytes
#
# A 2-layer MLP (77k parameters, 307 KB of gradients) on 2 ranks, plain SGD, 150 steps, the same
# data and seed for every compressor. Dotted lines: **without** error feedback.

# %%
runs = ch06.accuracy()
final = {label: ch06.final_loss(r) for label, r in runs.items()}

# %% [markdown] slideshow={"slide_type": "subslide"}
# Against bytes (right), every compressed run reaches a given loss after far fewer bytes than the
# uncompressed one. Against steps (left), fp16 follows the uncompressed run closely, and top-k and
# sign **with** error feedback stay close to it; **without** error feedback they fall behind — the
# coordinates top-k drops are never sent, and sign's rounding errors pile up in one direction. The
# exact losses vary a little with the CPU; the cell checks the margins that hold on every run.
#
# Random-k sends the fewest bytes but learns slowest here: it picks coordinates blind to their size,
# so most of what it sends is small (error feedback keeps the rest for later). The last run, *sign,
# compressed all-reduce* (dashed), sends the same scaled signs another way, which §5 explains. In
# every run all ranks end with the same parameters, bit for bit (`ranks_agree` compares a hash of
# each rank's).

# %%
assert abs(final["fp16"] - final["none"]) < 0.02, final
assert final["topk 1%, no error feedback"] > final["topk 1%"] + 0.3, final
assert final["sign, no error feedback"] > final["sign"] + 0.15, final
for label in ("topk 1%", "sign", "powersgd, rank 2", ch06.QSGD_LABEL, ch06.SIGN_AR_LABEL):
    assert final[label] < 1.5 * final["none"], (label, final)
assert all(r["ranks_agree"] for r in runs.values())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. What really crossed
#
# Counted bytes per step on the busiest rank, against two baselines: the fp32 ring's 2(N−1)/N·4S
# bytes (S parameters of 4 bytes) and the **bf16 ring**'s 2(N−1)/N·2S — what DDP users turn on first
# (`bf16_compress_hook`), and the fair baseline for any compressor: it halves the bytes for almost
# nothing. Not quite nothing at scale: a bf16 ring rounds every partial sum to bf16's 8 bits, an
# error that grows with the number of ranks summed (chapter 4 §8), which is why large runs often
# reduce in fp32. The compressors below cannot ride on the library's all-reduce at all: NCCL and Gloo
# reduce by adding numbers element by element, and adding packed sign bits, or QSGD codes that each
# carry their own rank's scale, gives nonsense. So they all-gather, unless, like PowerSGD, the
# compression is linear, so that the sum of the compressed parts is the compressed sum.
# Indices, norms and scales are included: top-k sends 8 bytes per kept value (4 of them the index),
# QSGD and sign one float32 per 512-element block besides their packed bits. QSGD's `bits=2` sets
# s = 3 levels a side; a code (sign and level, 7 values) needs 3 bits and crosses in 4, which the
# label says.

# %%
wire = ch06.wire_table(runs)
by = {r["label"]: r for r in wire}

# %%
n, S = 2, by["none"]["param_count"]
k = round(0.01 * S)
ring = 2 * (n - 1) / n * 4 * S  # the uncompressed ring's bytes per rank per step
assert by["none"]["wire_bytes_per_step"] == by["none"]["uncompressed_bytes_per_step"] == ring
assert by["fp16"]["wire_bytes_per_step"] == by["none"]["wire_bytes_per_step"] / 2
assert by["topk 1%"]["wire_bytes_per_step"] == (n - 1) * 8 * k  # an all-gather of (index, value)
assert by["randomk 1%"]["wire_bytes_per_step"] == 4 * k  # shared indices: a ring of k values only
blocks = -(-S // compression.BLOCK)
assert by["sign"]["wire_bytes_per_step"] == (n - 1) * (4 * blocks + -(-S // 8))
width = compression.qsgd_width(2)  # s = 3 levels a side: 7 codes, packed in 4 bits
assert by[ch06.QSGD_LABEL]["wire_bytes_per_step"] == (n - 1) * (4 * blocks + -(-S * width // 8))
# on 2 ranks the compressed all-reduce sends what the all-gather does: one payload (§5 adds ranks)
assert by[ch06.SIGN_AR_LABEL]["wire_bytes_per_step"] == compression.busiest_bytes(S, n) == by["sign"][
    "wire_bytes_per_step"]
assert by["none"]["bf16_ring_bytes_per_step"] == ring / 2  # the bf16 ring: half the fp32 one

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. More ranks: all-gather against all-reduce
#
# Everything so far ran on 2 ranks, where one thing cannot be seen. Our top-k, QSGD and sign send
# each rank's own message (own indices, own norms or scales) and **all-gather** them: each rank sends
# its payload P to N−1 others, (N−1)·P. fp16/bf16, random-k (a seed shared by the ranks picks the
# same coordinates everywhere) and PowerSGD add in place, so they ride a **ring all-reduce**:
# 2(N−1)/N·P, below 2P whatever N. At N = 2 both are one payload exactly. The *compressed all-reduce*
# (diamonds, dashed) is the third way, explained below the figure. Here every compressor runs a few
# steps of the same model on 2, 4 and 8 real ranks. Where ranks outnumber the cores they run too
# slowly to time, but every byte is still counted exactly; the figure says when that happens. Stars
# mark where an all-gathered scheme stops saving: filled against the fp32 ring, open against the bf16
# ring.

# %%
scale = ch06.scaling()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The all-gathered lines climb in proportion to N−1 and cross the rings (stars): top-k at 1% stops
# saving bytes against the fp32 ring at N = S/k, about 1/ratio ranks (each rank receives N−1 lists
# of k pairs), and against the bf16 ring at half that; QSGD's 4-bit codes stop much sooner (the table
# prints each N against both rings), and at 8 ranks they already send more than plain fp16. PowerSGD
# was designed to be all-reduce compatible for this reason (Vogels et al., 2019): its factors P and Q
# add in place, so its bytes per rank stay flat as ranks are added. The cell checks the counts
# against the payloads:

# %%
b, P, S = scale["bytes"], scale["payload"], scale["param_count"]
for label in scale["all_gathered"]:  # (N−1) payloads, exactly
    assert all(b[label][n] == (n - 1) * P[label] for n in ch06.SCALING_WORLDS), (label, b[label])
for label, rings in scale["rings"].items():  # 2(N−1)/N of the payload, up to 2 elements per ring
    for n in ch06.SCALING_WORLDS:
        assert abs(b[label][n] - 2 * (n - 1) / n * P[label]) < 2 * 4 * rings, (label, n, b[label])
assert set(scale["rings"]) == {"none", "fp16", "bf16", "randomk 1%", "powersgd, rank 2"}
assert P["topk 1%"] == 8 * k  # k int32 indices and k float32 values
assert scale["break_even"]["topk 1%"] == -(-S // k)  # (N−1)·8k ≥ 2(N−1)/N·4S from N = S/k on
assert scale["break_even"][ch06.QSGD_LABEL] < scale["break_even"]["topk 1%"]  # QSGD stops first
assert all(n > 8 for n in scale["break_even"].values())  # nothing has stopped saving yet at 8 ...
assert b[ch06.QSGD_LABEL][8] > b["fp16"][8]  # ... but at 8 ranks 4-bit QSGD sends more than fp16
for label, n in scale["break_even_bf16"].items():  # the first N where (N−1)·P ≥ the bf16 ring's bytes
    ring16 = lambda m: compression.ring_busiest_bytes(S, 2, m)
    assert (n - 1) * P[label] >= ring16(n) and (n == 2 or (n - 2) * P[label] < ring16(n - 1)), label
    assert n <= scale["break_even"][label]  # a cheaper baseline is reached sooner
for label in scale["chunked"]:  # the compressed all-reduce: its exact count, about 2(N−1)/N·P
    assert all(b[label][n] == compression.busiest_bytes(S, n) for n in ch06.SCALING_WORLDS), b[label]
    assert b[label][8] < b["sign"][8] / 3  # the same code, all-gathered: (N−1)·P
print("break-even N against the fp32 ring:", scale["break_even"])
print("break-even N against the bf16 ring:", scale["break_even_bf16"])

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Quantized messages can be reduced on the way: a compressed all-reduce
#
# Top-k's messages cannot be added in place without growing: each rank keeps its own indices, and
# the sum of N sparse vectors has up to N times their entries. Quantized messages need not be
# all-gathered at all. **1-bit Adam's compressed all-reduce** (Tang et al., 2021) is a ring
# all-reduce's two phases with a compressor in each: every rank compresses its gradient (plus its
# *worker* residual) and sends compressed chunk j to rank j (an **all-to-all**); rank j decodes the N
# codes of its chunk, averages them, compresses the average (plus its *server* residual), and the
# compressed averages are **all-gathered**. Error feedback on both sides keeps what each of the two
# codes did not say. Each rank sends its N−1 foreign chunks once and its own compressed average N−1
# times: about 2(N−1)/N·P, flat in N like a ring. signSGD with majority vote (Bernstein et al., 2019)
# is another way to reduce quantized messages: the server sums the ranks' signs and sends back the
# sign of the sum.
#
# Here is the compressed all-reduce with §4's scaled sign, in our counted point-to-point calls (an
# all-gather is an all-to-all that sends the same message to every rank):

# %%
show_source(SignAllReduce._reduce, all_to_all)

# %% [markdown] slideshow={"slide_type": "subslide"}
# On 4 real ranks, three steps of random gradients of the chapter's size, compared with
# `compression.simulate`, the same algorithm for 4 ranks in one process (every rank's codes, the
# server sums in rank order, both residuals):

# %%
def step_grads(n: int, steps: int = 3, numel: int = S):
    return [[torch.randn(numel, generator=torch.Generator().manual_seed(100 * s + r)) for r in range(n)]
            for s in range(steps)]


def sign_allreduce_steps():
    rank, n = dist.get_rank(), dist.get_world_size()
    ours = SignAllReduce()  # error feedback on: a worker residual and a server residual
    return [ours.reduce(g[rank].clone()).clone() for g in step_grads(n)]


outs = warm_cluster(4).run(sign_allreduce_steps)
want = compression.simulate(step_grads(4))
print("largest difference from the single-process simulation, any rank, any step:",
      max(float((a - w).abs().max()) for out in outs for a, w in zip(out, want)))

# %%
assert all(torch.equal(a, w) for out in outs for a, w in zip(out, want))  # every rank, bit for bit

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. When does it pay? An emulated link
#
# On one machine every "link" is a memory copy at several GB/s: compression mostly costs time. To see
# a network, `lesson_lib.comm.set_link` makes every transfer take at least α + bytes/B, where α is
# the fixed cost of a message (100 µs here) and B the bandwidth: the real copy first, then a sleep for
# the rest. It is an **emulation**, labelled so on the figure.
#
# Each compressor's time per step is measured at bandwidths from 0.03 to 30 Gbit/s, beside chapter
# 2's α-β model fed with what was measured on the real link: compute time per step, messages per step
# and counted bytes. It runs on 2 ranks and again on 4 (fewer bandwidths and steps). Where 4 ranks
# outnumber the cores they are **oversubscribed**: they time-share the cores, which stretches the
# wall clock. So each measurement has its busy time (the slowest rank's CPU time per step, open
# markers) beside it, and the figure says when that happens.

# %%
show_source(comm.set_link)

# %%
sweep = ch06.bandwidth_sweep()
t = {(r["compressor"], r["gbps"]): r for r in sweep["rows"]}

# %% [markdown] slideshow={"slide_type": "subslide"}
# **On a slow link the bytes decide.** Every compressor's step is shorter by about the time its saved
# bytes would take on the link — on 4 ranks too, where top-k's all-gather already sends 3 payloads.
# There a step is mostly sleeping on the emulated wire, so the busy times stay far below the wall
# clock and time-sharing the cores costs little.
#
# **On a fast link the bytes cost little**, and what is left is each compressor's own work and
# messages. PowerSGD posts two all-reduces per step instead of one, each paying α twice per rank, so
# there the uncompressed ring is as fast or faster. The oversubscribed 4 ranks' wall times stretch
# well past their busy times.
#
# Where the lines cross (the **crossover**) depends on the machine's compute speed and on what else
# runs on its cores, so it moves from run to run: compare the predicted and measured crossovers in
# the table. The slow end does not move on a quiet machine: below, each compressor should save at
# least half of its saved bytes' link time. The other half is room for its compute and its extra
# messages' sleeps, which a busy machine stretches: with other jobs on the cores, PowerSGD's
# measured step can be a few times its prediction, so the cell prints what this run showed (and the
# load) rather than stopping; the bytes, which no load changes, are asserted.

# %%
slow = ch06.GBPS[0]
base = sweep["base"]
for c in ("fp16", "topk", "powersgd"):
    assert base[c]["wire_bytes_per_step"] < base["none"]["wire_bytes_per_step"]  # fewer bytes, always
    link_s = (base["none"]["wire_bytes_per_step"] - base[c]["wire_bytes_per_step"]) * 8 / (slow * 1e9)
    saved = t["none", slow]["step_s"] - t[c, slow]["step_s"]
    timed_claim(saved > 0.5 * link_s, f"{c} saves at least half its bytes' link time at {slow:g} Gbit/s",
                f"{saved * 1e3:.0f} ms saved of {link_s * 1e3:.0f} ms")
# On the slowest link the emulated transfer dominates, and the model predicts it within a third.
ratio = t["none", slow]["step_s"] / t["none", slow]["predicted_s"]
timed_claim(abs(ratio - 1) < 0.33, "the α-β model predicts the uncompressed step within a third",
            f"measured / predicted {ratio:.2f}")
# On 4 ranks the model was fed with the bytes counted there: the ring's and fp16's 2(N−1)/N, top-k's (N−1).
four = sweep["by_world"][4]["base"]
assert four["none"]["wire_bytes_per_step"] == compression.ring_busiest_bytes(S, 4, 4)
assert four["fp16"]["wire_bytes_per_step"] == compression.ring_busiest_bytes(S, 2, 4)
assert four["topk"]["wire_bytes_per_step"] == 3 * 8 * k

# %% [markdown] slideshow={"slide_type": "subslide"}
# Time per step is half the story: a compressor that needs more steps can lose what it saved.
# Section 3's runs say how many steps each needed to bring the training loss (mean of 10 steps) to
# 0.9; times the step time measured above, that is the time to reach it on each link:

# %%
ttt = {(r["compressor"], r["gbps"]): r for r in ch06.time_to_target(runs, sweep, target=0.9)}

# %%
# The compressed runs need a few more steps than the uncompressed one (fewer than 1.5 times as many
# here, counted), and on the slowest link each step is much shorter (measured: printed with the load).
assert all(ttt[c, slow]["steps"] < 1.5 * ttt["none", slow]["steps"] for c in ("topk", "powersgd")), ttt
for c in ("topk", "powersgd"):
    timed_claim(ttt[c, slow]["time_s"] < ttt["none", slow]["time_s"] / 2,
                f"{c} reached the target in less than half the uncompressed run's time at {slow:g} Gbit/s",
                f"{ttt[c, slow]['time_s']:.1f} s against {ttt['none', slow]['time_s']:.1f} s")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Try it
#
# Choose a compressor, its parameter (k/S for top-k and random-k, b for QSGD: s = 2^b − 1 levels,
# rank for PowerSGD), error feedback, and a link. Each click trains on real ranks.

# %%
ch06.explorer()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same from a shell: `python -m lesson_lib run compression --compressor topk --ratio 0.01
# --no-error-feedback --link-gbps 1 --world-size 2 --json topk.json`.
#
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch06.exercises(ch06.crossover_case(sweep))
exercises["topk_bytes"]

# %%
exercises["topk_bytes"].submit(...)  # replace ... with (bytes, k)

# %%
exercises["qsgd"]


# %%
def qsgd(x, s):
    ...  # your code here: return a tensor like x


exercises["qsgd"].submit(qsgd)

# %%
exercises["crossover"]

# %%
exercises["crossover"].submit(...)  # replace ... with a bandwidth in Gbit/s

# %%
exercises["randomk"]


# %%
def randomk_step(grad, residual, k, step):
    ...  # your code here: runs on every rank; return (average, new_residual)


exercises["randomk"].submit(randomk_step)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **error feedback** — §3's losses with and without it (asserted), and your random-k.
# 2. **PowerSGD** — §2: ours equal to torch's hook (asserted).
# 3. **bytes at more ranks** — §4's counted bytes against formulas, §5's break-even N per scheme.
# 4. **when it pays** — §6's emulated link against the model, and your crossover bandwidth.
#
# **On a real cluster:** On fast interconnects compression often does not pay (Agarwal et al., 2022), and the baseline to beat is the bf16 ring, not fp32; where it does pay, schemes that stay all-reduce compatible (PowerSGD, Vogels et al., 2019) or reduce their codes on the way (1-bit Adam's compressed all-reduce, Tang et al., 2021) scale, and all-gathered ones send more with every rank.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## What comes next
#
# Chapter 7 puts the pieces together: data, pipeline and sharded parallelism, larger batches and
# compression, and a cost model to choose among them for a given cluster.
