"""Chapter 8's ``parallelize_module`` exercise (notebooks/08_beyond_data_parallel.ipynb, §5): the
learner's plan for one block of :class:`~.model.Transformer`, applied to every block on t = 2 and 4
ranks, judged by what it shards (each weight's placement and local shape), by each layer's output in
the first forward, and by 3 SGD steps against one process.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from ..exercises import Exercise, Property, Verdict, judge, on_ranks, solution_text
from ..milestones.tensor_parallel import dtensor, tolerances, train
from ..milestones.tensor_parallel.model import Block, Config, Transformer, batch, loss_fn

ROLES = {"attn.q": 0, "attn.k": 0, "attn.v": 0, "attn.o": 1, "mlp.fc1": 0, "mlp.fc2": 1}
"""Each linear layer of a block and the weight dimension Megatron-LM cuts: 0 column-wise, 1 row-wise."""


def _placement(p) -> tuple:
    if not hasattr(p, "placements"):
        return ("whole",)
    kind = p.placements[0]
    return ("shard", kind.dim) if kind.is_shard() else ("replicate",) if kind.is_replicate() else ("partial",)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _full_plan(block_plan: dict, cfg: Config) -> dict:
    from torch.distributed.tensor.parallel import SequenceParallel

    full = {f"blocks.{i}.{k}": style for i in range(cfg.layers) for k, style in block_plan.items()}
    if any(isinstance(s, SequenceParallel) for s in block_plan.values()):  # the model's ends, cut by seq
        full.update({k: s for k, s in dtensor.plan(cfg, True).items() if k in ("blocks.0", "ln", "head")})
    return full


def plan_job(block_plan: dict, cfg: Config) -> dict:
    """On every rank: ``parallelize_module`` with the plan on a 1-D mesh of all ranks; each layer's
    weight placement and local shape, each layer's first output, then ``cfg.steps`` SGD steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # shapes that do not
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # fit: said once, in the verdict
    model = parallelize_module(Transformer(cfg), mesh, _full_plan(block_plan, cfg))
    block = model.blocks[0]
    held = {name: {"placement": _placement(block.get_submodule(name).weight),
                   "local": tuple(_local(block.get_submodule(name).weight).shape)} for name in ROLES}
    first: dict = {}
    def keep(name):  # a forward hook that returns nothing: a returned value would replace the output
        def hook(module, args, out) -> None:
            first.setdefault(name, _local(out).detach().clone())
        return hook

    hooks = [block.get_submodule(name).register_forward_hook(keep(name)) for name in ROLES]
    sgd, losses = torch.optim.SGD(model.parameters(), lr=cfg.lr), []
    try:
        for step in range(cfg.steps):
            tokens, targets = batch(cfg, step)
            loss = loss_fn(_local(model(tokens)), targets)
            loss.backward()
            sgd.step()
            sgd.zero_grad()
            for h in hooks:
                h.remove()
            losses.append(float(_local(loss).detach()))
    except Exception as e:  # a plan whose layouts do not fit together: the message names the shapes
        return {"held": held, "first": first, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
              for n, p in model.named_parameters()}
    return {"held": held, "first": first, "losses": losses, "params": params}


def _sharding(outs: list[dict]) -> str | None:
    t = len(outs)
    whole = {n: tuple(m.weight.shape) for n, m in Block(Config.tiny()).named_modules() if n in ROLES}
    for name, dim in ROLES.items():
        got, shape = outs[0]["held"][name], whole[name]
        col = name in ("attn.q", "attn.k", "attn.v", "mlp.fc1")
        want = list(shape)
        want[dim] //= t
        if got["placement"] == ("whole",):
            style = "ColwiseParallel()" if col else "RowwiseParallel()"
            return (f"{name} is not in your plan, so its weight {list(shape)} stays whole on every rank: "
                    "each "
                    "rank holds and computes all of it, t times its share (the numbers can still come out "
                    f"right: a replicated layer is correct, only wasteful). Add \"{name}\": {style}")
        if got["placement"] == ("shard", 1 - dim) and col:
            return (f"{name} is row-wise: its weight [out_features, in_features] = {list(shape)} is cut "
                    "along "
                    f"in_features (dim 1, {list(got['local'])} per rank), which needs its input already "
                    "cut — but "
                    f"{name} reads the whole activation. Column-wise (ColwiseParallel) cuts the output "
                    "features, "
                    f"the rows of W (dim 0): {want} per rank")
        if got["placement"] == ("shard", 1 - dim):
            return (f"{name} is column-wise: its weight {list(shape)} is cut along out_features (dim 0, "
                    f"{list(got['local'])} per rank) — but its input is already cut (heads or hidden "
                    "units, by "
                    "the column layer before it). Row-wise (RowwiseParallel) cuts the input features, the "
                    f"columns of W (dim 1): {want} per rank, and all-reduces the partial sums")
        if got["placement"] != ("shard", dim) or list(got["local"]) != want:
            return (f"{name}'s weight is {got['placement']}, {list(got['local'])} per rank; it should be "
                    f"{want}")


def _runs(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        if "error" in o:
            return f"rank {r}'s training with your plan raised {o['error']}"


def _equal(cfg: Config):
    def test(outs: list[dict]) -> str | None:
        t, ref = len(outs), train.reference(cfg)
        model, whole = Transformer(cfg), {}
        with torch.no_grad():
            x = model.blocks[0].ln1(model.embed(batch(cfg, 0)[0]))
            whole["attn.q"], whole["attn.k"], whole["attn.v"] = (model.blocks[0].attn.get_submodule(n)(x)
                                                                  for n in "qkv")
        for name in ("attn.o", "mlp.fc1", "mlp.fc2"):
            model.blocks[0].get_submodule(name).register_forward_hook(
                lambda m, args, out, name=name: whole.update({name: out.detach()}))
        model(batch(cfg, 0)[0])
        rel = tolerances.transformer_rel(cfg)
        for r, o in enumerate(outs):
            for name, dim in ROLES.items():
                want, got = whole[name], o["first"][name]
                if dim == 0:
                    want = want.chunk(t, -1)[r]  # a column layer: my slice of its outputs
                elif got.shape[0] * t == want.shape[0]:
                    want = want.chunk(t, 0)[r]  # sequence parallel: my slice of the sequence
                tol = rel * float(want.abs().max())
                if got.shape != want.shape or not torch.allclose(got, want, atol=tol):
                    return (f"blocks.0.{name}'s output on rank {r} differs from one process's (shape "
                            f"{tuple(got.shape)}, one process's slice {tuple(want.shape)}): check its "
                            "input_layouts and output_layouts — a row-wise layer must hand on the summed "
                            "output (Replicate, or Shard(0) under sequence parallelism), never Partial")
        tol = tolerances.transformer(cfg, ref)
        for r, o in enumerate(outs):
            gap = max(float((o["params"][n] - ref["params"][n]).abs().max()) for n in ref["params"])
            if gap > tol["params"]:
                return (f"rank {r}'s parameters after {cfg.steps} SGD steps differ from one process's by "
                        f"{gap:.2g}")
    return test


def check_plan(answer) -> Verdict:
    from torch.distributed.tensor.parallel import ParallelStyle

    plan = answer() if callable(answer) else answer
    if not isinstance(plan, dict) or not all(isinstance(s, ParallelStyle) for s in plan.values()):
        return Verdict(False, "submit a dict {\"attn.q\": ColwiseParallel(), …}: names inside one block → "
                              "ParallelStyle objects (or a function returning it)")
    names = {n for n, _ in Block(Config.tiny()).named_modules() if n}
    unknown = [k for k in plan if k not in names]
    if unknown:
        listed = ", ".join(sorted(names))
        return Verdict(False, f"{unknown[0]!r} is not a module of a block; a block has {listed} (the check "
                              "applies your plan to every block)")
    cfg = Config.tiny()
    cases = [on_ranks(f"t = {n}", n, plan_job, plan, cfg, timeout_s=30) for n in (2, 4)]
    return judge(cases, [
        Property("every linear layer is sharded as Megatron-LM cuts it", _sharding),
        Property("training runs with the plan", _runs),
        Property(f"every layer's output and {cfg.steps} SGD steps equal one process's", _equal(cfg))],
        done="parallelize_module inserted f and g for you: ColwiseParallel's backward and RowwiseParallel's "
             "forward all-reduce.")


def block_plan():
    """The answer: q, k, v and fc1 column-wise, o and fc2 row-wise (f and g come with them)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}


def plan_exercise() -> Exercise:
    return Exercise(
        key="plan", title="write a parallelize_module plan for a block",
        prompt="Write <code>block_plan()</code>, returning the tensor-parallel plan of one block of the "
               "chapter's "
               "Transformer: a dict from the names inside a block (<code>attn.q</code>, <code>attn.k</code>, "
               "<code>attn.v</code>, <code>attn.o</code>, <code>mlp.fc1</code>, <code>mlp.fc2</code>; "
               "<code>ln1</code>, <code>ln2</code>, <code>attn</code> and <code>mlp</code> for sequence "
               "parallelism) to <code>ColwiseParallel()</code>, <code>RowwiseParallel()</code>, … The check "
               "applies it to every block with <code>parallelize_module</code> on t = 2 and 4 ranks, "
               "reads each "
               "weight's placement, and trains 3 SGD steps against one process.",
        check=check_plan,
        hint="A Linear's weight is [out_features, in_features]. Which layers read the whole activation, and "
             "which read one already cut by heads or hidden units?",
        solution=solution_text(block_plan), reference=lambda: block_plan)
