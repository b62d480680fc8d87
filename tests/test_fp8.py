"""Chapter 9's library against references that share no code with it: torch's own float8 casts,
hand-worked values, fp32 math written out; ranks against one process; bad input named."""

import math

import pytest
import torch

from lesson_lib import warm_cluster
from lesson_lib.costmodel import Plan
from lesson_lib.costmodel.fp8 import fp8_step, matmul_share_for
from lesson_lib.milestones.fp8 import allgather, errors, formats, scaling, tolerances, train

pytestmark = pytest.mark.ch9
E4M3 = torch.float8_e4m3fn


def test_formats_hand_worked():
    e4m3, e5m2 = formats.describe("e4m3"), formats.describe("e5m2")
    assert (e4m3["max"], e4m3["smallest_subnormal"], e4m3["eps"]) == (448.0, 2.0**-9, 2.0**-3)
    assert (e5m2["max"], e5m2["smallest_subnormal"], e5m2["eps"]) == (57344.0, 2.0**-16, 2.0**-2)
    g = formats.grid("e4m3")
    assert len(g) == 127 and g[1] == 2.0**-9 and g[-1] == 448 and float(g[g > 1][0]) == 1.125


def test_bad_input_names_the_parameter():
    for call, name in (
        (lambda: formats.dtype_of("e3m4"), "fmt"),
        (lambda: formats.grid("bf16"), "name"),
        (lambda: scaling.DelayedScaling(0), "history"),
        (lambda: allgather.gather_bytes(10, 3, "fp8"), "numel"),
        (lambda: train.Config(batch=63).check(2), "batch"),
    ):
        with pytest.raises(ValueError, match=name):
            call()


def test_scaled_cast_against_torchs_own_cast():
    x = torch.tensor([[0.0, 1.0, -3.0, 1000.0]])
    x8, s = scaling.quantize(x)
    assert abs(float(s) - 1000.0 / 448) <= 1e-6 * 1000.0 / 448
    s = torch.tensor(float(s))
    assert torch.equal(x8.float(), (x / (1000.0 / 448)).to(E4M3).float())
    z8, zs = scaling.quantize(torch.zeros(3))
    assert float(zs) == 1.0 and torch.equal(z8.float(), torch.zeros(3))
    assert float(scaling.saturating_cast(torch.tensor([1e6]), torch.tensor(1.0)).float()) == 448.0


def test_blockwise_product_equals_its_dequantized_fp32_product():
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(8, 256, generator=g), torch.randn(128, 256, generator=g)
    a8, sa = scaling.quantize_blocks(a, 1, 128)
    w8, sw = scaling.quantize_blocks(w, 128, 128)
    deq_a = torch.cat([a8[:, k * 128 : (k + 1) * 128].float() * sa[:, k : k + 1] for k in range(2)], 1)
    deq_w = torch.cat([w8[:, k * 128 : (k + 1) * 128].float() * sw[0, k] for k in range(2)], 1)
    assert torch.allclose(scaling.blockwise_mm(a, w), deq_a @ deq_w.t(), rtol=1e-5, atol=1e-4)


def _through(x: torch.Tensor, fmt) -> torch.Tensor:
    """``x`` as a per-tensor scaled cast carries it, by torch's own cast: scale amax / max(fmt)."""
    s = x.abs().max() / torch.finfo(fmt).max
    return (x / s).to(fmt).float() * s


@pytest.mark.numerics
def test_fp8_matmul_is_the_product_of_what_the_casts_carry_forward_and_backward():
    # The ranks' FP8 training and its one-process reference (below) share this layer, so it is checked
    # here against the products of torch-cast operands: forward x·wᵀ in e4m3, backward the incoming
    # gradient in e5m2 against the same e4m3 copies (Micikevicius et al., 2022). catches: a gradient
    # cast to e4m3, a scale applied twice or not at all, a product against the unquantized copy
    from lesson_lib.milestones.fp8.linear import FP8Matmul

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(8, 32, generator=g), torch.randn(16, 32, generator=g)
    grad = torch.randn(8, 16, generator=g)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = FP8Matmul.apply(xr, wr, True)
    y.backward(grad)
    x8, w8, g8 = _through(x, E4M3), _through(w, E4M3), _through(grad, torch.float8_e5m2)
    tol = dict(rtol=2**-7, atol=1e-3)  # the products come back through bf16 (8 bits of mantissa)
    torch.testing.assert_close(y, x8 @ w8.t(), **tol)
    torch.testing.assert_close(xr.grad, g8 @ w8, **tol)
    torch.testing.assert_close(wr.grad, g8.t() @ x8, **tol)


def test_format_errors_are_torchs_casts_by_hand():
    # by hand: e4m3 scaled so 1.0 → 448 holds 1, 1/3 (→ 149.33 → 144 or 152: e4m3 steps by 8 there)
    x = torch.tensor([1.0, 1 / 3, -0.01])
    row = errors.format_errors({"x": x})[0]
    want = {f: float((((x / (1 / torch.finfo(f).max)).to(f).float() * (1 / torch.finfo(f).max) - x).abs()
                      / x.abs()).mean()) for f in (E4M3, torch.float8_e5m2)}
    assert row["e4m3"] == pytest.approx(want[E4M3]) and row["e5m2"] == pytest.approx(want[torch.float8_e5m2])
    assert row["span"] == pytest.approx(math.log2(100))
    acts, wide = errors.format_choice(0)
    assert acts["e4m3"] < acts["e5m2"] and wide["e5m2"] < wide["e4m3"]


def test_captured_output_gradients_are_what_the_backward_receives():
    # the layer-2 output-gradient of an MSE loss is 2·(y − target)/numel, written out here
    cfg = train.Config(steps=2, capture_steps=(1,))
    outs = warm_cluster(2).run(train.train_job, cfg, "fp32")
    assert all(list(o["output_grads"]) == [1] and len(o["output_grads"][1]) == 3 for o in outs)
    model, opt = train._model(cfg, "fp32")
    (x0, y0), (x1, y1) = train.batches(cfg)
    for r, o in enumerate(outs):
        model, opt = train._model(cfg, "fp32")
        for p in model.parameters():  # step 0 on the whole batch = the ranks' averaged step
            p.grad = None
        torch.nn.functional.mse_loss(model(x0), y0).backward()
        opt.step()
        part = slice(r * 32, (r + 1) * 32)
        out = model(x1[part])
        want = 2 * (out - y1[part]) / out.numel()
        torch.testing.assert_close(o["output_grads"][1][2], want.detach(), rtol=1e-4, atol=1e-7)


def _h100_70b(overlap, link="ib-hdr"):
    # every input the hand-worked numbers use is pinned here, not taken from Plan's defaults
    return Plan(params=70e9, tokens=1.4e12, devices=1536, device="h100-sxm", tensor=8, zero=3, micro_batch=0,
                overlap=overlap, link=link, intra_link="nvlink3", efficiency=0.5, attention_flops=False,
                recompute="full", batch_tokens=1536 * 2048, seq_len=2048, layers=0, hidden=0, compression=1.0)


def test_fp8_gathers_are_hidden_as_step_time_hides_them_by_hand():
    # 70B on 1,536 H100s, t = 8, ZeRO-3, one micro-batch, HDR (25 GB/s, 5 µs), every matmul at 1,979 TFLOP/s.
    # GPT-3's shape for 70B: L = round((70e9 / (12·128²))^(1/3)) = 71; d = 1536 / 8 = 192; Ψ/t = 8.75e9.
    # compute: 8Ψ FLOPs per token (full recomputation) × 1536 × 2048 tokens / (1536 × 1979e12 × 0.5)
    compute = 8 * 70e9 * 2048 / (1979e12 * 0.5)  # 1.15905 s
    # FP8 gathers, twice per micro-batch at 1 byte, bf16 reduce-scatter: 191/192 · (2·8.75e9 + 2·8.75e9) bytes
    bw = 191 / 192 * (2 * 8.75e9 + 2 * 8.75e9) / 25e9  # 1.39271 s
    lat = 3 * 71 * 191 * 5e-6  # 0.20342 s: 3 ring collectives of 191 steps per block
    hidden = compute / (bw + lat)  # overlap 1: compute hides 72.6 % of the exchange
    out = fp8_step(_h100_70b(1.0), matmul_share=1.0)["fp8"]
    assert out["compute"] == pytest.approx(compute, rel=1e-9)
    assert out["bandwidth"] == pytest.approx((1 - hidden) * bw, rel=1e-6)  # 0.3814 s, not 1.03 s
    assert out["latency"] == pytest.approx((1 - hidden) * lat, rel=1e-6)
    exposed = 1.39271 + 0.20342 - 1.15905  # the exchange less the compute that hides it: 0.43708 s
    assert out["bandwidth"] + out["latency"] == pytest.approx(exposed, abs=2e-5)
    zero = fp8_step(_h100_70b(0.0), matmul_share=1.0)["fp8"]  # overlap 0: the whole FP8 exchange shows
    assert zero["bandwidth"] == pytest.approx(bw, rel=1e-6)
    assert zero["latency"] == pytest.approx(lat, rel=1e-6)


def test_fp8_speeds_up_only_the_matmul_share_and_rowwise_gathers_bf16():
    bf16_compute = 8 * 70e9 * 2048 / (989e12 * 0.5)  # 2.31927 s at the bf16 peak
    out = fp8_step(_h100_70b(0.0), matmul_share=0.6)
    assert out["fp8"]["compute"] == pytest.approx(bf16_compute * (0.4 + 0.6 * 989 / 1979), rel=1e-9)
    assert out["bf16"]["compute"] == pytest.approx(bf16_compute, rel=1e-9)
    row = fp8_step(_h100_70b(0.0), matmul_share=0.6, recipe="rowwise")["fp8"]
    assert row["bandwidth"] == pytest.approx(191 / 192 * 6 * 8.75e9 / 25e9, rel=1e-6)  # bf16 gathers
    assert matmul_share_for(0.70) == pytest.approx(0.30 / (1 - 989 / 1979))
    with pytest.raises(ValueError, match="matmul_share"):
        fp8_step(_h100_70b(0.0), matmul_share=1.5)


def test_chapter_9_at_scale_stays_compute_bound_on_ndr_and_flips_on_hdr_by_hand():
    # Chapter 9 §5's claim, worked by hand: a 70B model, ZeRO-3 over d = 1,536 / 8 nodes' worth of
    # data parallelism, overlap 0. Each step gathers the parameters twice (forward, backward) and
    # reduce-scatters the gradients once, each moving (d − 1)/d of a rank's Ψ/t over the ring:
    # bf16 2 + 2 + 2 bytes, FP8 tensorwise 1 + 1 + 2. FP8's compute is bf16's × (1 − s + s·989/1979).
    from lesson_lib.chapters.ch09_scale import _plan, flip_share
    from lesson_lib.costmodel.terms import links

    n, psi, t = 1536, 70e9, 8
    d = n // t
    g = 989 / 1979
    flips = {}
    for link, intra in (("ib-ndr", "nvlink4"), ("ib-hdr", "nvlink3")):
        plan = _plan(n, psi, 0.0, link, intra)
        per_byte = (d - 1) / d * psi / t * links()[link]["beta"]  # seconds per byte of each parameter
        out = fp8_step(plan, 1.0)
        assert out["bf16"]["bandwidth"] == pytest.approx(6 * per_byte, rel=1e-9)
        assert out["fp8"]["bandwidth"] == pytest.approx(4 * per_byte, rel=1e-9)
        compute = out["bf16"]["compute"]
        # the smallest s (in hundredths) at which FP8's compute falls below its gathers' time
        hand = next((k / 100 for k in range(101) if compute * (1 - k / 100 * (1 - g)) < 4 * per_byte), None)
        assert flip_share(plan) == hand
        flips[link] = hand
    assert flips["ib-ndr"] is None  # on H100's own links compute stays largest at every share
    assert flips["ib-hdr"] is not None and flips["ib-hdr"] > 0.5  # on A100's, only near s = 1


@pytest.mark.numerics
def test_fp8_training_on_ranks_equals_one_process_and_sits_near_fp32():
    cfg = train.Config(steps=10)
    fp32 = train.reference(cfg, "fp32", 2)["losses"]
    for n in (2, 4):
        outs = warm_cluster(n).run(train.train_job, cfg, "fp8")
        ref = train.reference(cfg, "fp8", n)["losses"]
        assert max(abs(a - b) for a, b in zip(outs[0]["losses"], ref)) <= tolerances.data_parallel(ref, n)
    assert max(abs(a - b) for a, b in zip(ref, fp32)) <= tolerances.loss_gap(fp32, E4M3)


def test_fp8_all_gather_bit_equal_and_bytes_by_formula():
    g = torch.Generator().manual_seed(1)
    ws, x = [torch.randn(16, 8, generator=g), torch.randn(8, 16, generator=g)], torch.randn(4, 8, generator=g)
    ref = allgather.unsharded_forward(ws, x)
    for n in (2, 4):
        outs = warm_cluster(n).run(allgather.sharded_forward_job, ws, x)
        assert all(torch.equal(o["y"], ref) for o in outs)
        sent = outs[0]["sent"]
        assert sent["fp8_all_gather"] + sent["fp8_amax_gather"] == sum(
            (n - 1) * (w.numel() // n + 4) for w in ws
        )
        assert sent["bf16_all_gather"] == sum((n - 1) * 2 * (w.numel() // n) for w in ws)
