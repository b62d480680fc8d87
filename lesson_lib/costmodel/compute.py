"""FLOPs and activation memory of one transformer step under each recomputation policy (chapter 7).

Two FLOP counts, labelled wherever they are printed:

* **model FLOPs** — what the model needs, whatever the implementation recomputes: 6·Ψ per token for
  the matmuls (Kaplan et al., 2020) plus 12·L·h·s for attention's scores and weighted sum. Model FLOPs
  per second over peak is PaLM's model FLOPs utilisation, **MFU** (Chowdhery et al., 2022, App. B).
* **hardware FLOPs** — what the device executes: model FLOPs plus the recomputed forward. Under full
  recomputation that is SC21's Eq. 3, 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) (Narayanan et al., 2021);
  under selective recomputation Korthikanti et al. (2022) count s/(3h) for s/(6h). Per second over
  peak: hardware FLOPs utilisation, **HFU**.
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")


def model_flops_per_token(params: float, layers: int, hidden: int, seq: int) -> float:
    """PaLM's model FLOPs per token: 6·N + 12·L·h·s (Chowdhery et al., 2022, App. B: 6N + 12·L·H·Q·T,
    H·Q = h heads × head size). ``params``: the parameters a token meets (active, for a MoE)."""
    return 6 * params + 12 * layers * hidden * seq


def recompute_flops_per_token(policy: str, params: float, layers: int, hidden: int, seq: int,
                              vocab: int = 0, attention: bool = True) -> float:
    """Hardware FLOPs per token recomputation adds. full: the layers' forward again, 2·(Ψ − V·h) +
    4·L·h·s (SC21 Eq. 3 against model FLOPs: the logit layer is not recomputed); selective: the
    attention core, 12·L·h·s as Korthikanti et al. (2022) count it (s/(3h) for s/(6h); their Table 5's
    HFU over MFU, 52.8 % / 51.4 % for GPT-3 175B); none: 0. ``attention=False`` leaves attention's
    FLOPs out (the 6·Ψ / 8·Ψ count of chapter 7's first model)."""
    if policy not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {policy!r}")
    core = layers * hidden * seq if attention else 0.0
    if policy == "full":
        return 2 * (params - vocab * hidden) + 4 * core
    return 12 * core if policy == "selective" else 0.0


def sc21_eq3_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """SC21's Eq. 3: FLOPs of one iteration with full recomputation, 96·B·s·l·h²·(1 + s/(6h) +
    V/(16·l·h)) (Narayanan et al., 2021, §5.1)."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def utilisation(flops_per_step: float, step_s: float, devices: int, peak_flops: float) -> float:
    """FLOPs per second over the devices' peak: MFU with model FLOPs, HFU with hardware FLOPs."""
    return flops_per_step / step_s / (devices * peak_flops)


def layer_activation_bytes(seq: int, micro: float, hidden: int, heads: int, tensor: int = 1,
                           sequence_parallel: bool = False, policy: str = "none",
                           flash_attention: bool = False, kv_heads: int = 0, dropout: bool = True) -> float:
    """One layer's saved 16-bit activations per micro-batch (Korthikanti et al., 2022, Table 2):

    ======================  ===========================
    none                    s·b·h·(10 + 24/t + 5·a·s/(h·t))   (10 → 10/t with sequence parallelism)
    selective               s·b·h·(10 + 24/t)                  (34/t with sequence parallelism)
    full                    2·s·b·h                            (÷ t with sequence parallelism)
    ======================  ===========================

    Selective recomputation drops the 5·a·s/h of attention's scores, softmax and dropout; FlashAttention
    never writes the s×s scores to memory either (Dao et al., 2022: memory linear in s), so with it
    the term is gone under every policy.

    Grouped-query attention (Ainslie et al., 2023) with ``kv_heads`` = a_kv < a: of the 24/t, the
    keys and values attention keeps (2·s·b·h each, Korthikanti's count) shrink to a_kv/a of that, so
    24/t becomes (20 + 4·a_kv/a)/t; the queries, the projection's input and the MLP's 16/t stay.

    Korthikanti's counts keep dropout's masks: one byte per element after attention and after the
    MLP (2 of the 10), and of the scores a mask (a·s²·b bytes) and dropout's output (2·a·s²·b) beside
    the softmax's (2·a·s²·b). A model trained without dropout (``dropout=False``: Llama, Nemotron-4)
    keeps only the softmax's output: 10 → 8 and 5·a·s/h → 2·a·s/h."""
    if policy not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {policy!r}")
    if not 0 <= kv_heads <= heads:
        raise ValueError(f"kv_heads must be between 0 (= heads) and heads = {heads}, got {kv_heads!r}")
    sbh = seq * micro * hidden
    if policy == "full":
        return 2 * sbh / (tensor if sequence_parallel else 1)
    between = (10 if dropout else 8) / (tensor if sequence_parallel else 1)
    scores = 0.0 if (policy == "selective" or flash_attention) else \
        (5 if dropout else 2) * heads * seq / (hidden * tensor)
    kv = (kv_heads or heads) / heads  # K and V at a_kv/a of the queries' size
    return sbh * (between + (20 + 4 * kv) / tensor + scores)


def pipeline_layers_held(layers: int, stages: int, microbatches: float, chunks: int = 1) -> float:
    """Layer-micro-batches of activations the first pipeline stage holds at its peak: 1F1B keeps
    min(P, M) micro-batches of its L/P layers (Narayanan et al., 2021); the interleaved schedule
    L·(1 + (P−1)/(P·v)) once M ≥ P (Korthikanti et al., 2022, §4.2.3)."""
    held = layers / stages * min(stages, microbatches)
    if chunks > 1:
        held *= 1 + (stages - 1) / (stages * chunks)
    return held
