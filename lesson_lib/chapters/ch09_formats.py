"""Chapter 9's formats exercise (notebooks/09_fp8.ipynb): the learner's ``choose_format(x)`` judged on
real ranks at two world sizes, on each rank's own output-gradients from the chapter's FP8 training,
an activation-like tensor and a tensor spanning 24 binades, against both formats' measured errors.

Nothing here imports IPython: ``formats_job`` runs inside the workers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..exercises import AnswerError, Property, Verdict, judge, on_ranks
from ..milestones.fp8 import errors, train

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fmt(a, what: str) -> str:
    names = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", "e4m3fn": "e4m3"}
    if isinstance(a, torch.dtype):
        a = names.get(a, str(a))
    key = str(a).strip().lower().replace("torch.", "").replace("float8_", "").replace("fp8_", "")
    key = names.get(key, key)
    if key not in ("e4m3", "e5m2"):
        raise AnswerError(f"you gave {a!r} for {what}; answer with 'e4m3' or 'e5m2' (or the torch dtype)")
    return key


def formats_job(fn) -> dict:
    """On every rank: the output-gradients FP8Matmul casts on this rank at the first and last step of
    the chapter's FP8 training (each rank its own slice), an activation-like tensor and a tensor
    spanning 24 binades; the learner's format for each, beside both formats' measured errors."""
    cfg = train.Config(capture_steps=(0, train.Config().steps - 1))
    grads = train.train_job(cfg, "fp8")["output_grads"]
    seed = dist.get_rank() + 10 * dist.get_world_size()
    tensors = {f"output-gradient of layer {i}, step {s}": g for s, gs in grads.items()
               for i, g in enumerate(gs)}
    tensors["activations"] = errors.activation_like(seed)
    tensors["a tensor spanning 24 binades"] = errors.gradient_like(seed)
    out = {}
    for name, x in tensors.items():
        try:
            choice = _fmt(fn(x.clone()), name)
        except Exception as e:  # the learner's error travels back as the verdict
            choice = f"error: {e}"
        err = {f: errors.elementwise_error(x, d) for f, d in (("e4m3", E4M3), ("e5m2", E5M2))}
        out[name] = {"choice": choice, "span": errors.span_binades(x), "errors": err}
    return out


def _formats_form(outs):
    return next((f"rank {r}, {name}: {m['choice']}" for r, o in enumerate(outs) for name, m in o.items()
                 if m["choice"] not in ("e4m3", "e5m2")), None)


def _formats_best(outs):
    for r, o in enumerate(outs):
        for name, m in o.items():
            mine, err = m["choice"], m["errors"]
            other = "e5m2" if mine == "e4m3" else "e4m3"
            if err[mine] > err[other]:
                why = (f"it spans {m['span']:.0f} binades, more than e4m3's 17.8: after scaling, its "
                       "smallest values underflow in e4m3" if mine == "e4m3" else
                       f"it spans {m['span']:.0f} binades; scaled to the format's top, most of its values "
                       "sit where e4m3's third mantissa bit matters more than e5m2's range")
                return (f"rank {r}, {name}: you chose {mine}, which errs by {err[mine]:.1%} on average; "
                        f"{other} errs by {err[other]:.1%} ({why})")


def _returns_none(fn) -> bool:
    try:
        return fn(torch.ones(4)) is None
    except Exception:  # the ranks will report it, on their own tensors
        return False


def check_formats(fn) -> Verdict:
    if not callable(fn) or _returns_none(fn):  # a template: no training run on the ranks
        return Verdict(False, "submit your function choose_format(x) returning 'e4m3' or 'e5m2'")
    return judge(
        [on_ranks(f"{n} ranks", n, formats_job, fn, timeout_s=60) for n in (2, 4)],
        [Property("returns 'e4m3' or 'e5m2' (or the torch dtype) for every tensor", _formats_form),
         Property("each choice has the smaller measured error, on every rank's own tensors", _formats_best)],
        done="Measured, not assumed: the hybrid recipe's e5m2 is for gradients wider than e4m3's range.",
    )


def choose_format(x):
    """The answer: measure both per-tensor scaled casts, keep the smaller mean error."""
    err = {f: errors.elementwise_error(x, d) for f, d in (("e4m3", torch.float8_e4m3fn),
                                                           ("e5m2", torch.float8_e5m2))}
    return min(err, key=err.get)
