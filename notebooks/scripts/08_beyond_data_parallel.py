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
# # Chapter 8 — What the talk left out: tensor, sequence, context and expert parallelism
#
# Every chapter so far split the *batch* (data parallelism, ZeRO) or the *stack of layers* (the
# pipeline). A single layer stayed whole on one device. Past a few billion parameters that stops
# working: one layer's weights, or one long sequence's **activations** (the outputs of its layers,
# kept for the backward), no longer fit, and the batch cannot grow forever (chapter 5). The answer
# is to split inside the layer. With t (or c, or n) ranks sharing one layer, each holds:
#
# | split | each rank holds | collective | paper |
# |---|---|---|---|
# | tensor | heads / t heads, ffn / t hidden units | all-reduce | Shoeybi et al., 2019 |
# | sequence | seq / t tokens between blocks | reduce-scatter, all-gather | Korthikanti et al., 2022 |
# | context | seq / c queries; keys and values go round a ring | send/recv | Liu et al., 2023 |
# | expert | E / n experts | all-to-all | Lepikhin et al., 2020; Fedus et al., 2021 |
#
# Here *heads* is the number of attention heads, *ffn* the width of the MLP's hidden layer and *seq*
# the number of tokens in a sequence. Every split runs here on real ranks and equals one process to
# float32 rounding; every collective's bytes are counted against its formula. Then they compose on
# one rank grid, and PyTorch's own stack (`DeviceMesh`, `parallelize_module`, `fully_shard`) trains
# the same model.

# %% [markdown]
# **After this chapter you can:**
#
# 1. write tensor parallelism's conjugate operators f and g as autograd Functions and build column- and row-parallel layers that train a transformer on 2 and 4 real ranks as one process does, with two all-reduces per block each way (§1, g exercise);
# 2. send tokens to experts on other ranks with an all-to-all, and read a mixture of experts' capacity, dropped tokens and load-balancing loss (§2, dispatch exercise);
# 3. turn each all-reduce into a reduce-scatter and an all-gather (sequence parallelism) and measure the activations per rank fall about t-fold; pass keys and values round a ring so that no rank holds the whole sequence, and derive and write the online softmax's merge of two partial results (§3–4, merge exercise);
# 4. compose data, pipeline and tensor parallelism on one rank grid of 8 ranks, set each group's counted bytes beside the cost model's terms, write a `parallelize_module` plan and check PyTorch's `DeviceMesh` stack against ours, pick a layout for a memory budget, and say why tensor parallelism stays inside a node (§5–6, plan and layout exercises).
#
# **Before it:** chapters 0, 2 and 4 (all-reduce, reduce-scatter, all-gather, FSDP2).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook (generated from the course's browser test); the exercises come on top.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_lib import show_source, warm_cluster
from lesson_lib.chapters import ch08, ch08_exercises, ch08_grid
from lesson_lib.milestones import tensor_parallel as tp
from lesson_lib.milestones.context_parallel import ring_attention
from lesson_lib.milestones.expert_parallel import moe
from lesson_lib.milestones.tensor_parallel import mappings

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Tensor parallelism: f and g
#
# Cut an MLP `y = gelu(x·W₁ᵀ)·W₂ᵀ` between t ranks. A PyTorch `Linear`'s weight is stored
# **[out_features, in_features]**: row i of W holds the weights of output feature i, column j those
# of input feature j. So the names refer to the product `x·Wᵀ`, not to W as stored:
#
# * **column-parallel** splits the *output features*: rank r keeps the r-th slice of W₁'s **rows**
#   (dim 0), its share of the hidden units, and computes those columns of `h = x·W₁ᵀ` from the whole x;
# * **row-parallel** splits the *input features*: rank r keeps the matching slice of W₂'s **columns**
#   (dim 1), which are rows of W₂ᵀ, and from its own hidden units computes a partial sum of the whole
#   output.
#
# Then `hᵣ = gelu(x·W₁,ᵣᵀ)` needs no communication at all, and `y = Σᵣ hᵣ·W₂,ᵣᵀ` is one sum over the
# ranks.
#
# Megatron-LM (Shoeybi et al., 2019) writes the two places where ranks meet as two operators that
# mirror each other:
#
# * **f** before the column layer: identity forward (every rank already has x); in the backward,
#   each rank's gradient of x is a partial sum through its own rows of W₁ (its hidden units), so
#   **all-reduce** it;
# * **g** after the row layer: **all-reduce** forward (each rank holds a partial sum); in the
#   backward every rank already holds the whole gradient of y, so identity.
#
# Here they are, as the library has them, written as autograd Functions: a forward and a backward
# that PyTorch's autograd calls. (picotron, a small educational trainer, calls them
# `CopyToModelParallelRegion` and `ReduceFromModelParallelRegion`.)

# %%
show_source(mappings.CopyToTensorRegion)

# %%
show_source(mappings.ReduceFromTensorRegion)

# %% [markdown] slideshow={"slide_type": "subslide"}
# And the MLP cut in two, written in a cell and run on 2 and 4 real ranks against the whole MLP:

# %%
def my_tensor_parallel_mlp(seed):
    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)  # the whole MLP, the same on every rank
    x = torch.randn(4, 8, requires_grad=True)
    w1 = fc1.weight.detach().chunk(t, 0)[rank].clone().requires_grad_()  # column: my hidden units
    b1 = fc1.bias.detach().chunk(t, 0)[rank].clone().requires_grad_()
    w2 = fc2.weight.detach().chunk(t, 1)[rank].clone().requires_grad_()  # row: their columns of fc2
    h = F.gelu(F.linear(tp.f(x), w1, b1))  # f: identity forward, all-reduce backward
    y = tp.g(F.linear(h, w2)) + fc2.bias.detach()  # g: all-reduce forward, identity backward
    y.square().sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    fc2(F.gelu(fc1(x_ref))).square().sum().backward()
    y = y.detach()
    with torch.no_grad():
        y_ref = fc2(F.gelu(fc1(x_ref)))
    return {"y": float((y - y_ref).abs().max()),
            "w1_grad": float((w1.grad - fc1.weight.grad.chunk(t, 0)[rank]).abs().max()),
            "x_grad": float((x.grad - x_ref.grad).abs().max())}


mlp_gaps = {t: warm_cluster(t).run(my_tensor_parallel_mlp, 0) for t in (2, 4)}
print("rank 0's largest differences from the whole MLP")
for t, gaps in mlp_gaps.items():
    print(f"t = {t}: " + ", ".join(f"{k} {v:.1e}" for k, v in gaps[0].items()))

# %%
assert all(v < 1e-5 for gaps in mlp_gaps.values() for g in gaps for v in g.values()), mlp_gaps

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library's layers are the same lines, built from a whole `nn.Linear`'s weights. Attention is
# split the same way: the query, key and value projections (q, k, v) are column-parallel, heads / t
# heads on each rank, with one f for the three, as in Megatron-LM's fused QKV (one matrix product for
# all three). The output projection is row-parallel. So a transformer block has **two all-reduces forward (g) and two backward (f)**.
# Each carries one activation of S = 4·seq·batch·d bytes (float32, d the model's width), and a ring
# sends 2(t−1)/t·S per rank.

# %%
show_source(tp.ColumnParallelLinear)
show_source(tp.RowParallelLinear)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The whole transformer (2 blocks, 4 heads, ffn 128), 3 SGD steps on 2 and 4 ranks, against one
# process; every collective goes through our ring, so its bytes are counted, not modelled:

# %%
tp_run = ch08.tensor_parallel(world_sizes=(2, 4))

# %%
for row in tp_run["rows"]:
    assert row["equal"], row  # losses, logits, gradients and parameters within float32 rounding
    for phase in ("forward", "backward"):  # two all-reduces per block each way, the formula's bytes
        assert row[phase]["calls"] == 2 * tp_run["cfg"].layers, row
        assert row[phase]["counted"] == row[phase]["formula"], row

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Memory per rank
#
# Tensor parallelism divides the blocks' weights by t, and the activations inside the split regions:
# q, k, v, the attention scores, the MLP's hidden layer. What lies between the regions stays whole on
# every rank: the layer norms and the **residual stream** (the running sum x + block(x) that carries
# each token from block to block). Below, one rank's allocations over one forward and backward,
# counted by torch's allocator (`PeakMemory`, chapter 4), on a wider model (d = 128):

# %%
mem = ch08.memory(world_size=4)

# %%
whole, tp4, sp4 = (r for r in mem["rows"])
assert tp4["params"] < whole["params"] / 3  # blocks / 4; embeddings, norms and head stay whole
assert whole["measured_peak"] > tp4["measured_peak"] > sp4["measured_peak"], mem["rows"]
assert whole["block_activations"] > tp4["block_activations"] > sp4["block_activations"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Expert parallelism: tokens travel to the experts
#
# A **mixture-of-experts** (MoE) layer (GShard, Lepikhin et al., 2020; Switch Transformer, Fedus et
# al., 2021) replaces the MLP by E MLPs, the **experts**, and a **router**: a small linear layer
# that gives each token a probability per expert and sends it to its top k.
#
# * **Top-1** (Switch): each token goes to one expert.
# * **Top-2** (GShard): to two. Their **gates**, the router's probabilities, are renormalized to sum
#   to 1 and weight the two outputs; every token's first choice is served before any second choice.
#
# Parameters grow E-fold, the compute per token only k-fold.
#
# With the experts spread over n ranks, each rank routes its own tokens and packs them into an
# `[experts, capacity, d]` buffer. Each expert takes at most `capacity = ⌈capacity_factor · k ·
# tokens / E⌉` tokens from a rank; the **capacity factor** is the slack above an even share. The rest
# are **dropped**: they skip the expert and pass through on the residual stream. Capacity exists
# because GShard and Switch ran under XLA on TPUs, where every buffer's shape is fixed before the
# step: an expert that is chosen more often than its share must drop tokens. Some of today's systems
# drop none: MegaBlocks (Gale et al., 2023) computes each expert's batch, whatever its size, as a
# block-sparse product ("dropless"), and DeepSeek-V3 (2024, §2.1.2) drops no token in training or
# inference. Others still drop: Megatron-Core offers a capacity factor with dropping
# (`--moe-expert-capacity-factor`; dropless when it is unset), and DeepSeek-V2 (2024) dropped tokens
# per device in training to bound each device's compute. Then one
# **all-to-all** (every rank sends a different chunk to every other) sends chunk j of the buffer to
# rank j, which holds those experts. A second all-to-all brings the outputs back.
#
# The router learns to balance the load through the **load-balancing loss** E · Σₑ fₑ·Pₑ, where fₑ
# is the share of tokens whose *first* choice is expert e (GShard's convention; top-k
# implementations such as Hugging Face's Mixtral count every assignment instead) and Pₑ the
# router's mean probability for e. It is 1 when the router is uniform, and near E only when every
# token goes to one expert *and* the router is sure of it. Because Pₑ is a mean probability, the loss
# is not a measure of imbalance by itself: all tokens on one expert with an unsure router score
# about 1, as the cell after the run shows. DeepSeek-V3 (2024, §2.1.2) balances mainly with a
# per-expert bias added to the routing scores, raised while an expert is under-loaded and lowered
# while it is over-loaded, and keeps a sequence-wise balancing loss with a very small weight only to
# stop a single sequence from being extremely unbalanced.

# %%
show_source(moe.route)

# %%
show_source(moe.moe_expert_parallel)

# %%
experts = ch08.experts(world_sizes=(2, 4), capacity_factors=(1.0, 1.25, 2.0), top_ks=(1, 2))

# %%
for row in experts["rows"]:
    assert row["equal"], row  # output and every gradient equal the single process's
    assert row["dropped"] == row["ref_dropped"] and row["counted"] == row["formula"], row
for k in (1, 2):  # top-1 and top-2: more slots, fewer dropped assignments
    mine = [r for r in experts["rows"] if r["ranks"] == 4 and r["top_k"] == k]
    drops = {r["capacity_factor"]: sum(r["dropped"]) for r in mine}
    assert drops[1.0] >= drops[1.25] >= drops[2.0] and drops[1.0] > drops[2.0], (k, drops)

# %%
# The balancing loss on hand-made routers, 64 tokens that all point the same way (x = e₀), E = 4:
E, x = 4, torch.eye(4)[[0] * 64]


def router(score):  # expert 0's score is `score`, the others' 0
    r = torch.zeros(4, E)
    r[0, 0] = score
    return r


aux = {name: moe.route(x, router(score), capacity=64)["aux"].item()
       for name, score in (("uniform", 0.0), ("sure, one expert", 20.0), ("unsure, one expert", 0.05))}
print({name: round(v, 3) for name, v in aux.items()})
assert abs(aux["uniform"] - 1) < 1e-6  # a uniform router: 1
assert aux["sure, one expert"] > 0.99 * E and aux["unsure, one expert"] < 1.1  # E only when sure

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Sequence parallelism: split what lies between the blocks
#
# Korthikanti et al. (2022) noticed that an all-reduce is a **reduce-scatter** (each rank ends with
# the sum of one slice) followed by an **all-gather** (each rank collects every slice): the same
# bytes (chapter 2). So end each block's parallel region with a reduce-scatter *along the sequence*
# instead of g, run the norm and the residual on seq / t tokens, and start the next region with an
# all-gather instead of f. In the backward each becomes the other, as f and g did.
#
# To really save the activations, the column layer keeps only its slice of the input for the backward
# and gathers it again there (the paper's §4.2.2; Megatron-LM overlaps that gather with compute):

# %%
show_source(mappings.LinearGatherSequence)

# %%
sp_run = ch08.sequence_parallel(world_sizes=(2, 4))

# %%
for row in sp_run["rows"]:
    assert row["equal"], row
    assert row["halves"] == row["tp_formula"], row  # reduce-scatters + all-gathers = the all-reduces' bytes
    assert row["regather"] == row["regather_formula"], row
t = mem["t"]  # §1's measurement: the blocks' saved activations, about t-fold smaller than whole
assert whole["block_activations"] / sp4["block_activations"] > 0.75 * t, mem["rows"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Context parallelism: ring attention
#
# Sequence parallelism still gathers the whole sequence for attention. At a million tokens one
# layer's keys and values in bf16 take 2 × 10⁶ × 4,096 × 2 bytes ≈ 16 GB at width 4,096, about 4 GB
# with grouped-query attention's 8 key/value heads of 32: they fit. What does not is every layer's
# activations together, and attention's compute, which grows with the square of the sequence.
# **Context parallelism** splits the sequence for attention too. **Ring attention** (Liu et al., 2023) keeps
# seq / c queries, keys and values on each of c ranks and passes the key/value blocks round a ring.
# At each of c − 1 steps a rank sends the block it holds to its neighbour while it folds that block
# into an **online softmax**: it keeps a running maximum, sum and output, and rescales them as new
# blocks arrive, so the result equals one softmax over all the keys. FlashAttention uses the same
# trick inside one GPU. No rank ever holds the whole score matrix.
#
# Two other designs send other things. **DeepSpeed-Ulysses** (Jacobs et al., 2023) switches from a
# sequence split to a head split with an all-to-all before attention, so each rank runs ordinary
# attention over the whole sequence for h / c heads, and a second all-to-all switches back (four per
# layer with the backward's; heads must divide by c). **All-gather context parallelism** (Llama 3,
# 2024) gathers every rank's keys and values, small under grouped-query attention, before attending
# with its own queries: one collective, not c − 1 steps, but no overlap of sending and computing.
#
# ### The online softmax, derived
#
# Take one query and its scores sⱼ = q·kⱼ/√d against the keys of two disjoint blocks A and B. What
# `block_update` keeps for block A is its **partial state**:
#
# * mₐ = max over j in A of sⱼ (the running maximum),
# * lₐ = Σ over j in A of exp(sⱼ − mₐ) (the sum, measured against mₐ),
# * oₐ = Σ over j in A of exp(sⱼ − mₐ)·vⱼ (the output, not yet divided by the sum),
#
# and the same for B. Over A ∪ B the softmax's output is Σⱼ exp(sⱼ)·vⱼ / Σⱼ exp(sⱼ). Measure every
# term against one maximum m = max(mₐ, m_b): for j in A, exp(sⱼ − m) = exp(sⱼ − mₐ)·exp(mₐ − m). So
#
# * l = lₐ·exp(mₐ − m) + l_b·exp(m_b − m),
# * o = oₐ·exp(mₐ − m) + o_b·exp(m_b − m),
# * the output is o / l, divided once at the end.
#
# Each factor exp(m_old − m_new) is at most 1, so nothing overflows, however large the scores. (In
# `block_update` the running state is A and the arriving block B, its own m_b = max of its scores.)
# The same state is often kept as a normalised output and its **log-sum-exp**, outₐ = oₐ / lₐ and
# lseₐ = mₐ + log lₐ = log Σ exp(sⱼ): then lse = log(exp(lseₐ) + exp(lse_b)) and out = exp(lseₐ −
# lse)·outₐ + exp(lse_b − lse)·out_b, which FlashAttention keeps for the backward. The merge exercise
# below asks for exactly this step.

# %%
show_source(ring_attention.block_update)
show_source(ring_attention.ring_attention)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The run records which key/value block each rank holds at each step, recognised from the tensors it
# received (the `watch` argument): the figure below is that record for 4 ranks. Each block moves one
# rank along per step, so rank r holds block (r − step) mod c; under causal masking only the blocks
# left of the diagonal are used whole.

# %%
ring = ch08.ring(world_sizes=(2, 4))

# %%
for row in ring["rows"]:
    assert row["gap"] <= row["tolerance"], row  # equal to one softmax over the whole sequence
    assert all(b == row["formula"] for b in row["counted"]), row  # (c − 1) K and V blocks per rank
    c = row["ranks"]  # every block passed one rank along per step: rank r held block (r − step) mod c
    assert row["held"] == [[(r - step) % c for step in range(c)] for r in range(c)], row["held"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# Under **causal masking** (each token attends only to the tokens before it), rank 0's queries need
# only its own block and rank c − 1's need all of them: the ranks' work is unequal. Real systems deal
# blocks out in a zig-zag (rank r takes blocks r and 2c − 1 − r) to balance it. We show the forward
# pass; the backward is a second ring that carries the gradients of K and V along with them.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. One grid for all of them
#
# In practice these compose. picotron builds every **process group** (the set of ranks one
# collective runs over) from one tensor of ranks, `torch.arange(world).view(dp, pp, tp)`. A rank's
# tensor-parallel group is its row: neighbouring ranks, the GPUs of one **node** (one machine). Its
# data-parallel group is its column. We pass that `Grid` explicitly to whatever needs a group, with no global singleton:

# %%
show_source(tp.Grid.__init__)

# %% [markdown] slideshow={"slide_type": "subslide"}
# dp = 2 × tp = 2 on 4 ranks: each **replica** (a full copy of the model, spread over its tp group)
# takes half the batch and averages its gradients over its data-parallel group. Inside a replica, the
# blocks are tensor-parallel.
#
# Then the same model under PyTorch's own stack, as torchtitan (PyTorch's reference trainer for large
# models) does it. Three pieces:
#
# * a **`DeviceMesh`**: the rank grid with named dimensions, `init_device_mesh("cpu", (2, 2),
#   mesh_dim_names=("dp", "tp"))`;
# * **DTensors**: tensors that know how they are spread over the mesh, one **placement** per mesh
#   dimension: `Shard(d)` (cut along tensor dimension d) or `Replicate()` (a whole copy);
# * `parallelize_module`, which turns the weights into DTensors by a plan: `ColwiseParallel` for q, k,
#   v and fc1 and `RowwiseParallel` for o and fc2 (our column and row layers, f and g included).
#   Then `fully_shard(block, mesh=mesh["dp"])` on each block and once more on the whole model
#   (FSDP2, chapter 4) shards over the data-parallel dimension, as torchtitan does: each block's
#   parameters are gathered just before it runs and freed after, which keeps memory to about one
#   block's whole parameters and lets the next block's gather overlap this one's compute.
#
# Once more with sequence parallelism, torchtitan's Llama plan: `SequenceParallel(sequence_dim=0)` on
# the norms, and `PrepareModuleInput` all-gathering the sequence into attention and the MLP, whose row
# layers reduce-scatter it back out (`RowwiseParallel(output_layouts=Shard(0))`). Write the block's
# part of it yourself before you read ours:

# %%
exercises = ch08_exercises.exercises()
exercises["plan"]

# %%
def block_plan():  # from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    ...  # {"attn.q": ColwiseParallel(), ...}: which layers read the whole activation?


exercises["plan"].submit(block_plan)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Ours, the whole model's:

# %%
show_source(tp.dtensor.plan)

# %%
composed = ch08.composed(dp=2, tp=2)

# %%
assert composed["equal"], composed  # data × tensor parallel = one process
assert composed["bytes"]["tp_all_reduce"] == composed["formula"]["tp_all_reduce"], composed
assert composed["bytes"]["dp_grad_all_reduce"] == composed["formula"]["dp_grad_all_reduce"], composed
assert composed["dtensor_gap"] <= composed["tolerance"]["params"], composed  # PyTorch's stack = ours
assert composed["dtensor_sp_gap"] <= composed["tolerance"]["params"], composed  # and with SequenceParallel
assert composed["param_numel"]["fsdp2+tp"] < composed["param_numel"]["ours"]  # FSDP2 also shards over dp

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### All three axes: data × pipeline × tensor on 8 ranks
#
# The grid's middle axis was left at 1. Now each of 2 pipeline stages holds one of the two blocks
# (the first also the embeddings, the last the head), tensor-parallel over 2 ranks, and 2 replicas
# split the batch: 2 × 2 × 2 = 8 ranks, the layout Narayanan et al. (SC21) call **PTD-P**
# (pipeline, tensor and data parallelism); DeepSpeed calls it **3D parallelism**.
#
# Inside a replica the stages run GPipe (chapter 3): the batch is cut into 2 **micro-batches**, and
# each stage runs all their forwards, then all their backwards. Each tp rank sends its own copy of the
# activation to its counterpart in the next stage (with sequence parallelism, its seq / t shard). The
# t copies are the same tensor, so Megatron-LM sends each rank 1/t of it and all-gathers it inside the
# next stage's node (SC21 §4.1, "scatter/gather"): the same bytes between stages as our sequence-
# parallel run, and what chapter 7's planner counts for every layout. The step, on every rank:

# %%
show_source(tp.three_d.gpipe_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Run with and without sequence parallelism. Beside each group's counted bytes (per step, from its
# busiest rank) stand the cost model's terms for the same layout, in float32 here (bf16 in chapter 7):
#
# * tp: chapter 7's `tensor_parallel_terms`;
# * dp: a ring all-reduce of the stage's gradients;
# * pp: an activation forward and its gradient back per micro-batch.
#
# Where eight ranks outnumber the cores they take turns, so we compare bytes and parameters, not
# times.

# %%
grid = ch08_grid.grid_3d(layouts=((2, 2, 2, False), (2, 2, 2, True)))

# %%
for row in grid["rows"]:
    assert row["equal"], row  # data × pipeline × tensor = one process
    for group in ("tp", "pp", "dp"):  # every group's counted bytes = the cost model's term
        assert row["counted"][group] == row["formula"][group], (group, row)
    assert row["params"] == row["param_formula"], row  # parameters per rank, by formula
plain, sp = grid["rows"]
assert sp["counted"]["pp"] * 2 == plain["counted"]["pp"]  # sequence parallel: each rank sends seq / t

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the cost model leaves out shows up as the sequence-parallel run's "not in the cost model":
# entering and leaving the sequence-parallel region once per micro-batch, and the norms' gradients
# summed across the tp group, a few percent of its tp bytes.
#
# And bytes are not time. At scale the pipeline also pays its **bubble**, the idle time while it fills
# and drains (chapter 3), and tp's bytes travel over the node's NVLink, not InfiniBand (§6). The layout
# exercise below picks a layout for a memory budget and by its **step time**, chapter 7's terms for
# the same layout: compute stretched by the bubble, tp's collectives on NVLink, pp's messages and dp's
# all-reduce (hidden behind the backward as far as it lasts) on InfiniBand. The layout that sends the
# fewest bytes is not always the fastest.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. At cluster scale
#
# Here every "link" is a memory copy between processes, and ranks that outnumber the cores take
# turns on them. A wall-clock figure would show that, not the algorithms, so we assert bytes and
# equality, never times.
#
# At scale the times decide where each kind of parallelism goes. A block's tensor-parallel
# all-reduces move its whole activation four times per step, and in the plain schedule they sit **on
# the critical path**: the next matrix product needs their result. Megatron-LM hides part of them:
# the backward's all-reduce of the input gradient runs while the weight gradient is computed, and
# with sequence parallelism the all-gathers and reduce-scatters are cut into chunks that overlap the
# matrix products (Wang et al., ASPLOS 2023; Megatron's `--tp-comm-overlap`, torchtitan's async
# tensor parallelism). The table counts them all as exposed: a bound, not a fact. Inside a node, **NVLink**
# (NVIDIA's GPU-to-GPU link) moves 300 GB/s each way per A100; between nodes one **InfiniBand HDR**
# port moves 25 GB/s (data/links.csv). Below, the α-β model of chapter 2 (a message costs a latency α
# plus its bytes times β, the time per byte) for one GPT-3-sized block (width 12,288, 2,048 tokens,
# bf16), against its compute at half an A100's peak:

# %%
scale = ch08.at_scale()
ch08.scale_calculator()

# %%
by = {(r["link"].split(" (")[0], r["t"]): r["comm_share"] for r in scale}
assert by[("NVLink 3", 8)] < 0.1 < by[("InfiniBand HDR", 8)], by  # t = 8 inside a node costs little

# %% [markdown] slideshow={"slide_type": "subslide"}
# So Megatron-LM keeps t ≤ 8, the GPUs of one NVLink node, and uses pipeline and data parallelism
# (chapters 3 and 4) between nodes: their traffic is smaller per byte of compute, or overlaps with it.
# Expert parallelism's all-to-all crosses nodes. DeepSeek-V3 bounds that traffic by **node-limited
# routing**: each token's experts are chosen from at most 4 nodes, so its all-to-all reaches at
# most 4 nodes whatever k is. (Capacity, §2, is a different matter: fixed shapes and load imbalance;
# DeepSeek-V3 drops no token, while Megatron-Core's capacity factor and DeepSeek-V2 drop some.) Context parallelism overlaps each ring step with a block of attention, so
# it pays whenever a block's attention takes longer than sending it.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# These four and §5's plan run on real ranks, and the checker judges what they computed and sent,
# against the single process or the formulas.

# %%
exercises["g"]

# %%
class MyG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ...  # every rank holds a partial sum; return the whole sum

    @staticmethod
    def backward(ctx, grad):
        ...  # the gradient of x


exercises["g"].submit(MyG)

# %%
exercises["dispatch"]

# %%
def exchange(buf):
    ...  # chunk j of buf's dim 0 to rank j; chunk i of the result from rank i


exercises["dispatch"].submit(exchange)

# %%
exercises["merge"]

# %%
def merge(m_a, l_a, o_a, m_b, l_b, o_b):
    ...  # §4's derivation: the state (m, l, o) over both key blocks


exercises["merge"].submit(merge)

# %%
exercises["layout"]

# %%
formulas = tp.formulas  # stage_params(cfg, tp, pp, stage), step_time(wide, dp, pp, tp, micro)
cfg, wide = ch08_grid.case_cfg(), ch08_grid.wide_cfg()  # as it runs here; at GPT-3's width
my_layout = ...  # (dp, pp, tp)
exercises["layout"].submit(my_layout)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **f and g** — §1's MLP written in a cell and the transformer on 2 and 4 ranks (equal to one process, two all-reduces per block each way, the formula's bytes, asserted), and your g.
# 2. **experts** — §2's all-to-all MoE equal to one process with the same drops, its bytes counted, fewer tokens dropped as the capacity factor grows (asserted), and your dispatch.
# 3. **sequence and context** — §3's reduce-scatter + all-gather with the all-reduces' bytes, §1's measured activations about t-fold smaller, §4's ring attention equal to one softmax with the blocks each rank held recorded, and your merge.
# 4. **one grid, and scale** — §5's dp × tp grid and PyTorch's `DeviceMesh` stack equal to ours, your `parallelize_module` plan, the dp × pp × tp grid on 8 ranks equal to one process with every group's bytes equal to the cost model's terms (asserted), your layout for a memory budget, and §6's table of a block's all-reduces on NVLink against InfiniBand.
#
# **On a real cluster:** tensor (and sequence) parallelism inside a node, pipeline and data parallelism between nodes, experts and context where the model or the sequence demands them — PTD-P in Narayanan et al.'s words ("3D" in DeepSpeed's), today 4D or 5D, all built from one rank grid.
#
# Back to the [table of contents](README.md).
