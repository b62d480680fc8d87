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
# # Chapter 9 — Eight-bit training: FP8 formats, scaling recipes and FP8 communication
#
# Chapter 4 ended the precision story at bf16: no loss scale needed. Today's largest runs compute in
# **FP8**: DeepSeek-V3 (2024) trained 671B parameters with FP8 matmuls, torchtitan ships torchao's
# float8 linear layers with FSDP2's float8 all-gather, Megatron runs TransformerEngine's FP8 recipes.
# An H100 multiplies FP8 twice as fast as bf16 (1,979 against 989 dense TFLOP/s, NVIDIA H100
# datasheet), and FP8 weights travel in half the bytes. The price is range and precision: a **scaling
# recipe** replaces "bf16 needs no loss scale". Every FP8 product below is real: `torch._scaled_mm`
# multiplies float8 matrices on this CPU, slowly, with the real numerics.

# %% [markdown]
# **After this chapter you can:**
#
# 1. read e4m3's and e5m2's range and precision beside bf16, fp16 and fp32, and pick a tensor's format by measuring its error, on this chapter's own gradients too (§1, §3, formats exercise);
# 2. write a per-tensor scaled, saturating cast and multiply through `torch._scaled_mm`, and measure per-tensor, row-wise and DeepSeek-V3's block-wise scaling against fp32, no scaling at all, and delayed scaling, the recipe the field left (§2, cast and blocks exercises);
# 3. train a model with FP8 linear layers data-parallel on real ranks, beside bf16 and fp32 on the same data and seeds, and show where a recipe without scaling stalls (§3);
# 4. all-gather FP8 weights with their scales as FSDP2 does, count half of bf16's bytes exactly, and say from chapter 7's cost model what FP8 buys a step when only the matmuls speed up (§4–5).
#
# **Before it:** chapters 4 (FSDP, bf16 and loss scaling), 7 (the cost model) and 8.
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch

from lesson_lib import show_source
from lesson_lib.chapters import ch09, ch09_exercises
from lesson_lib.costmodel.fp8 import fp8_step
from lesson_lib.milestones.fp8 import allgather, errors, linear, scaling

# %% [markdown] slideshow={"slide_type": "slide"}
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

# %% [markdown] slideshow={"slide_type": "subslide"}
# e4m3 is finer (steps of 1/8 between 1 and 2), e5m2 wider (14 more powers of two). Which one a
# tensor needs depends on how many powers of two its values span once a scale puts its largest value
# at the format's top. Measured on two tensors: an activation-like one (a Gaussian with rare ×50
# outliers), and one *built* to span 24 binades, more than e4m3's 17.8, so that its smallest values
# underflow in e4m3. The measure, each value's relative error after a per-tensor scaled cast:

# %%
show_source(errors.elementwise_error)

# %%
choice = ch09.format_choice()
acts, wide = choice
assert acts["e4m3"] < acts["e5m2"] and wide["e5m2"] < wide["e4m3"]  # precision wins, then range wins

# %% [markdown] slideshow={"slide_type": "subslide"}
# The second tensor is synthetic: it shows where e5m2's range pays, not that gradients are like it.
# Micikevicius et al. (2022) proposed the **hybrid** recipe, e4m3 forward and e5m2 for gradients, for
# per-tensor and delayed scaling, where one scale must cover a whole gradient tensor; TransformerEngine
# calls it `Format.HYBRID`, and torchao's tensorwise recipe casts the output-gradient to e5m2. Finer
# scales change the answer: DeepSeek-V3 (technical report, 2024, §3.3.2) uses E4M3 on all tensors,
# "for higher precision", and credits its fine-grained (1×128, 128×128) scaling for making that
# feasible; torchao's row-wise recipe casts activations, weights and gradients to e4m3. §3 measures
# this chapter's own gradients, cast as its FP8 layer casts them.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Scaling
#
# A tensor whose largest value is 0.02 or 5,000 would waste e4m3's range or overflow it. So each
# tensor is divided by a **scale** that maps its largest magnitude (its **amax**) to the format's
# largest value, clamped (a **saturating** cast: never inf), and the matmul multiplies the scales back
# in. Before reading on, write that cast yourself (the check runs it on real ranks):

# %%
exercises = ch09_exercises.exercises()
exercises["cast"]

# %%
def fp8_cast(x):
    ...  # return (x8, scale)


exercises["cast"].submit(fp8_cast)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Here is one, written in a cell, and run through `torch._scaled_mm` against fp32. (`_scaled_mm` wants
# its second operand column-major, as `w8.t()` is here; this CPU build also accepts a row-major one,
# which CUDA's refuses, so keep the transpose when you move to a GPU.)

# %%
def my_scaled_cast(x, fmt=torch.float8_e4m3fn):
    top = torch.finfo(fmt).max
    amax = x.abs().max()
    scale = amax / top if amax > 0 else torch.tensor(1.0)  # an all-zero tensor: scale 1, never 0/0
    return (x / scale).clamp(-top, top).to(fmt), scale


a, w = torch.randn(64, 128), 0.02 * torch.randn(256, 128)
(a8, sa), (w8, sw) = my_scaled_cast(a), my_scaled_cast(w)
y = torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)  # real FP8 operands
assert w8.t().stride() == (1, 128)  # the second operand column-major, as CUDA's _scaled_mm requires
exact = a @ w.t()
gap = float((y.float() - exact).abs().max() / exact.abs().max())
print(f"a @ wᵀ in e4m3 against fp32: largest error {gap:.1%} of the largest entry")
assert gap < 4 * 2**-4  # a few of e4m3's unit roundoff (2⁻⁴)
assert torch.equal(my_scaled_cast(a)[0].float(), scaling.quantize(a)[0].float())  # = the library's

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's recipes, shown from their source: per-tensor and row-wise scales from the current
# amax (**current scaling**); **block-wise** scaling (DeepSeek-V3 technical report, §3.3), one scale
# per 1×128 tile of activations and per 128×128 block of weights; and, as history, **delayed
# scaling**, which takes the scale from the largest amax of earlier steps, so that no pass over the
# tensor precedes its cast.
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
current = [r["per tensor"], r["row-wise"], r["block-wise (1×128, 128×128)"]]
assert max(current) < 1.02 * min(current)  # at ×200 the three current recipes agree within 2 %
per = {x["outlier"]: x["error"] for x in rec["sweep"] if x["recipe"] == "per tensor"}
block = {x["outlier"]: x["error"] for x in rec["sweep"] if x["recipe"].startswith("block-wise")}
assert per[1e4] < 1.1 * block[1e4] and per[1e5] > 2 * block[1e5]  # per-tensor holds to ×10⁴, not ×10⁵

# %% [markdown] slideshow={"slide_type": "subslide"}
# Without a scale, outliers beyond 448 saturate (this torch clamps e4m3 at ±448; e5m2 goes to inf) and
# gradients of an LLM's size (~1e-6) all become zero. With a scale, at ×200 (the first table) the
# three current recipes agree within 2 %: e4m3's 17.8 binades hold the outliers
# and the bulk alike, so no recipe has anything to confine. They part only when one scale for the
# whole tensor pushes the bulk of the values below e4m3's smallest normal: in the sweep, per-tensor
# scaling holds up to ×10,000 and then fails, while row-wise and block-wise scales, each fitted to
# its own row or tile, keep the bulk in range. Delayed scaling trusts its history: a new, larger
# outlier saturates.
#
# **Delayed scaling is history.** It was TransformerEngine's FP8 recipe (`DelayedScaling`, whose
# amax history is 1,024 steps long by default, with a `margin` of powers of two of headroom; the
# history of 16 here only shortens the demonstration: any outlier above every remembered amax
# saturates). It saved one pass over the tensor before its cast. The field left it: torchao warned in
# v0.9.0 (2025) that delayed scaling was deprecated and then deleted it (pytorch/ao#1680, #1753),
# keeping current scaling (tensorwise, row-wise); DeepSeek-V3 (§3.3.2) computes the amax online for
# every tile and block, naming delayed scaling as what it does not do; TransformerEngine 2.x adds
# current scaling (`Float8CurrentScaling`), block-wise (`Float8BlockScaling`) and MXFP8
# (`MXFP8BlockScaling`) recipes beside it. Why: the saved pass bought little once the amax is fused
# into the cast (torchtitan measured delayed scaling no faster than current scaling on Llama 3 8B,
# pytorch/torchtitan#698, 2024); torchao's reasons were its complexity and that users chose current
# scaling for its accuracy; and a stale scale fails exactly when a tensor changes fastest, the
# outlier above.
#
# Try a recipe against outliers of another size (each choice runs the real FP8 matmul again):

# %%
ch09.recipe_calculator()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Training in FP8 on real ranks
#
# The FP8 linear layer as torchao's `Float8Linear` runs it with its tensorwise recipe: forward
# operands in e4m3, the incoming gradient in e5m2, every product through `_scaled_mm`; the weights
# stay fp32 (the master copy) and so does the optimizer:

# %%
show_source(linear.FP8Matmul)

# %% [markdown] slideshow={"slide_type": "subslide"}
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

# %% [markdown] slideshow={"slide_type": "subslide"}
# Each rank also kept, at the first and the last step, the output-gradient of every layer: the very
# tensors its `FP8Matmul` cast to e5m2 in the backward (the table under the figure). Their span, and
# both formats' errors under the same per-tensor scale, measured on every one of them:

# %%
grad_rows = runs["gradients"]
assert len(grad_rows) == 2 * 2 * 3  # 2 ranks × steps {0, last} × 3 layers, each one measured
assert all(r["e4m3"] < r["e5m2"] for r in grad_rows)  # this run's own gradients: e4m3 errs less

# %% [markdown] slideshow={"slide_type": "subslide"}
# On this run's gradients the chapter's own metric picks e4m3 at every layer, step and rank: scaled
# per tensor, most of their values sit where e4m3's third mantissa bit counts for more than the range
# e5m2 adds. The hybrid recipe's e5m2 is insurance for gradients wider than that, under one scale per
# tensor; a model, a loss and a recipe decide whether it is needed, which is why it is measured.

# %% [markdown]
# **What 40 steps cannot show.** FP8 runs that match bf16 for a while can diverge late: Fishman et al.
# ("Scaling FP8 training to trillion-token LLMs", 2024) saw instabilities appear only after hundreds of
# billions of tokens, from outliers that grow during training, and DeepSeek-V3 validated its recipe
# against bf16 on runs of about 1T tokens (relative loss error below 0.25 %, report §3.3). So
# practitioners run **loss-parity checks**: the FP8 run beside a bf16 run on the same data for as
# long as they can afford, and compare the curves, not just the first steps. A 40-step run shows the
# mechanics, not stability at scale.
#
# **What stays in bf16 or fp32.** FP8 covers the linear layers' matmuls. DeepSeek-V3 (§3.3.1) keeps
# the embedding, the output head, the MoE router, the normalisations and attention in their original
# precision; torchao converts `nn.Linear` modules only, and takes a filter to leave some of them (the
# output head, for one) in bf16. Four more details of a production recipe:
#
# * **Accumulation.** DeepSeek-V3 (§3.3.2) measured H800 tensor cores accumulating FP8 products with
#   about 14 bits, a maximum relative error near 2 % at K = 4,096, so it promotes partial sums to fp32
#   every 128 elements of K (`blockwise_mm` above adds its slices in fp32 the same way). torch exposes
#   the choice as `_scaled_mm(..., use_fast_accum=...)`; torchao uses fast accumulation for the
#   forward and not for the gradients' products by default.
# * **The backward's other axis.** A row-wise or 1×128 scale belongs to rows of K; the weight-gradient
#   product gᵀ·x contracts over the tokens instead, so the backward re-quantises x and g along the
#   other axis (DeepSeek-V3 §3.5.2 describes reading its 1×128 tiles back, transposing them and
#   re-quantising them as 128×1; torchao's row-wise recipe casts again for each product). Per-tensor scales need no such second cast.
# * **Optimizer state.** DeepSeek-V3 keeps AdamW's two moments in bf16 (§3.3.3), not fp32; fp32
#   master weights stay.
# * **MXFP8** (the OCP Microscaling formats, 2023; Blackwell GPUs run them in hardware): a block of 32
#   values shares one E8M0 scale, a power of two, so the scale is a shift and a 1×32 block is finer
#   than DeepSeek-V3's 1×128.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. FP8 communication
#
# Under FSDP2 (chapter 4) each rank holds a shard of every weight and all-gathers it before use. If the
# layer computes in FP8 anyway, gather the FP8 copy: half of bf16's bytes. torchao's
# `enable_fsdp_float8_all_gather` does that, **with tensorwise scaling only**: a row-wise weight is
# gathered in bf16 and cast afterwards. Each rank must cast with the *whole* weight's scale, so the
# ranks first share their amaxes: one small collective per parameter, unless they are computed
# together, which is why torchtitan calls torchao's `precompute_float8_dynamic_scale_for_fsdp` after
# the optimizer step, one all-reduce for all of them. Written on the course's ranks (e4m3 travels as
# `uint8`; here one amax gather per weight):

# %%
show_source(allgather.gather_fp8)

# %%
gathered = ch09.all_gather(world_sizes=(2, 4))

# %%
for row in gathered:
    assert row["equal"], row  # bit-equal to the unsharded FP8 model
    assert row["fp8"] == row["fp8_formula"] and row["bf16"] == row["bf16_formula"], row
    assert row["fp8"] < 0.51 * row["bf16"], row  # half, plus 4 bytes of amax per shard

# %% [markdown] slideshow={"slide_type": "subslide"}
# torchao 0.18.0 installs beside torch 2.13 and its `Float8Linear` runs forward and backward on this
# CPU (checked when this chapter was written); it is not a dependency of the course, and its FSDP2
# float8 all-gather is for GPUs.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. At cluster scale
#
# The datasheet doubles the matmuls' peak (H100 and H200: 1,979 dense FP8 TFLOP/s against 989 bf16,
# NVIDIA datasheets), but a step is not all matmuls. `costmodel.fp8.fp8_step` speeds up only a share s
# of chapter 7's compute term; the rest (attention, norms, the embedding, the head, the casts and amax
# passes) stays. Published end-to-end gains are smaller than 2×: torchao reports up to 1.5× for its
# float8 training in torchtitan on 512 GPUs (Llama 3.1 70B and 405B, 2024) and 1.34–1.43× for its
# row-wise recipe on 2,000 GPUs (2025; torchao's pre-training tutorial), and a NeMo benchmark
# (NVIDIA's performance summary, Nemotron-4 340B on H100s) measures FP8 steps at 0.69–0.72 of bf16's. With tensorwise scaling it also gathers ZeRO-3's
# parameters in FP8, and recomputes what overlap hides with FP8's shorter compute. Priced on H100's
# own links (NDR between nodes, NVLink 4 inside one), with the plan's overlap printed:

# %%
show_source(fp8_step)

# %%
scale = ch09.at_scale()

# %%
s = {x["label"]: x for x in scale["rows"]}
share = scale["share"]
ratio = s[f"1536 GPUs, fp8, s = {share}"]["terms"]["compute"] / s["1536 GPUs, bf16"]["terms"]["compute"]
assert abs(ratio - (1 - share + share * 989 / 1979)) < 1e-9, ratio  # only the matmul share sped up
assert all(r["dominant"] == "compute" for r in scale["rows"])  # on NDR, FP8 or not, compute is largest
assert scale["flips"][("ib-ndr", 0.0)] is None and scale["flips"][("ib-hdr", 0.0)] is not None

# %% [markdown] slideshow={"slide_type": "subslide"}
# At overlap 0 nothing is hidden: FP8's halved gathers shorten the step directly, and compute stays
# the largest term on H100's links for every share s. The answer flips only on A100's HDR links with
# s near 1 (printed above): that is where the gathers would outgrow FP8's compute. And FP8's step is
# about 1.3× bf16's at the share NeMo's measurement implies, not 2×. The model states do not shrink:
# fp32 master weights and Adam's two fp32 moments stay (DeepSeek-V3's bf16 moments would save 4 bytes
# per parameter).

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# Both run on 2 and 4 real ranks, each rank on its own tensors, as the cast of §2 did.

# %%
exercises["formats"]

# %%
def choose_format(x):
    ...  # return 'e4m3' or 'e5m2'


exercises["formats"].submit(choose_format)

# %%
exercises["blocks"]

# %%
def block_quantize(w):
    ...  # return (w8, scales)


exercises["blocks"].submit(block_quantize)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **formats** — §1's table from `torch.finfo`, the grids drawn, the measured errors on an activation-like tensor and on one built wider than e4m3 (asserted), §3's errors on this run's own gradients, and your format chooser judged on each rank's gradients.
# 2. **scaling** — §2's cast written in a cell through `_scaled_mm`, each recipe's error against fp32, saturation and underflow without a scale, the outlier sweep, delayed scaling's stale scale (asserted), and your cast and blocks.
# 3. **training** — §3's FP8 MLP on 2 ranks equal to one process, within e4m3's tolerance of fp32 beside bf16, and stalled without scaling (asserted); what 40 steps cannot show.
# 4. **communication and scale** — §4's FP8 all-gather bit-equal to the unsharded model at half the bytes, exactly the formula's, and §5's cost model with only the matmul share sped up, on H100's links, with where its answer flips.
#
# **On a real cluster:** FP8 matmuls with current scaling (torchao tensorwise or row-wise, TransformerEngine 2.x) or block-wise scales (DeepSeek-V3, MXFP8 on Blackwell), attention, norms, embedding and head in bf16, FSDP2 gathering FP8 weights under tensorwise scaling, fp32 master weights, and loss-parity runs against bf16 long enough to catch late divergence.
#
# Back to the [table of contents](README.md).
