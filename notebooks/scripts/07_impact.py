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
# # Chapter 7 — Putting it all together: the impact, modelled and measured
#
# The talk ends with one chart: for the same model, **training time falls and memory per device
# shrinks with each milestone** — parameter server, ring all-reduce, pipeline parallelism, ZeRO,
# large-batch optimizers, compression — "from months to days". This chapter builds that chart two
# ways and says where every number comes from:
#
# * **modelled at cluster scale** — a cost model of one training step, made of the formulas chapters
#   1–5 and 8 verified on real ranks, fed with datasheet figures (`data/devices.csv`, `data/links.csv`),
#   with one efficiency curve, rising with the matrices' size, fitted on Narayanan et al.'s (SC21) Table 1
#   and tested on published runs it was not fitted on (Korthikanti et al., 2022; MT-NLG, Smith et al.,
#   2022; Llama 3 405B, Dubey et al., 2024; OPT-175B, BLOOM-176B, DeepSeek-V3, Nemotron-4 340B, and
#   NVIDIA's own benchmark tables on H100, B200 and GB200);
# * **measured here** — one model and one data set trained through every milestone on real ranks,
#   to the same target loss; then the same cost model, fed with α, β and FLOP/s measured on this
#   machine, predicts those steps, and we print how far off it is.

# %% [markdown]
# **After this chapter you can:**
#
# 1. estimate a training run's days from FLOPs, devices and achieved throughput by hand, and check it against published runs (§1, days exercise);
# 2. read the talk's chart from a cost model whose every assumption is printed, and change any of them (§2–3);
# 3. pick the smallest ZeRO stage that fits a model on a given device, with or without offload to the host, and say which term dominates a step (§2's offload table, stage and link exercises);
# 4. compare every milestone on one model, measured on real ranks to the same loss (§4), against the model's predictions (§5);
# 5. measure α and β with your own ping-pong and feed them to the cost model (ping-pong exercise).
#
# **Before it:** chapters 0–6 (each milestone); this chapter puts them side by side.
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import math

import torch.distributed as dist  # noqa: F401  (your ping_pong below uses dist and comm)

from lesson_lib import comm, costmodel, show_source
from lesson_lib.chapters import ch07

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. One training step, as code
#
# A training step of a model with Ψ parameters costs four **terms**:
#
# * **compute**: FLOPs over the rate the devices deliver; 6·Ψ per token for forward and backward
#   (Kaplan et al., 2020), 8·Ψ when the forward is recomputed (Narayanan et al., 2021);
# * the pipeline's **bubble**: (P−1)/(M+P−1) of its time (chapter 3);
# * the **bandwidth** and **latency** of its messages, from the α-β formulas (α: the fixed cost of a
#   message; β: seconds per byte; S: the gradient's bytes). For a parameter server with K shards
#   (chapter 1), the busiest endpoint's 2·max(N/K, 1)·S·β + 2·max(N, K)·α: a server takes 2N
#   messages, a worker sends 2K (`costmodel.ps_terms`). For a ring (chapter 2), 2(N−1)/N·S·β +
#   2(N−1)α. For ZeRO-3 (chapter 4), 1.5× the ring's bytes;
# * the **tensor** term: Megatron's two all-reduces of one activation per block forward and two
#   backward (chapter 8), on the node's NVLink. How much of it hides behind compute is an input,
#   `tp_overlap`: 0 (none hidden) unless a run says otherwise, a bound, since Megatron-Core overlaps
#   part of it with the GEMMs (`tp_comm_overlap`; chapter 8).
#
# Tensor parallelism (each layer's matrices split over the t GPUs of a node, so t is its width) and
# sequence parallelism are chapter 8's subject, built there on real ranks; this chapter only prices
# them, as the tensor term and as a divisor of the activations.
#
# How much of the data-parallel communication hides behind compute is an explicit input, the
# **overlap** (0: nothing hidden; 1: all that the compute can cover). The chart below is drawn at both
# bounds. This is the whole step model the chart uses:

# %%
show_source(costmodel.step_time)


# %% [markdown] slideshow={"slide_type": "subslide"}
# The ring's term is chapter 2's formula. Written here in a cell, and checked against the library:

# %%
def my_ring_time(nbytes, n, alpha, beta):
    steps = 2 * (n - 1)  # reduce-scatter, then all-gather: N−1 steps each
    return steps * alpha + steps * (nbytes / n) * beta  # each step moves one N-th of the data


for nbytes, n, alpha, beta in [(350e9, 1024, 5e-6, 1 / 25e9), (16e6, 4, 3e-4, 1 / 2e9), (4.0, 2, 1e-5, 1e-9)]:
    mine, library = my_ring_time(nbytes, n, alpha, beta), costmodel.ring_time(nbytes, n, alpha, beta)
    print(f"S = {nbytes:.3g} B on {n} ranks: {mine:.6g} s (library {library:.6g} s)")
    assert abs(mine - library) <= 1e-12 * library

# %% [markdown] slideshow={"slide_type": "subslide"}
# And the end-to-end time that Narayanan et al. (SC21, §5.1) give for GPT-3 and their 1T-parameter
# model — 8·T·Ψ/(n·X) with the TFLOP/s per GPU they measured (140 and 163) — next to the days they report:

# %%
published = costmodel.published()
for case, p in ((c, published[c]) for c in ("gpt3-175b", "gpt-1t")):
    days = 8 * p["tokens"] * p["params"] / (p["devices"] * p["achieved_tflops_per_device"] * 1e12) / 86400
    print(f"{case}: {days:.1f} days from the formula; the paper says about {p['published_days']:g}")
    assert abs(days / p["published_days"] - 1) <= 0.02  # the paper rounds to whole days
    assert days == costmodel.days_from_throughput(p["tokens"], p["params"], int(p["devices"]),
                                                  p["achieved_tflops_per_device"] * 1e12)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The step model must do more than that closed form: it has to *predict* the throughput from the
# hardware. Each run is given the layout its paper reports — t, p, the batch, the micro-batch, the
# sequence, the recomputation — and one thing that is not a datasheet's or a paper's: the share of
# peak FLOP/s the step reaches, the **efficiency**. A single number for it (fitted on SC21 Table 1:
# `costmodel.CALIBRATED_EFFICIENCY` = 0.549, still there to fix by hand) cannot be right for every
# model: SC21's own Table 1 shows the rate per GPU rising from 137 to 163 TFLOP/s with the model's size.
# What grows is the matrices each device multiplies: a b·s/c × h activation by an h × h/t slice. Such a
# GEMM does x = M·K·N/(M·K + K·N + M·N) FLOPs per byte it reads (its arithmetic intensity), and the
# memory-bound work around the GEMMs (norms, activations, softmax) costs time in proportion to its bytes.
# So the model prices a step as GEMMs at a share E of the peak plus that memory-bound time, which gives
#
# $$e(x) = E\cdot\frac{x}{x + k\cdot R},$$
#
# R being the device's peak over its HBM bandwidth (the FLOPs per byte at which it stops waiting on
# memory). E and k are fitted once (`costmodel.calibrate.fit_gemm_efficiency`: least squares on the log
# of TFLOP/s per GPU) on the **in-sample** set, the ten rows of SC21 Table 1 (1.7B to 1T parameters, t up
# to 8, p up to 64): a fit, not a test. The curve, and the efficiency each of the ten rows needs for the
# model to match it:

# %%
curve = ch07.efficiency_curve()
fit = curve["fit"]
print(f"E = {fit['e_max']:.3f}, k = {fit['k']:.2f}: squared log error {fit['loss']:.3f} over SC21's ten "
      f"rows, against {fit['constant_loss']:.3f} for the best single number")
assert fit["loss"] < 0.55 * fit["constant_loss"]  # the curve halves the constant's error, in-sample
by_x = sorted(curve["points"], key=lambda p: p["x"])
assert by_x[-1]["needed"] > by_x[0]["needed"] + 0.05  # the 1T row needs more of the peak than the 18B one
gpt3_x = costmodel.gemm.gemm_intensity(2048, 12288, 8)  # GPT-3 at t = 8, s = 2,048, b = 1
for name in ("a100-80gb", "h100-sxm"):
    d = costmodel.devices()[name]
    r = costmodel.gemm.ridge(d)
    print(f"{d['name']}: R = {r:.0f} FLOPs/byte; GPT-3 at t = 8, x = {gpt3_x:.0f}: "
          f"e = {costmodel.gemm.gemm_efficiency(gpt3_x, r):.1%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two smallest rows (t = 1 and 2) stay too fast, by 14 % and 6 %: the curve has no term for what
# makes them slower. On another device only R moves, so an H100 needs bigger GEMMs than an A100 to reach
# the same share (R = 295 FLOPs per byte against 153) — an assumption, since all ten points are A100s.
#
# The tests are runs the fit never saw, each **held out** and predicted from its own paper's layout
# (`use` = `out-of-sample` in `data/published.csv`, each row citing its table or section):
#
# * **Korthikanti et al. (2022), Table 5**: 22B, 175B, 530B and 1T models on 8 to 512 A100s, each with
#   full recomputation and with selective recomputation + sequence parallelism, in seconds per iteration;
# * **MT-NLG 530B** (Smith et al., 2022): 105 layers, hidden 20,480, batch 1,920 sequences of 2,048,
#   t = 8 and p = 35 on 280 DGX A100 servers, so 2,240 GPUs and d = 8: 60.1 s per iteration (its batch
#   was ramped up over the first 12B tokens, so no days). The paper does not say whether it recomputed
#   the forward; 126 TFLOP/s at 60.1 s is what 8·Ψ FLOPs per token give, so the row says recompute,
#   inferred;
# * **Llama 3 405B** (Dubey et al., 2024, Table 4) on 8,192 and 16,384 H100s, in model FLOPs per GPU
#   (its MFU); it interleaves its pipeline without saying how far, so v = 7 is assumed and said so.
#   Its third row trains 131,072-token sequences with context parallelism over 16 ranks (keys and values
#   all-gathered, §3.3.2): chapter 8's context-parallel term, against a number the paper prints;
# * **OPT-175B** (Zhang et al., 2022): 992 A100s, FSDP with 8-way tensor parallelism, "up to 147 TFLOP/s
#   per GPU". The paper gives no micro-batch: each replica's 8 sequences as one micro-batch is assumed,
#   and it decides the answer — with 8 micro-batches of 1, FSDP gathers the weights 8 times a step and
#   the model's rate falls by more than half (printed below);
# * **BLOOM-176B** (Le Scao et al., 2022, and its run's own records): TP 4, PP 12, DP 8 on 384 A100s
#   whose nodes share 4 Omni-Path links of 100 Gb/s, micro-batches of 2, full recomputation: 105.22 s
#   per iteration at the full batch of 2,048;
# * **DeepSeek-V3** (DeepSeek-AI, 2024): a mixture of experts (671B parameters, 37B active, 8 of 256
#   experts per token over 64 expert-parallel ranks), PP 16 with no tensor parallelism, FP8, on 2,048
#   H800s: 180K GPU hours per trillion tokens, 1,543 tokens/s per GPU;
# * **held out again**, sixteen runs from four sources none of the above came from: the
#   **Nemotron-4 340B** report (NVIDIA, 2024, Table 2: 6,144 H100s, 8.0 s per iteration); **NeMo 24.07's
#   performance summary** (FP8 on DGX-H100: GPT-3 175B, Llama 2 7B to 70B, Nemotron-340B, Llama 3 8B and
#   70B); **Megatron-Bridge 25.11's** (FP8 Llama 3 on H100, B200 and GB200); and **DGX Cloud
#   Benchmarking**'s Nemotron4 340B in BF16 (128 H100s, 4.77 s). Each row says what its table does not
#   report and so is assumed (the distributed optimizer, overlaps, no recomputation).
#
# Two rows are only **sanity checks**, their layouts not reported and so assumed. **GPT-3 175B**: SC21
# §5.1's text gives 140 TFLOP/s per GPU on 1,024 A100s at batch 1,536 and about 34 days, but no layout
# (Table 1 has no 175B row), so t = 8 and p = 8 are *assumed* here. **LLaMA-65B** (Touvron et al.,
# 2023): 2,048 A100s, about 380 tokens/s per GPU, its shape, its batch of 4M tokens, its saved linear
# outputs and its sequence parallelism from the paper; t = 8 and p = 4 assumed (the layout is not
# reported).
#
# An error is predicted ÷ published − 1, so its sign depends on the unit: positive means too slow a
# step in seconds per iteration, too high a rate in TFLOP/s or tokens/s. Every run, drawn and printed:

# %%
runs = ch07.every_run()
spread, held = runs["spread"], [r for r in runs["rows"] if r["use"] == "out-of-sample"]
sc21 = [r for r in runs["rows"] if r["use"] == "in-sample"]
assert len(sc21) == 10 and len(held) == 31
assert all(abs(r["error"]) <= 0.30 for r in held)  # every held-out run within ±30 %
assert 4 * spread["out-of-sample"]["within_goal"] >= 3 * len(held)  # and three in four within ±15 %
misses = [r for r in held if abs(r["error"]) > 0.15]
assert all(r["case"] in ch07.LACKS for r in misses)  # each miss names the term the model lacks
assert sc21[0]["error"] > 0 > sc21[-1]["error"]  # in-sample: too fast on 1.7B, too slow on 1T
print("held out, outside ±15 %, and the term each lacks:")
for r in misses:
    print(f"  {r['case']} ({r['error']:+.1%}): {ch07.LACKS[r['case']]}")
opt = costmodel.calibrate.compare("opt-175b")
opt_by_ones = costmodel.calibrate.compare("opt-175b", micro_batch=1)
deepseek = costmodel.calibrate.compare("deepseek-v3")
print(f"OPT-175B: {opt['predicted']:.0f} TFLOP/s per GPU with one micro-batch of 8 ({opt['error']:+.0%}); "
      f"{opt_by_ones['predicted']:.0f} with 8 micro-batches of 1 ({opt_by_ones['error']:+.0%}): the "
      "assumption decides it")
terms = deepseek["estimate"]["terms"]
print(f"DeepSeek-V3: {deepseek['predicted']:.0f} tokens/s per GPU ({deepseek['error']:+.0%}); of its "
      f"{terms['step']:.1f} s step, {terms['expert']:.1f} s is the expert all-to-all, left exposed")
plan = deepseek["estimate"]["plan"]
hidden = plan.batch_tokens / (terms["step"] - terms["expert"]) / plan.devices
print(f"  with the all-to-all hidden instead (DualPipe): {hidden:.0f} tokens/s per GPU "
      f"({hidden / deepseek['published'] - 1:+.0%}) — the sign flips")
assert hidden > 1.15 * deepseek["published"]
assert opt_by_ones["predicted"] < 0.5 * opt["predicted"] and deepseek["estimate"]["dominant"] == "expert"
llama = costmodel.calibrate.compare("llama3-405b-8k")["estimate"]
mem = llama["memory"]
masks = costmodel.memory(costmodel.published_plan("llama3-405b-8k", dropout=True))
print(f"Llama 3 405B's layout, memory per GPU by the model: {mem['total'] / 1e9:.1f} GB (activations "
      f"{mem['activations'] / 1e9:.1f} GB) of an 80 GB H100's {mem['device'] / 1e9:.1f}e9 bytes; with "
      f"dropout masks Llama does not have, {masks['total'] / 1e9:.1f} GB; with 80 GB read as 80e9 "
      f"bytes, {'fits' if masks['total'] <= 80e9 else 'does not fit'}")
assert llama["fits"] and mem["device"] - mem["total"] < 0.1 * mem["device"]  # less than a tenth to spare
assert masks["total"] > 80e9  # the model's old answer, 'does not fit', came from the two terms

# %% [markdown] slideshow={"slide_type": "subslide"}
# The spread is the one printed above, measured, not a number typed here. With one efficiency for every
# matrix size, Korthikanti's 530B and 1T runs were all 20–25 % too slow; with e(x) all but one are within
# the goal, and that one's pipeline may interleave (v is not reported, v = 1 assumed, so its bubble may be
# too large). Two misses are too *fast*, each for a term the model cannot see: MT-NLG ran DeepSpeed's
# pipeline at 126 TFLOP/s where SC21's Megatron reached 163 on the same shape, and OPT's "up to 147" is a
# best rate, with FSDP's gathers assumed hidden. The last miss is **DeepSeek-V3**, too slow, and its largest
# term says why: the model sends every token's activations to its 8 experts over InfiniBand and leaves
# that all-to-all exposed, where the paper's DualPipe schedule hides it behind another micro-batch's
# compute and its node-limited routing sends each token to at most 4 nodes. The conclusion can flip:
# hide the all-to-all entirely and the same model is far too *fast*, because it prices every linear
# layer at the FP8 peak with the efficiency fitted on dense GEMMs, where DeepSeek-V3's experts are small
# (7,168 × 2,048). A MoE needs both terms, not one of them.
#
# Memory had a miss of its own. On Llama 3 405B's layout the model said "does not fit", on a layout Meta
# trained on 80 GB GPUs. Two of its terms were wrong (the line above prints both): it read a datasheet's
# 80 GB as 80e9 bytes, where DRAM's GB are binary (an H100's 80 GB are five 16 GiB HBM3 stacks, NVIDIA's
# H100 architecture whitepaper, 2022: 85.9e9 bytes), and it kept Korthikanti et al.'s dropout masks, which
# Llama does not have. Most of what remains is activations: the interleaved 1F1B schedule's first stage
# holds those of p = 16 micro-batches of 8,192 tokens. The margin is thin, and the model's count is not
# the run's: Llama's gated MLP keeps more than the 4h GELU MLP the count assumes, while Meta's pipeline
# schedule (Llama 3 paper, §3.3.2) and the allocator's own needs are not modelled. (Before selective
# recomputation, FlashAttention and interleaving were modelled, it said 947 GB.)
# `tests/test_published_runs.py` holds each miss to its own band and fails if one starts meeting the
# goal, so the list above is kept honest.
#
# The sixteen runs held out again, on their own (median and worst error, and the term any miss lacks):

# %%
fresh = ch07.new_held_out()
assert len(fresh["rows"]) >= 12 and len(fresh["sources"]) >= 3
assert fresh["median"] <= 0.08 and abs(fresh["worst"]["error"]) <= 0.15 and not fresh["misses"]
no_fit = [r["case"] for r in fresh["rows"] if not r["estimate"]["fits"]]
left = {r["case"]: r["estimate"]["memory"]["device"] - r["estimate"]["memory"]["total"]
        for r in fresh["rows"]}
tightest = min(left, key=left.get)
print("the model says 'does not fit' for layouts NVIDIA ran:", ", ".join(no_fit) or "none",
      f"(the tightest, {tightest}: {left[tightest] / 1e9:.1f} GB to spare)")
assert not no_fit
blackwell = [r["error"] for r in fresh["rows"] if r["estimate"]["plan"].device in ("b200", "gb200")]
assert len(blackwell) == 4 and all(abs(e) < 0.06 for e in blackwell)
# these benchmarks ran with Megatron's tensor-parallel overlap; with all of it exposed the answer moves
exposed = {r["case"]: costmodel.calibrate.compare(r["case"], tp_overlap=0.0)["error"] for r in fresh["rows"]}
worst = max(exposed, key=lambda c: abs(exposed[c]))
print(f"assumed: the tensor-parallel traffic hidden (tp_overlap = 1, NeMo's tp_comm_overlap); with all of it "
      f"exposed the worst error becomes {exposed[worst]:+.1%} ({worst})")
assert abs(exposed[worst]) > 0.15  # the assumption flips a run out of the goal

# %% [markdown] slideshow={"slide_type": "subslide"}
# Every error of the new runs is within ±15 %, most too slow by 3–14 % on H100s; on B200 and GB200 the 8B
# and 405B runs land within ±6 %. The assumption that decides it is printed above: with Megatron's
# tensor-parallel overlap assumed off, the H100 runs with t > 1 fall up to a quarter short. Memory now
# agrees too: with 80 GB read as 80 GiB and no dropout masks (these models have none), every layout NVIDIA
# ran fits, the tightest by the few GB printed above. Its activations are still Korthikanti's GPT layer,
# with a 4h MLP where Llama's is gated, and it knows no partial recomputation, so a margin that thin is
# the model's count, not a promise about the run.
#
# The four runs this chapter names, per GPU and end to end (days where the paper gives them):

# %%
checks = ch07.published_check()
for r in checks:  # within the held-out set's ±25 % (for the sanity rows, an assumed layout)
    assert r["estimate"]["fits"] and r["estimate"]["dominant"] == "compute", r["case"]
    assert abs(r["rate_error"]) <= 0.25 and abs(r["time_error"]) <= 0.25, r
by_use = {r["use"]: r for r in checks}
mtnlg, llama = by_use["out-of-sample"], by_use["sanity-check"]
plan = mtnlg["estimate"]["plan"]
assert (plan.tensor, plan.pipeline, plan.data_parallel) == (8, 35, 8)  # the paper's layout, not chosen
print(f"out of sample, MT-NLG 530B on the paper's layout: {mtnlg['modelled_time']:.1f} s per iteration "
      f"predicted against {mtnlg['published_time']:g} ({mtnlg['time_error']:+.0%}), "
      f"{mtnlg['modelled_rate']:.0f} TFLOP/s per GPU against {mtnlg['published_rate']:g} "
      f"({mtnlg['rate_error']:+.0%})")
print(f"sanity check, LLaMA-65B on a layout the model chose: {llama['modelled_time']:.1f} days against "
      f"about {llama['published_time']:g} ({llama['time_error']:+.0%})")
assert llama["rate_error"] < 0 < llama["time_error"]  # slower than reported (the text below)

# %% [markdown] slideshow={"slide_type": "subslide"}
# LLaMA-65B comes out slower than reported (fewer tokens/s, more days): it overlapped its
# all-reduces with computation and used memory-efficient attention (Touvron et al., §2.4), neither
# modelled for its row, and its layout is assumed — a sanity check, not a test.
#
# ### What else had to change for the model to generalise
#
# **FP8.** The first model ran every FLOP of an FP8 step at the FP8 peak, so a step took about half of
# bf16's. NeMo's benchmark of Nemotron-4 340B measures FP8 steps at 0.69–0.72 of bf16's (NeMo's
# performance summary, NVIDIA 2024; chapter 9 §5), and torchao and torchtitan report 1.25–1.5× end to
# end. Only the linear layers run in FP8: attention's scores and weighted sum and the output head stay
# bf16 GEMMs, the memory-bound work e(x) implies (norms, activations) does not speed up, and every cast
# reads the bf16 tensor twice and writes two FP8 copies (`costmodel.gemm.cast_bytes`). On Nemotron-4
# 340B's 128-GPU layout:

# %%
from dataclasses import replace

from lesson_lib.costmodel.fp8 import fp8_step

nemotron = costmodel.published_plan("dgxc-nemotron4-340b-bf16")
bf16, fp8 = costmodel.step_time(nemotron), costmodel.step_time(replace(nemotron, precision="fp8"))
ratio = fp8["step"] / bf16["step"]
bound = fp8_step(nemotron, matmul_share=1.0)  # the old model: every FLOP at the FP8 peak
old_ratio = bound["fp8"]["step"] / bound["bf16"]["step"]
print(f"bf16 step {bf16['step']:.2f} s (DGX Cloud Benchmarking measured 4.77 s); FP8 {fp8['step']:.2f} s: "
      f"ratio {ratio:.2f} ({1 / ratio:.2f}× faster); of FP8's compute {fp8['compute']:.2f} s, GEMMs "
      f"{fp8['gemm_s']:.2f}, memory-bound {fp8['memory_bound_s']:.2f}, casts {fp8['casts_s']:.2f}")
print(f"assumed: only the linear layers in FP8; every FLOP at the FP8 peak instead gives {old_ratio:.2f}")
measured = 32 * 4096 / (costmodel.published()["nemo-nemotron4-340b"]["tokens_per_s_per_device"] * 128)
print(f"published pair for this layout: FP8 {measured:.2f} s (NeMo 24.07) over bf16 4.77 s (DGXC 24.11) = "
      f"{measured / 4.77:.2f}, two software releases apart")
assert 0.69 <= ratio <= 0.72 and old_ratio < 0.6
# torchtitan's Llama 3.1 8B (FSDP on 8 and 128 H100s): Float8 against bf16, both compiled
for n in (8, 128):
    gain = ch07.TORCHTITAN_8B["FSDP + compile + Float8"][n] / ch07.TORCHTITAN_8B["FSDP + compile"][n]
    model = (costmodel.step_time(ch07.torchtitan_llama3_8b(n))["step"]
             / costmodel.step_time(ch07.torchtitan_llama3_8b(n, "fp8"))["step"])
    print(f"torchtitan, Llama 3.1 8B on {n} H100s: FP8 {gain:.2f}× faster measured, {model:.2f}× modelled")
    assert abs(model / gain - 1) < 0.05

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Weak scaling.** Weak-scaled, each GPU keeps its work as the data-parallel ranks grow, and a model
# whose data-parallel traffic hides behind compute predicts a flat step. What no overlap hides is the
# last bucket of gradients, reduced after the backward's last layer: a ring over d·c ranks of
# Megatron-Core's default bucket, max(4·10⁷, 10⁶·d·c) parameters, so it grows with d both by its 2(d−1)
# steps of α and by the bucket. Measured, steps do grow: torchtitan's Llama 3.1 8B with FSDP, the same
# 2 sequences per GPU on 8 and on 128 H100s, ran 5,762 and 5,605 tokens/s per GPU (its benchmark,
# Tables 1 and 3, December 2024): a step 2.8 % longer. A review of this model reported 5–12 %
# from 128 to 2,048 GPUs, a measurement we could not find published with its layout. What the model
# predicts for both, and how much variation per GPU it would need: with each GPU's compute varying by σ
# (`jitter`), a synchronous step waits for the slowest of n, about σ·√(2·ln n) more (the expected
# maximum of n normal variables):

# %%
flat = ch07.weak_scaling()
for r in flat:
    print(f"{r['gpus']:>5} GPUs, d = {r['d']:>2}: step {r['step']:.4f} s, exposed data-parallel and pipeline "
          f"messages {1e3 * r['exposed_dp']:.1f} ms, growth {r['growth']:+.2%}")
assert all(b["step"] > a["step"] for a, b in zip(flat, flat[1:])) and flat[-1]["growth"] < 0.01


def sigma_for(growth, lo=0.0, hi=0.5):  # bisect the jitter at which 128 → 2,048 GPUs grows by `growth`
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ch07.weak_scaling((128, 2048), mid)[-1]["growth"] < growth else (lo, mid)
    return mid


needed = {g: sigma_for(g) for g in (0.05, 0.12)}
print(f"assumed: no stragglers (jitter 0): the step grows {flat[-1]['growth']:.2%}; the 5–12 % reported "
      f"needs σ = {needed[0.05]:.0%}–{needed[0.12]:.0%} of each GPU's compute")
assert 0.03 < needed[0.05] < needed[0.12] < 0.5  # bisected within [0, 0.5]
tt = {n: costmodel.step_time(ch07.torchtitan_llama3_8b(n))["step"] for n in (8, 128)}
measured_growth = ch07.TORCHTITAN_8B["FSDP"][8] / ch07.TORCHTITAN_8B["FSDP"][128] - 1
print(f"torchtitan, 8 → 128 H100s (NVLink, then 400 Gb/s RDMA): step +{measured_growth:.1%} measured, "
      f"+{tt[128] / tt[8] - 1:.1%} modelled")
assert 0 < tt[128] / tt[8] - 1 < measured_growth  # it grows, by less than measured

# %% [markdown] slideshow={"slide_type": "subslide"}
# So on Nemotron's layout the bucket alone moves the step by hundredths of a per cent, and on torchtitan's
# FSDP run (ZeRO-3 moves 1.5× a ring's bytes, from NVLink onto the network) by half a per cent, where
# 2.8 % was measured. The rest needs every GPU's step varying by the σ printed above, or a term this model
# does not have (congestion as the fabric's tiers fill, which MegaScale, Jiang et al., NSDI 2024, tunes
# for). The answer is printed, not asserted as a fact about clusters.
#
# **Grouped-query attention and a 340B layout.** Nemotron-4 340B trained on 6,144 H100s of 80 GB with t =
# 8 and p = 12 (NVIDIA, 2024). Its 8 key/value heads of 96 shrink the keys and values attention keeps
# (Korthikanti's 24/t becomes (20 + 4·8/96)/t), and Megatron's distributed optimizer shards Adam over the
# data-parallel ranks:

# %%
nem = costmodel.estimate(costmodel.published_plan("nemotron4-340b"))
every_head = costmodel.memory(costmodel.published_plan("nemotron4-340b", kv_heads=96))
unsharded = costmodel.memory(costmodel.published_plan("nemotron4-340b", zero=0))
print(f"Nemotron-4 340B, t 8, p 12, v 8, d 64: {nem['memory']['total'] / 1e9:.1f} GB per GPU, "
      f"{'fits' if nem['fits'] else 'does not fit'} on 80 GB; every K/V head kept: "
      f"+{(every_head['total'] - nem['memory']['total']) / 1e9:.1f} GB")
left = unsharded["device"] - unsharded["total"]
print(f"assumed: the distributed optimizer (NeMo's recipe); without it {unsharded['total'] / 1e9:.1f} GB of "
      f"{unsharded['device'] / 1e9:.1f}e9 bytes: {left / 1e9:.1f} GB left for the CUDA context, the "
      "allocator's fragmentation and communication buffers, which the model does not count")
assert nem["fits"] and left < 1e9 and every_head["total"] > nem["memory"]["total"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# **The embedding is a lookup.** PaLM's MFU counts 6·N matmul FLOPs per token (Chowdhery et al., 2022,
# App. B). A model whose input embedding is a table of its own (Llama, Nemotron-4: untied) does not
# multiply by it, so its V·h parameters leave N; a tied one (GPT) multiplies by the same matrix in its
# head, which stays. On Llama 3 405B that is 6 × 128,000 × 16,384 FLOPs per token:

# %%
untied = costmodel.calibrate.compare("llama3-405b-8k")
tied = costmodel.calibrate.compare("llama3-405b-8k", tied_embeddings=True)
print(f"Llama 3 405B, model TFLOP/s per GPU: {untied['predicted']:.1f} with the lookup left out, "
      f"{tied['predicted']:.1f} counted as a matmul (Meta reports 430)")
assert untied["predicted"] < tied["predicted"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. The talk's chart, for GPT-3 on 1,024 A100s
#
# One model (GPT-3: 175B parameters, 300B tokens; Brown et al., 2020), one cluster (1,024 A100
# 80 GB, one 200 Gb/s HDR InfiniBand port per GPU), every milestone in the talk's order. "Does not
# fit" means the model states and activations exceed the device's memory: such a bar's time is
# what the step would cost *if* it fitted. Every assumption is printed under the figure.
#
# One assumption decides the order of the bars: how much of the data-parallel communication hides
# behind compute. Chapter 0 measured all-reduces started during the backward (buckets), chapter 4
# ZeRO-3's prefetch; on a real cluster part of the traffic hides, how much depends on the
# implementation. So each milestone gets two bars: **overlap 0** (nothing hidden, the darker bar) and
# **overlap 1** (everything hidden that the compute can cover; the dotted bar) — the two bounds.

# %%
chart = ch07.talk_chart()
rows = {r["milestone"]: r for r in chart[0.0]}
full = {r["milestone"]: r for r in chart[1.0]}

# %% [markdown] slideshow={"slide_type": "subslide"}
# Which of the chart's conclusions survive that assumption? Each claim, tested on both charts:

# %%
verdicts = {c["claim"]: c for c in ch07.conclusions(chart)}
robust = [c for c in verdicts.values() if c["verdict"] == "holds at every overlap"]
flips = [c for c in verdicts.values() if c["verdict"] == "flips with overlap"]
assert all(all(c["holds"].values()) for c in robust)  # only these are asserted below
assert {c["claim"] for c in flips} >= {"zero-3-bandwidth", "compression"}
assert verdicts["every-milestone"]["verdict"] == "holds at none"  # the talk's shape, at neither bound
# The pipeline against ZeRO-3: far apart with nothing hidden, close with everything hidden, and
# which side of the tie depends on the efficiency and FLOP count assumed (the answer it flips to):
uncalibrated = costmodel.claims.chart(**ch07.GPT3, efficiency=0.5, attention_flops=False)
tie = {}
for label, by in (("calibrated: e(x) from the GEMM shapes, attention counted", chart),
                  ("assumed: 50 % of peak, attention not counted", uncalibrated)):
    days = {ov: {r["milestone"]: r["days"] for r in by[ov]} for ov in (0.0, 1.0)}
    tie[label] = days[1.0]["pipeline"] / days[1.0]["zero-3"] - 1
    print(f"{label}: pipeline {days[0.0]['pipeline']:.1f} vs ZeRO-3 {days[0.0]['zero-3']:.1f} days at "
          f"overlap 0; {days[1.0]['pipeline']:.1f} vs {days[1.0]['zero-3']:.1f} at overlap 1 "
          f"({tie[label]:+.1%})")
    assert days[0.0]["pipeline"] < 0.75 * days[0.0]["zero-3"]  # nothing hidden: the pipeline, clearly
assert all(abs(t) < 0.15 for t in tie.values())  # everything hidden: within 15 %, and
assert min(tie.values()) < 0 < max(tie.values())  # the winner flips with the assumption

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the model says, and what it does not:
#
# * The **parameter server** is drawn twice. With one server (K = 1, chapter 1's section 4) its
#   link carries 2·N·S per step: the hotspot, by far the slowest bar. That is not how it was
#   deployed: DistBelief (Dean et al., 2012) and the parameter server of Li et al. (2014) shard the
#   parameters over many server machines. With K = N shards (`ps-sharded`) each server's link
#   carries 2·N·S/K = 2·S, a worker's 2·S too, and the step is the ring's — at the price of K more
#   machines, each holding 1/K of Adam's state. The sweep below prints K, the machines, the bytes per
#   server and the days.
# * **What the ring removed**, then, is not bytes per worker — a fully sharded server moves as many
#   — but the hotspot of an under-sharded server and the extra server machines: the ring runs on the
#   workers alone. The counter-example is BytePS (Jiang et al., OSDI 2020): it gave the spare CPU
#   machines of a GPU cluster the servers' role and beat all-reduce, since with push and pull on both
#   directions of a link at once a worker sends S while it receives S. This model runs push and pull
#   one after the other, so it does not show that gain.
# * A plain **ring** needs the whole model state (16 bytes per parameter) on every device; a
#   parameter-server **worker** keeps only the 16-bit weights and gradients, 4 bytes per parameter,
#   while the servers hold Adam's 12 (printed below); **ZeRO-1** and **ZeRO-2** still keep 2–4 bytes
#   per parameter on each device. None fits. **Pipeline parallelism** fits by cutting the layers into
#   stages; **ZeRO-3** by sharding everything.
# * **What flips with overlap.** With nothing hidden, ZeRO-3 on HDR InfiniBand is bandwidth-bound
#   (it moves 1.5× a ring's bytes through a 25 GB/s port per step) and far slower than the pipeline;
#   with its traffic hidden behind compute (prefetch, chapter 4) its step is its traffic, which the
#   compute can no longer cover, and it and the pipeline, whose bubble no overlap removes, come within
#   15 % of each other (printed above). Which one wins depends on assumptions this chart cannot settle:
#   with e(x) and attention's FLOPs counted the pipeline is ahead (the constant 0.549 made it a tie
#   within 1 %), with 50 % of peak and no attention FLOPs ZeRO-3 is. So we assert the closeness and the
#   flip, not a winner.
# * **What holds at both bounds.** The memory verdicts (overlap moves no byte of memory), the single
#   parameter server's hotspot, the sharded server matching the ring on twice the machines — and
#   LAMB, but only on the chart's micro-batches. Its **4× larger batch** gives each replica 6
#   sequences per step, and the chart runs them as **one micro-batch of 6 sequences**: ZeRO-3 gathers
#   the parameters once per micro-batch, so once per step, at 48.9 GB per device (the activations of 6
#   sequences). That quarters the steps and so the gathers per token, taking at least a quarter off
#   ZeRO-3's days at both bounds — *if* it reaches the same loss in the same tokens, which You et al.
#   (2020) showed for BERT but which stops holding past a critical batch size (McCandlish et al., 2018).
#   Run as **6 micro-batches of 1**, ZeRO-3 gathers the parameters 6 times per step, and LAMB is
#   *slower* than the chart's ZeRO-3 at both overlaps. So "LAMB holds at every overlap" is a verdict
#   about one micro-batch of 6, not about LAMB; the table after the next cell prints both.
# * **What holds at neither.** The talk's "time falls with every milestone": with nothing hidden
#   ZeRO-3 is slower than the pipeline before it; with everything hidden compression saves nothing
#   over LAMB, since there is no exposed traffic left to shrink.

# %%
for name in ("memory", "ps-hotspot", "ps-sharded", "lamb"):  # hold at both bounds (LAMB: 1 micro-batch of 6)
    assert verdicts[name]["verdict"] == "holds at every overlap", verdicts[name]
for by in (rows, full):
    assert not any(by[m]["fits"] for m in ("parameter-server", "ps-sharded", "ring", "zero-1", "zero-2"))
    assert all(by[m]["fits"] for m in ("pipeline", "zero-3", "lamb", "compression"))
    assert by["lamb"]["days"] <= 0.75 * by["zero-3"]["days"]
one, sharded, ring = rows["parameter-server"], rows["ps-sharded"], rows["ring"]
N, psi = ring["data_parallel"], ring["plan"].params
# K = N: a worker's bytes are 2·S, the ring's 2(N−1)/N·S, so the same step up to N/(N−1)
bandwidth_ratio = sharded["terms"]["bandwidth"] / ring["terms"]["bandwidth"]
assert sharded["servers"] == N and math.isclose(bandwidth_ratio, N / (N - 1))
assert abs(sharded["days"] / ring["days"] - 1) <= 1 / (N - 1) and one["days"] > 100 * sharded["days"]
assert one["memory"]["server"] == 12 * psi and sharded["memory"]["server"] == 12 * psi / N
print(f"memory per device: ring {ring['memory']['total'] / 1e12:.2f} TB "
      f"({ring['memory']['total'] - ring['memory']['activations']:.3g} bytes of model state); "
      f"parameter-server worker {one['memory']['total'] / 1e9:.0f} GB; "
      f"Adam's state on the servers {one['memory']['server'] / 1e12:.2f} TB in all, "
      f"{sharded['memory']['server'] / 1e9:.2f} GB per server at K = {N:,}")
print(f"machines: ring {ring['machines']:,}, single server {one['machines']:,}, "
      f"sharded {sharded['machines']:,} "
      f"({sharded['machine_days'] / ring['machine_days']:.2f}× the ring's machine-days)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# LAMB's bar with its micro-batches explicit, beside the chart's ZeRO-3 bar (each replica's 1.5
# sequences as one micro-batch), at both overlaps:

# %%
lamb = ch07.lamb_microbatches()

# %%
for ov in ch07.OVERLAPS:
    of6, of1 = lamb[0, ov], lamb[1, ov]  # one micro-batch of 6; six micro-batches of 1
    assert (of6["lamb"]["plan"].microbatches, of6["lamb"]["plan"].sequences_per_microbatch) == (1, 6)
    assert of6["lamb"]["days"] == {0.0: rows, 1.0: full}[ov]["lamb"]["days"]  # the chart's bar
    assert of6["lamb"]["days"] <= 0.75 * of6["zero-3"]["days"]  # at least a quarter off ZeRO-3's days
    assert of1["lamb"]["plan"].microbatches == 6 and of1["lamb"]["days"] > of1["zero-3"]["days"]  # slower
    assert of1["lamb"]["memory"]["total"] < of6["lamb"]["memory"]["total"]  # for less memory
assert round(lamb[0, 0.0]["lamb"]["memory"]["total"] / 1e9, 1) == 48.9

# %% [markdown] slideshow={"slide_type": "subslide"}
# Between the two extremes, the sharded server's days fall as 1/K until K = N, while its server
# machines grow as K (the latency term 2·max(N, K)·α never vanishes: each server still hears every
# worker, and each worker talks to K servers):

# %%
sweep = ch07.ps_sharding((1, 8, 64, 256, N))
days = [r["days"] for r in sweep[:-1]]
assert all(b < a for a, b in zip(days, days[1:])) and abs(days[-1] / sweep[-1]["days"] - 1) <= 1 / (N - 1)
assert all(r["terms"]["latency"] >= sweep[-1]["terms"]["latency"] * (N - 1) / N for r in sweep[:-1])

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The compression bar is a bound
#
# The compression bar divides the gradient bytes by 4 and assumes **no extra steps** — the chart
# labels it "bound: no extra steps". Chapter 6 measured otherwise on its small model: compressed
# runs needed more steps to reach the same loss. How many depends on the compressor, the model and
# the run, and no figure measured there transfers to GPT-3, so none is taken as a default.
#
# The plan's `extra_steps` says how many more, as a share; its days grow as (1 + extra_steps). The
# **break-even** share against LAMB, the bar it builds on, is LAMB's days over compression's, minus
# one.
# Chapter 6 also showed that compressors whose payloads are **all-gathered** (top-k, QSGD, sign)
# stop saving bytes at a break-even N, long before the chart's 1,024 data-parallel ranks; only schemes
# that all-reduce (PowerSGD, random-k with shared indices, casts) keep the 4×:

# %%
squeeze = ch07.compression_bound()

# %%
# at 10 % more steps compression is no faster than LAMB, with or without overlap
assert all(r["days"] >= r["lamb_days"] for r in squeeze["rows"] if r["extra_steps"] >= 0.1)
assert squeeze["topk_break_even"] < squeeze["d"] and squeeze["topk_ratio_at_d"] > 1

# %% [markdown] slideshow={"slide_type": "subslide"}
# So compression's lower days are conditional: with nothing hidden it beats LAMB only while it
# needs fewer extra steps than the printed break-even share; with the traffic hidden it cannot beat
# LAMB at all. Its case is a slow link (chapter 6's emulated one, section 4 below), not this cluster.
#
# ### "From months to days"?
#
# The talk's summary, tested with the chart's own numbers. At a **fixed model** — GPT-3 on the same
# 1,024 A100s — compare the plain ring (as if it fitted) with the fastest bar that fits, at both
# overlaps; then ask what the milestones bought across model sizes: the largest model a plain ring
# fits on these devices, against GPT-3.

# %%
months = ch07.months_to_days()

# %%
for f in months["fixed"].values():
    assert f["best_days"] > 14  # at the fixed model, weeks, not days, at both bounds
    assert f["ring_days"] / f["best_days"] < 2  # less than 2× faster than the plain ring
small = months["ring_largest"]
assert months["params"] / small["params"] > 10 and all(d < 7 for d in small["days"].values())
gpt3_paper = costmodel.published()["gpt3-175b"]["published_days"]
print(f"GPT-3's real run (Narayanan et al., SC21): {gpt3_paper:g} days")

# %% [markdown] slideshow={"slide_type": "subslide"}
# At a fixed model size the milestones take the run from about two months (the ring, with nothing
# hidden, if the memory allowed it) to five or six weeks, or change little once the traffic hides —
# weeks, not days, like GPT-3's real run printed above. What they bought is **scale**: on the same
# 1,024 GPUs, plain data parallelism fits a model of a few billion parameters, trained in a day or
# two; with pipelines, ZeRO and large batches a model dozens of times larger fits and trains in
# about a month. "Months to days" is true of a *fixed* small model on more devices; the talk's
# milestones turned that into far larger models in about the same month.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Offload: the host's memory as a fourth ZeRO stage?
#
# ZeRO-Offload (Ren et al., USENIX ATC 2021) builds on ZeRO-2: each device's shard of the gradients
# and of Adam's fp32 state (2 + 12 bytes per parameter, over d data-parallel ranks) moves to the
# host's memory, where the CPU takes Adam's step. The device keeps the bf16 parameters and the
# activations, and per step sends its gradient shard down and gets its parameter shard back over
# PCIe. Ren et al. report 13 billion parameters trained on a single 32 GB V100 this way. The cost
# model with offload (its new assumptions are printed below), first that case, then a trillion
# parameters on 1,024 A100s at several pipeline depths:

# %%
v100 = costmodel.estimate(costmodel.Plan(13e9, 1e9, 1, device="v100-32gb", zero=2, offload=True,
                                         batch_tokens=8 * 2048))
alone = costmodel.estimate(costmodel.Plan(13e9, 1e9, 1, device="v100-32gb", zero=2, batch_tokens=8 * 2048))
print(f"13B on one V100: {v100['memory']['total'] / 1e9:.1f} GB on the device, "
      f"{v100['memory']['host'] / 1e9:.0f} GB on the host with offload; "
      f"{alone['memory']['total'] / 1e9:.0f} GB on the device without")
print(*costmodel.assumptions(v100["plan"])[-1:], sep="\n")
trillion = ch07.offload(1e12, 1024)

# %%
assert v100["fits"] and not alone["fits"]  # Ren et al.'s headline case, from the model
at = {(r["pipeline"], r["milestone"]): r for r in trillion}
for p in (8, 16, 32, 64):
    with_off, without = at[p, "zero-2 + offload"]["memory"], at[p, "zero-2"]["memory"]
    plan = at[p, "zero-2"]["plan"]
    moved = 14 * 1e12 / (p * plan.data_parallel)  # 2 + 12 bytes per parameter of my shard
    assert abs(with_off["host"] - moved) <= 1e-9 * moved
    assert abs(without["total"] - with_off["total"] - moved) <= 1e-6 * moved
assert not at[8, "zero-2 + offload"]["fits"] and at[8, "zero-3"]["fits"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# At a trillion parameters offload moves only the small part: with ZeRO-2 each device still holds
# the bf16 parameters of its pipeline stage, 2Ψ/P, which is what does not fit until P is large.
# ZeRO-3 shards those too and fits at every depth here. Offloading the parameters as well is
# ZeRO-Infinity (Rajbhandari et al., SC 2021), which also uses NVMe; it is not modelled here. What
# offload costs is PCIe time each step and the host's own Adam step (assumed hidden here, as
# Ren et al. overlap it); what it buys is memory where a machine has much more of it.
#
# ### The tensor-parallel term
#
# The published runs above use t = 8, one DGX node (for GPT-3 assumed); the chart uses t = 1. Each transformer block's
# tensor-parallel all-reduces (chapter 8: two of one activation forward, two backward, two more when
# the forward is recomputed) run on NVLink. Unless `tp_overlap` says otherwise none of it is hidden (a
# bound: Megatron-Core overlaps part of it with the GEMMs), so it is a term of its own, `tensor`. Sequence parallelism (Korthikanti et al., 2022) turns each all-reduce into a
# reduce-scatter and an all-gather, the same bytes, re-gathers the column layers' inputs in the
# backward (chapter 8 §3), and divides the activations between the blocks by t:

# %%
for sp in (False, True):
    e = costmodel.estimate(costmodel.published_plan("gpt3-175b", sequence_parallel=sp))
    print(f"GPT-3, t = 8, p = 8 (assumed), sequence parallel {'on ' if sp else 'off'}: "
          + ", ".join(f"{k} {e['terms'][k]:.2f} s" for k in costmodel.TERMS)
          + f"; activations {e['memory']['activations'] / 1e9:.1f} GB per device")
print(costmodel.assumptions(e["plan"])[-1])
off, on = (costmodel.estimate(costmodel.published_plan("gpt3-175b", sequence_parallel=sp))
           for sp in (False, True))
assert 0 < off["terms"]["tensor"] < on["terms"]["tensor"] < off["terms"]["compute"] / 4
assert on["memory"]["activations"] < off["memory"]["activations"] / 4

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. What if…
#
# Change the model, the tokens, the number and kind of device, the link, how much communication
# hides behind compute, the tensor-parallel width t (within one node) with or without sequence
# parallelism, and the milestones. Nothing starts: the model is arithmetic, so the table
# follows the controls. The same from a shell: `python -m lesson_lib estimate --params 175e9
# --tokens 300e9 --devices 1024 --device a100-80gb --link ib-hdr --json gpt3.json`.

# %%
ch07.what_if()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Measured here: one model through every milestone
#
# The model of chapters 0–4 (a 3-layer MLP, 38.5k parameters) on their data set, 3 ranks, the same
# seed and the same global batch of 96 — through a synchronous parameter server (2 workers, 1
# server), data parallelism with our ring, a 3-stage 1F1B pipeline, ZeRO-1/2/3, LAMB at 8× the
# batch on ZeRO's data-parallel path, and chapter 6's PowerSGD (rank 2, error feedback; Vogels et al.,
# NeurIPS 2019) twice: on the real link and on an **emulated** 10 Mbit/s link with 100 µs per message
# (`comm.set_link`: each transfer is held until latency + bytes/bandwidth have passed — a sleep, not a
# network; the record's `link_gbps` says so and its bar is hatched).
#
# <details><summary>Why PowerSGD is this chapter's compressor</summary>
#
# On this model PowerSGD reached the target at 19× fewer gradient bytes, where chapter 6's other
# strong candidate, top-k at 1 %, did not reach it within the budget in our runs. The choice is
# explained beside `COMPRESSOR` in `lesson_lib/milestones/impact/milestone.py`.
#
# </details>
#
# Each trains until the end of its budget; we record when the loss, averaged over 5 steps, first
# reaches 1.0 (the **target**). The optimizers differ because the milestones do: the parameter
# server, the pipeline and PowerSGD train with SGD (momentum 0.9), ZeRO with Adam, the large batch
# with LAMB. Within each family the steps are the same computation (chapters 1, 3 and 4 check that),
# so they need the same number of steps — except PowerSGD, which sends an approximation of the
# gradient and needs a few more.

# %%
result = ch07.measured("quick")
records = {r["milestone"]: r for r in result["milestones"]}

# %% [markdown] slideshow={"slide_type": "subslide"}
# Times vary from run to run, and where the 3 ranks outnumber the cores they are stretched by
# time-sharing (the note above the figure says so); which bar is shortest can change between runs.
# What holds in every run is checked here:
#
# * every milestone reaches the target;
# * the same computation needs the same steps, and the large batch the fewest;
# * the parameter server's link carries 2·N·S per step, the ring's 2·2(N−1)/N·S (sent and received);
# * ZeRO-3 moves 1.5× ZeRO-1's bytes, and each ZeRO stage holds less model state than the one before.
#
# PowerSGD's memory includes its error-feedback residual (one more gradient-sized buffer) and its Q
# matrices, under "buffers": compression saves bytes on the wire, not in memory.

# %%
n, psi = 3, records["ring"]["param_count"]
assert all(r["reached_target"] for r in records.values()), ch07.table(result["milestones"])
sgd = [records[m]["steps"] for m in ("parameter-server", "ring", "pipeline")]
assert max(sgd) - min(sgd) <= 1, sgd  # equal to float rounding: a crossing may move by a step
assert records["zero-1"]["steps"] == records["zero-2"]["steps"] == records["zero-3"]["steps"]
assert records["lamb"]["steps"] < min(r["steps"] for m, r in records.items() if m != "lamb")
assert records["parameter-server"]["bytes_per_step_busiest"] == 2 * (n - 1) * 4 * psi  # exact
ring_formula = 2 * 2 * (n - 1) / n * 4 * psi  # sent + received, float32 gradients
assert abs(records["ring"]["bytes_per_step_busiest"] / ring_formula - 1) <= 0.001  # + the loss
z1, z3 = records["zero-1"]["bytes_per_step_busiest"], records["zero-3"]["bytes_per_step_busiest"]
assert abs(z3 / z1 - 1.5) <= 0.01, (z1, z3)
states = [max(m["params"] + m["grads"] + m["optimizer"] for m in records[f"zero-{s}"]["peak_memory_per_rank"])
          for s in (1, 2, 3)]
assert states[0] > states[1] > states[2], states
# PowerSGD against the ring (both SGD with momentum): the extra steps it took here, and what that share
# would do to the chart's compression bar (a 38k-parameter MLP is not GPT-3: an illustration, not a default)
extra = max(0.0, records["compression"]["steps"] / records["ring"]["steps"] - 1)
at_extra = costmodel.estimate(costmodel.plan_for("compression", **{k: ch07.GPT3[k] for k in (
    "params", "tokens", "devices")}, extra_steps=extra))
print(f"PowerSGD took {records['compression']['steps']} steps, the ring {records['ring']['steps']}: "
      f"{extra:.0%} extra; the chart's compression bar at that share: {at_extra['days']:.1f} days "
      f"(LAMB's: {rows['lamb']['days']:.1f}, overlap 0)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# PowerSGD's bytes follow from its shapes: per step two ring all-reduces — P (rows × 2 per weight
# matrix) with the biases it leaves uncompressed, then Q (columns × 2) — instead of one of all Ψ
# gradients. The emulated link changes the time of a step, never what is computed or sent: the two
# PowerSGD runs have the same losses and the same counted bytes, and each emulated step lasts at
# least its messages' latency plus its bytes over the bandwidth (the link holds every transfer that
# long).

# %%
from lesson_lib.milestones import impact

real, slow = records["compression"], records["compression-slow-link"]
sizes = impact.powersgd_sizes(impact.plans(impact.Config(preset="quick"))["compression"][1])
print("elements per all-reduce (P with the biases, Q):", sizes, "— of Ψ =", psi)
powersgd_bytes = max(sum(comm.ring_bytes_sent(m, 4, n, r) + comm.ring_bytes_sent(m, 4, n, r - 1)
                         for m in sizes + [1]) for r in range(n))  # sent + received, the loss's 1 float
assert real["bytes_per_step_busiest"] == slow["bytes_per_step_busiest"] == powersgd_bytes
assert real["losses"] == slow["losses"] and real["link_gbps"] is None and slow["link_gbps"] == 0.01
messages = 3 * 2 * (n - 1)  # two all-reduces for the gradient, one for the loss: 2(N−1) messages each
sent = max(sum(comm.ring_bytes_sent(m, 4, n, r) for m in sizes) for r in range(n))
floor = messages * 100e-6 + sent * 8 / 0.01e9
assert slow["median_step_s"] >= floor, (slow["median_step_s"], floor)
print(f"emulated link: at least {1e3 * floor:.1f} ms of every step is the link; the uncompressed ring "
      f"on it would take {1e3 * slow['predicted_uncompressed_step_s']:.0f} ms per step (cost model), "
      f"PowerSGD measured {1e3 * slow['median_step_s']:.0f} ms")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. The cost model against these measurements
#
# Before the milestones ran, the ranks measured this machine, all at once so that they share the
# cores as in training: α and β fitted to our ring all-reduce at four sizes (chapter 2's method),
# and each rank's FLOP/s on one local step of the model (forward, backward, update). Fed to the same
# formulas — compute 6·Ψ per sample, the parameter server's 2·N·S/K, the ring's 2(N−1) steps, the
# pipeline's M + P − 1 slots, ZeRO's per-layer collectives, PowerSGD's three small all-reduces, and on
# the emulated link chapter 6's messages·latency + bytes/bandwidth (the slower of that and the real
# link counts) — the model predicts each milestone's step (the parameter server's "communication" is
# a worker's wait for the server). On the emulated link's row most of the step is the held
# transfers the model describes.

# %%
from lesson_lib import plots

plots.impact.predicted_vs_measured(result["milestones"])

# %%
print(ch07.validation_table(result))

# %% [markdown] slideshow={"slide_type": "subslide"}
# How far off it is changes from run to run and from machine to machine (the last two lines print
# the range of measured ÷ predicted), and we do not assert it. A 38k-parameter step lasts
# milliseconds, so what the model leaves out is large here: Python and autograd overheads per layer
# and per message, and ranks time-sharing the cores. At cluster scale those overheads are small next
# to seconds of matrix work and gigabytes of traffic; that is where such a model earns its keep (§1).
#
# <details><summary>Why a small message costs milliseconds here</summary>
#
# With 3 ranks on 2 cores, a 4-byte ring all-reduce costs milliseconds, not microseconds, because
# each of its steps may wait for the next rank to be scheduled. Fitting α on all ranks at once puts
# part of that wait into α, not all of it: a pipeline's or ZeRO-3's many small messages each wait
# again, which the model has no term for. That is a property of this machine, not of a link.
#
# </details>

# %%
for r in result["milestones"]:
    assert r["predicted_step_s"] > 0 and r["median_step_s"] > 0

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# Each exercise checks your answer when you call `submit`. Hints and solutions are folded away.

# %%
exercises = ch07.exercises()
exercises["days"]

# %%
exercises["days"].submit(...)  # replace ... with a number of days

# %%
exercises["stage"]

# %%
exercises["stage"].submit(...)  # replace ... with 0, 1, 2 or 3

# %% [markdown] slideshow={"slide_type": "subslide"}
# The estimate the next exercise asks about:

# %%
case = costmodel.estimate(costmodel.plan_for("zero-3", 175e9, 300e9, 1024))
print({k: round(v, 3) for k, v in case["terms"].items() if k != "flops"})
exercises["link"]

# %%
exercises["link"].submit(...)  # replace ... with (term, seconds)

# %%
exercises["pingpong"]


# %%
def ping_pong(send, recv):
    ...  # your code here: runs on ranks 0 and 1 (dist.get_rank() tells which)


exercises["pingpong"].submit(ping_pong)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **training time by hand** — §1's closed form, the efficiency curve e(x) fitted on SC21 Table 1 alone (drawn with its ten points), every held-out run (Korthikanti Table 5, MT-NLG, Llama 3 405B, OPT-175B, BLOOM-176B, DeepSeek-V3, and the sixteen held out again from Nemotron-4 340B and NVIDIA's NeMo, Megatron-Bridge and DGX Cloud tables) drawn against its prediction on its own layout with each error printed (all within ±30 %, three in four within ±15 %, the new sixteen's median and worst asserted), the term each miss lacks, FP8's step ratio, weak scaling, GQA's memory and the embedding as a lookup, each with the assumption that flips it, the GPT-3 and LLaMA-65B sanity checks, and your GPT-3 days.
# 2. **the chart** — §2's days per milestone at no and at full overlap, which conclusions hold at both (asserted) and which flip, LAMB's verdict with its micro-batches explicit, the compression bar as a bound, "from months to days" in the chart's numbers, the tensor-parallel term, and §3's calculator.
# 3. **memory and the dominant term** — §2's offload table (ZeRO-Offload fits 13B on one V100; at a trillion parameters ZeRO-3 fits where ZeRO-2 with offload does not, asserted) and your ZeRO stage and link answers.
# 4. **measured side by side** — §4's table (every milestone to the same loss, asserted) and §5's predictions beside it.
#
# **On a real cluster:** No single milestone wins: a modern run combines data, pipeline and sharded parallelism, mixed precision and large-batch optimizers, and the cost model says which term to attack next.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Which chapter moved which bar
#
# What each moved, in the chart and in the dashboard:
#
# | ch. | milestone | what it moved |
# |---|---|---|
# | [0](00_why_distributed.ipynb) | data parallelism | compute shared by n devices; a bill of 16 bytes per parameter that does not fit |
# | [1](01_parameter_server.ipynb) | parameter server | **bandwidth**: 2·N·S per step on one server's link; K shards divide it, for K more machines |
# | [2](02_ring_allreduce.ipynb) | ring all-reduce | **bandwidth**: 2(N−1)/N·S per rank, flat in N; α adds **latency** |
# | [3](03_pipeline_parallelism.ipynb) | pipeline (1F1B) | **memory** per device ÷ the stages; adds the **bubble** (P−1)/(M+P−1) |
# | [4](04_zero.ipynb) | ZeRO-1/2/3 | **memory** per device 16Ψ → 16Ψ/N; ZeRO-3 pays 1.5× the **bandwidth** |
# | [5](05_large_batch.ipynb) | LAMB, large batch | fewer **steps** per token: less communication, a smaller bubble |
# | [6](06_compression.ipynb) | compression | fewer **bytes** for a few more steps ¹ |
# | [8](08_beyond_data_parallel.ipynb) | tensor, sequence parallel | the **tensor** term ² |
#
# ¹ PowerSGD's bar in the dashboard; on a slow (emulated) link that buys time; in the chart, a bound
# (no extra steps). ² Two all-reduces per block each way, on NVLink; sequence parallelism divides the
# activations between the blocks by t.
#
# Back to the [table of contents](README.md).
