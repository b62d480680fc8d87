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

# %%

# %% [markdown]
# # Chapter 9 — Eight-bit training: FP8 formats, scaling recipes and FP8 communication
#
# Chapter 4 ended the precision story at bf16: no loss scale needed. Today's largest runs compute in
# **FP8**: DeepSeek-V3 (2024) trained 671B parameters with FP8 matmuls, torchtitan ships torchao's
# float8 linear layers with FSDP2's float8 all-gather, Megatron runs TransformerEngine's delayed
# scaling. An H100 multiplies FP8 twice as fast as bf16 (1,979 against 989 dense TFLOP/s, NVIDIA H100
# datasheet), and FP8 weights travel in half the bytes. The price is range and precision: a **scaling
# recipe** replaces "bf16 needs no loss scale". Every FP8 product below is real: `torch._scaled_mm`
# multiplies float8 matrices on this CPU, slowly, with the real numerics.

# %% [markdown]
# **After this chapter you can:**
#
# 1. read e4m3's and e5m2's range and precision beside bf16, fp16 and fp32, and choose e4m3 for activations and weights and e5m2 for gradients by a measured error (§1, formats exercise);
# 2. write a per-tensor scaled, saturating cast and multiply through `torch._scaled_mm`, and measure per-tensor, delayed, row-wise and DeepSeek-V3's block-wise scaling against fp32, and no scaling at all (§2, cast and blocks exercises);
# 3. train a model with FP8 linear layers data-parallel on real ranks, beside bf16 and fp32 on the same data and seeds, and show where a recipe without scaling stalls (§3);
# 4. all-gather FP8 weights with their scales as FSDP2 does, count half of bf16's bytes exactly, and say from chapter 7's cost model how the dominant term moves when compute halves (§4–5).
#
# **Before it:** chapters 4 (FSDP, bf16 and loss scaling), 7 (the cost model) and 8.
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch

from lesson_lib import show_source
from lesson_lib.chapters import ch09, ch09_exercises
from lesson_lib.milestones.fp8 import allgather, linear, scaling

# %% [markdown]
# ## 1. The formats
#
# Micikevicius et al. ("FP8 Formats for Deep Learning", 2022) proposed two 8-bit formats: **e4m3**
# (4 exponent bits, 3 mantissa bits; no infinities, so its largest value is 448) and **e5m2** (5 and 2,
# IEEE-like, up to 57,344). Beside the 16- and 32-bit formats, from `torch.finfo`:

# %%
table = ch09.formats_table()
by = {r["format"]: r for r in table}
assert by["e4m3"]["max"] == 448 and by["e5m2"]["max"] == 57344  # the paper's Table 1
assert by["e5m2"]["binades"] > by["e4m3"]["binades"] + 13 and by["e4m3"]["eps"] < by["e5m2"]["eps"]

# %% [markdown]
# e4m3 is finer (steps of 1/8 between 1 and 2), e5m2 wider (14 more powers of two). Activations and
# weights sit within a few powers of two of their largest value: they need precision. Gradients span far
# more: they need range. Hence the **hybrid** recipe: e4m3 forward, e5m2 for gradients. Measured, on
# an activation-like tensor and on a gradient-like one whose magnitudes span 24 powers of two:

# %%
choice = ch09.format_choice()
acts, grads = choice
assert acts["e4m3"] < acts["e5m2"] and grads["e5m2"] < grads["e4m3"]

# %% [markdown]
# ## 2. Scaling
#
# A tensor whose largest value is 0.02 or 5,000 would waste e4m3's range or overflow it. So each
# tensor is divided by a **scale** that maps its largest magnitude (its **amax**) to the format's
# largest value, clamped (a **saturating** cast: never inf), and the matmul multiplies the scales back
# in. Written in a cell, and run through `torch._scaled_mm` against fp32:

# %%
def my_scaled_cast(x, fmt=torch.float8_e4m3fn):
    top = torch.finfo(fmt).max
    amax = x.abs().max()
    scale = amax / top if amax > 0 else torch.tensor(1.0)  # an all-zero tensor: scale 1, never 0/0
    return (x / scale).clamp(-top, top).to(fmt), scale


a, w = torch.randn(64, 128), 0.02 * torch.randn(256, 128)
(a8, sa), (w8, sw) = my_scaled_cast(a), my_scaled_cast(w)
y = torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)  # real FP8 operands
exact = a @ w.t()
gap = float((y.float() - exact).abs().max() / exact.abs().max())
print(f"a @ wᵀ in e4m3 against fp32: largest error {gap:.1%} of the largest entry")
assert gap < 4 * 2**-4  # a few of e4m3's unit roundoff (2⁻⁴)
assert torch.equal(my_scaled_cast(a)[0].float(), scaling.quantize(a)[0].float())  # = the library's

# %% [markdown]
# The library's recipes, shown from their source: per-tensor and row-wise scales from the current
# amax; **delayed scaling** (NVIDIA TransformerEngine), which takes the scale from the largest amax of
# the last steps, so no pass over the tensor precedes its cast; and **block-wise** scaling (DeepSeek-V3
# technical report, §3.3), one scale per 1×128 tile of activations and per 128×128 block of weights.
# `_scaled_mm` on CPU takes no block scales, but inside one 128-wide slice of K a tile's scale is a row
# scale, so each slice is one real row-wise FP8 product, summed in fp32 as DeepSeek-V3 does.

# %%
show_source(scaling.DelayedScaling)
show_source(scaling.blockwise_mm)

# %%
rec = ch09.recipes()

# %%
r = rec["rows"]
assert r["delayed (history 16)"] > 3 * r["per tensor"]  # a fresh outlier above the history saturates
assert max(r["per tensor"], r["row-wise"], r["block-wise (1×128, 128×128)"]) < 2 * 2**-4
acts_plain, grads_e5m2, _ = rec["no_scaling"]
assert acts_plain["over"] > 0 and acts_plain["error"] > 10 * acts_plain["scaled_error"]  # saturated
assert grads_e5m2["under"] == 1.0 and grads_e5m2["scaled_error"] < 0.1  # every gradient → 0 unscaled
big = {x["recipe"]: x["error"] for x in rec["sweep"] if x["outlier"] == 1e6}
assert big["per tensor"] > 10 * big["block-wise (1×128, 128×128)"]  # fine-grained scales survive

# %% [markdown]
# Without a scale, outliers beyond 448 saturate (this torch clamps e4m3 at ±448; e5m2 goes to inf) and
# gradients of an LLM's size (~1e-6) all become zero. Per-tensor scaling holds until outliers push
# the bulk of the values below e4m3's smallest normal; row-wise and block-wise scales confine an
# outlier to its own row or tile. Delayed scaling trusts its history: a new, larger outlier saturates.
#
# Try a recipe against outliers of another size (each choice runs the real FP8 matmul again):

# %%
ch09.recipe_calculator()

# %% [markdown]
# ## 3. Training in FP8 on real ranks
#
# The FP8 linear layer as torchao's `Float8Linear` runs it with its tensorwise recipe: forward
# operands in e4m3, the incoming gradient in e5m2, every product through `_scaled_mm`; the weights
# stay fp32 (the master copy) and so does the optimizer:

# %%
show_source(linear.FP8Matmul)

# %% [markdown]
# A 3-layer MLP learns a fixed teacher, data-parallel on 2 ranks (each rank's slice, its own scales,
# fp32 gradients all-reduced), in fp32, bf16 and FP8 from the same start on the same batches. Then the
# loss is divided by 1,024 and the learning rate multiplied by it: the same SGD in exact arithmetic,
# with gradients as small as a mean over a thousand times more tokens makes them.

# %%
runs = ch09.training(world_size=2)

# %%
rows, tol = runs["rows"], runs["tolerance"]
for row in rows.values():
    assert row["dp_gap"] <= row["dp_tolerance"], row  # ranks = one process on the same slices
assert rows["bf16"]["gap"] <= tol["bf16"] and rows["fp8"]["gap"] <= tol["fp8"], (rows, tol)
assert rows["fp8, loss ÷ 1024"]["gap"] <= tol["fp8"]  # scaled: the gradients' size does not matter
stalled = rows["fp8 unscaled, loss ÷ 1024"]
assert stalled["zero_grads"] > 0.9 and stalled["losses"][-1] > 2 * rows["fp32"]["losses"][-1]

# %% [markdown]
# ## 4. FP8 communication
#
# Under FSDP2 (chapter 4) each rank holds a shard of every weight and all-gathers it before use. If the
# layer computes in FP8 anyway, gather the FP8 copy: half of bf16's bytes. torchao's
# `enable_fsdp_float8_all_gather` does that; each rank must cast with the *whole* weight's scale, so
# the ranks first share their amaxes. Written on the course's ranks (e4m3 travels as `uint8`):

# %%
show_source(allgather.gather_fp8)

# %%
gathered = ch09.all_gather(world_sizes=(2, 4))

# %%
for row in gathered:
    assert row["equal"], row  # bit-equal to the unsharded FP8 model
    assert row["fp8"] == row["fp8_formula"] and row["bf16"] == row["bf16_formula"], row
    assert row["fp8"] < 0.51 * row["bf16"], row  # half, plus 4 bytes of amax per shard

# %% [markdown]
# torchao 0.18.0 installs beside torch 2.13 and its `Float8Linear` runs forward and backward on this
# CPU (checked when this chapter was written); it is not a dependency of the course, and its FSDP2
# float8 all-gather is for GPUs.

# %% [markdown]
# ## 5. At cluster scale
#
# Chapter 7's cost model has a precision flag: the matmuls at the FP8 peak (H100 and H200: 1,979 dense
# TFLOP/s, NVIDIA datasheets). `costmodel.fp8.fp8_step` also gathers ZeRO-3's parameters in FP8. The
# model states do not shrink: fp32 master weights and Adam's two fp32 moments stay.

# %%
scale = ch09.at_scale()

# %%
s = {x["label"]: x for x in scale}
ratio = s["1536 GPUs, bf16"]["terms"]["compute"] / s["1536 GPUs, fp8"]["terms"]["compute"]
assert abs(ratio - 1979 / 989) < 1e-9, ratio  # the datasheets' peaks, dense FP8 against bf16
assert s["1536 GPUs, bf16"]["dominant"] == "compute" and s["1536 GPUs, fp8"]["dominant"] == "bandwidth"

# %% [markdown]
# Halving compute halves the time overlap has to hide communication behind: at 1,536 GPUs the gathers
# become the largest term in FP8, and the step is no longer twice as fast.

# %% [markdown]
# ## Exercises
#
# All three run on 2 and 4 real ranks, each rank on its own tensors.

# %%
exercises = ch09_exercises.exercises()
exercises["cast"]

# %%
def fp8_cast(x):
    ...  # return (x8, scale)


exercises["cast"].submit(fp8_cast)

# %%
exercises["formats"]

# %%
my_formats = ...  # (for activations and weights, for gradients)
exercises["formats"].submit(my_formats)

# %%
exercises["blocks"]

# %%
def block_quantize(w):
    ...  # return (w8, scales)


exercises["blocks"].submit(block_quantize)

# %% [markdown]
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **formats** — §1's table from `torch.finfo`, the grids drawn, the measured errors that pick e4m3 for activations and e5m2 for gradients (asserted), and your formats.
# 2. **scaling** — §2's cast written in a cell through `_scaled_mm`, each recipe's error against fp32, saturation and underflow without a scale, the outlier sweep (asserted), and your cast and blocks.
# 3. **training** — §3's FP8 MLP on 2 ranks equal to one process, within e4m3's tolerance of fp32 beside bf16, and stalled without scaling (asserted).
# 4. **communication and scale** — §4's FP8 all-gather bit-equal to the unsharded model at half the bytes, exactly the formula's, and §5's cost model where FP8 moves the dominant term from compute to the gathers.
#
# **On a real cluster:** FP8 matmuls with per-tensor (torchao, TransformerEngine) or block-wise (DeepSeek-V3) scales, FSDP2 gathering FP8 weights, fp32 master weights and optimizer state; and more of the step left for overlap to hide.
#
# Back to the [table of contents](README.md).
