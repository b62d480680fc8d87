"""Chapter 9's exercises on real ranks: each accepts its reference and other right forms, and rejects
plausible wrong answers with a message that points at the mistake."""

import pytest
import torch

from lesson_lib.chapters import ch09_exercises

pytestmark = pytest.mark.ch9
EX = ch09_exercises.exercises()


@pytest.mark.parametrize("key", list(EX))
def test_every_reference_is_accepted(key):
    assert EX[key].submit(EX[key].reference())


def cast_float_scale(x):  # a right answer: a Python float scale, torch.finfo for the max
    top = torch.finfo(torch.float8_e4m3fn).max
    amax = float(x.abs().max()) or top
    return (x * (top / amax)).clamp(-top, top).to(torch.float8_e4m3fn), amax / top


def cast_zero_scale(x):
    s = x.abs().max() / 448
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def cast_unscaled(x):
    return x.clamp(-448, 448).to(torch.float8_e4m3fn), torch.tensor(1.0)


def cast_wrong_dtype(x):
    s = x.abs().max().clamp_min(1e-12) / 57344
    return (x / s).to(torch.float8_e5m2), s


def cast_clips_the_top(x):  # a reviewer's: maps the amax to 480, so the top values saturate (6.7 % off)
    s = x.abs().max().clamp_min(1e-12) / 480
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def test_cast_accepts_another_form():
    assert EX["cast"].submit(cast_float_scale)


@pytest.mark.parametrize(
    "answer, says",
    [
        (cast_zero_scale, "scale of 1"),
        (cast_unscaled, "cast unscaled"),  # once "divide by the scale before the cast"
        (cast_wrong_dtype, "not torch.float8_e4m3fn"),
        (cast_clips_the_top, "clipped, not rounded"),
    ],
)
def test_cast_rejects_wrong_answers_saying_why(answer, says):
    v = EX["cast"].submit(answer)
    assert not v and says in v.message, v.message


def choose_by_subnormals(x):  # another right answer here: e5m2 once a tenth of x would fall below
    scaled = x.abs() * 448 / x.abs().max()  # e4m3's smallest normal, 2⁻⁶, after a per-tensor scale
    return torch.float8_e5m2 if float((scaled[x != 0] < 2**-6).float().mean()) > 0.1 else "E4M3"


def test_formats_accepts_another_form():
    assert EX["formats"].submit(choose_by_subnormals)


@pytest.mark.parametrize(
    "answer, says",
    [
        (lambda x: "e5m2", "output-gradient of layer 0, step 0: you chose e5m2"),  # the hybrid recipe, always
        (lambda x: "e4m3", "spanning 24 binades: you chose e4m3"),  # right on the real gradients only
        (lambda x: "bf16", "answer with"),
        (("e4m3", "e5m2"), "submit your function"),
    ],
)
def test_formats_rejects_wrong_answers_saying_why(answer, says):
    v = EX["formats"].submit(answer)
    assert not v and says in v.message, v.message


def blocks_per_tensor(w):
    s = w.abs().max() / 448
    return (w / s).to(torch.float8_e4m3fn), s.expand(2, 2)


def blocks_transposed(w):  # written out: calling the library's block_quantize is refused as such
    blocks = w.reshape(2, 128, 2, 128)
    s = blocks.abs().amax(dim=(1, 3)) / 448
    w8 = (blocks / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return w8.reshape(w.shape), s.t()


def blocks_loops(w):  # a right answer written with loops
    w8, s = torch.empty(w.shape, dtype=torch.float8_e4m3fn), torch.empty(2, 2)
    for i in range(2):
        for j in range(2):
            blk = w[128 * i : 128 * i + 128, 128 * j : 128 * j + 128]
            s[i, j] = blk.abs().max() / 448
            w8[128 * i : 128 * i + 128, 128 * j : 128 * j + 128] = (blk / s[i, j]).to(torch.float8_e4m3fn)
    return w8, s


def test_blocks_accepts_loops():
    assert EX["blocks"].submit(blocks_loops)


@pytest.mark.parametrize("answer, says", [(blocks_per_tensor, "per-tensor"), (blocks_transposed, "order")])
def test_blocks_rejects_wrong_answers_saying_why(answer, says):
    v = EX["blocks"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- issue 59


def cast_to_half_range(x):  # maps the amax to 224: half of e4m3's range left unused
    amax = x.abs().max()
    s = amax / 224 if amax > 0 else torch.tensor(1.0)
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def cast_swapped(x):  # right values, the pair in the wrong order
    amax = x.abs().max()
    s = amax / 448 if amax > 0 else torch.tensor(1.0)
    return s, (x / s).clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("answer, says, not_says", [
    (cast_to_half_range, "below e4m3's 448", "correct"),
    (cast_swapped, "wrong order", "x8 is torch.float32"),
], ids=["half-range", "swapped"])
def test_cast_verdict_names_the_mistake(answer, says, not_says):
    v = EX["cast"].submit(answer)
    assert not v and says in v.message and not_says not in v.message, v.message


def test_the_librarys_own_cast_is_refused():
    from lesson_lib.milestones.fp8 import scaling

    v = EX["cast"].submit(scaling.quantize)
    assert not v and "library's own lesson_lib.milestones.fp8.scaling.quantize" in v.message, v.message


def blocks_one_row_short(w):  # each block's slice stops a row early: rows 127 and 255 are never cast
    q, s = torch.zeros_like(w), torch.ones(2, 2)
    for i in range(2):
        for j in range(2):
            rows, cols = slice(128 * i, 128 * i + 127), slice(128 * j, 128 * j + 128)
            s[i, j] = w[rows, cols].abs().max() / 448
            q[rows, cols] = (w[rows, cols] / s[i, j]).clamp(-448, 448)
    return q.to(torch.float8_e4m3fn), s


def test_blocks_off_by_one_row_is_told_so():
    v = EX["blocks"].submit(blocks_one_row_short)
    assert not v and "rows 127, 255 are wrong" in v.message and "block i covers rows" in v.message, v.message


# --------------------------------------------------------------------------- wrapping the library


def cast_wrapping_the_library(x):  # the library's cast, called from the learner's own function
    from lesson_lib.milestones.fp8 import scaling

    return scaling.quantize(x, "e4m3")


def blocks_wrapping_the_library(w):
    from lesson_lib.milestones.fp8 import scaling

    return scaling.quantize_blocks(w)


def blocks_calling_the_reference(w):
    return ch09_exercises.block_quantize(w.clone())


def cast_from_the_librarys_halves(x):  # quantize's two halves called by hand: still the library's cast
    from lesson_lib.milestones.fp8 import scaling

    scale = scaling.scale_for(x.abs().max())
    return scaling.saturating_cast(x, scale), scale


def cast_in_a_thread(x):  # the library's cast, called from a thread the answer starts
    from concurrent.futures import ThreadPoolExecutor

    from lesson_lib.milestones.fp8 import scaling

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: scaling.quantize(x)).result()


@pytest.mark.parametrize("key, answer, name", [
    ("cast", cast_wrapping_the_library, "scaling.quantize"),
    ("cast", cast_in_a_thread, "scaling.quantize"),
    ("cast", lambda x: ch09_exercises.fp8_cast(x), "ch09_exercises.fp8_cast"),
    ("cast", cast_from_the_librarys_halves, "scaling.scale_for"),
    ("blocks", blocks_wrapping_the_library, "scaling.quantize_blocks"),
    ("blocks", blocks_calling_the_reference, "ch09_exercises.block_quantize"),
], ids=["cast-quantize", "cast-thread", "cast-lambda", "cast-halves", "blocks-quantize_blocks",
         "blocks-reference"])
def test_an_answer_calling_the_librarys_own_is_refused(key, answer, name):
    v = EX[key].submit(answer)
    assert not v and v.message == (f"your answer calls lesson_lib's own {name}, the thing this exercise asks "
                                   "you to write: write it yourself"), v.message


def test_formats_may_call_the_error_helper_the_prompt_names():  # it casts with scaling.quantize inside
    from lesson_lib.milestones.fp8 import errors

    def choose(x):
        e4, e5 = (errors.elementwise_error(x, d) for d in (torch.float8_e4m3fn, torch.float8_e5m2))
        return "e4m3" if e4 <= e5 else "e5m2"

    assert EX["formats"].submit(choose)


# --------------------------------------------------------------------------- a block's amax off the top


def blocks_mapped_to(top):  # every block's amax mapped to ``top`` rather than 448, saturating beyond it
    def answer(w):
        blocks = w.reshape(2, 128, 2, 128)
        s = blocks.abs().amax(dim=(1, 3)) / top
        w8 = (blocks / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        return w8.reshape(w.shape), s

    return answer


@pytest.mark.parametrize("top, says", [
    (224, "block (0, 0)'s amax is mapped to 224, below e4m3's 448"),
    (470, "block (0, 0)'s amax is mapped to 470, beyond e4m3's 448"),
], ids=["half-range", "saturating"])
def test_blocks_refuse_an_amax_not_mapped_to_448(top, says):
    v = EX["blocks"].submit(blocks_mapped_to(top))
    assert not v and says in v.message, v.message
