"""Chapter 6's crossover exercise (notebooks/06_compression.ipynb): the bandwidth below which
PowerSGD pays, by the α-β model from numbers measured in the kernel, judged as a number to its
precision or as a formula on several cases, then measured on the emulated link."""

from __future__ import annotations

import math

import torch

from ..exercises import Verdict, number
from ..experiments import run_warm
from ..milestones import compression as cm

CROSSOVER_CASE = {"compute_none_s": 2.0e-3, "compute_powersgd_s": 2.6e-3, "messages_none": 4,
                  "messages_powersgd": 6, "bytes_none": 307_240, "bytes_powersgd": 10_616,
                  "latency_s": 100e-6}


def crossover_case(sweep: dict) -> dict:
    """The exercise's numbers from a bandwidth sweep measured in this kernel (``ch06.bandwidth_sweep``)."""
    a, b = sweep["base"]["none"], sweep["base"]["powersgd"]
    return {"compute_none_s": a["compute_s_per_step"], "compute_powersgd_s": b["compute_s_per_step"],
            "messages_none": a["messages_per_step"], "messages_powersgd": b["messages_per_step"],
            "bytes_none": a["wire_bytes_per_step"], "bytes_powersgd": b["wire_bytes_per_step"],
            "latency_s": sweep["latency_s"]}


def crossover(c: dict) -> float:
    """Gbit/s where compute + messages·α + bytes·8/B is equal for both."""
    extra = (c["compute_powersgd_s"] - c["compute_none_s"]
             + (c["messages_powersgd"] - c["messages_none"]) * c["latency_s"])
    return 8 * (c["bytes_none"] - c["bytes_powersgd"]) / extra / 1e9


def _as_printed(case: dict) -> dict:
    """The case as the prompt prints it (4 significant digits): what a learner computes from."""
    return {k: float(f"{v:.4g}") for k, v in case.items()}


def _no_latency(c: dict) -> float:
    """The crossover with the messages·α term left out (a common slip)."""
    return 8 * (c["bytes_none"] - c["bytes_powersgd"]) / (c["compute_powersgd_s"] - c["compute_none_s"]) / 1e9


# a bandwidth off by a unit: (factor, what it means), the factor being answer / the model's Gbit/s
_BITS = "bytes or bits? A Gbit/s link moves 10⁹/8 bytes per second"
_UNIT_SLIPS = (
    (8, f"{_BITS}; yours is 8× the model's"),
    (1 / 8, f"{_BITS}; yours is 1/8 of the model's: GB/s, not Gbit/s"),
    (1e9, "bit/s or Gbit/s? yours is 10⁹× the model's: a bandwidth in bit/s where Gbit/s was asked "
          "(divide by 10⁹)"),
    (1e-9, "bit/s or Gbit/s? yours is 10⁻⁹ of the model's: divided by 10⁹ once too often, as if the "
           "bandwidth were in bit/s when it is already in Gbit/s"),
    (1e9 / 8, "bit/s or Gbit/s, and bytes or bits? yours is 10⁹/8× the model's: a bandwidth in bytes per "
              "second where Gbit/s was asked (×8 for bits, then ÷10⁹)"),
    (8e9, "bit/s or Gbit/s, and bytes or bits? yours is 8·10⁹× the model's: bit/s where Gbit/s was asked "
          "(÷10⁹), with the bytes turned into bits twice (÷8)"),
    (1 / 8e9, "bit/s or Gbit/s, and bytes or bits? yours is 1/(8·10⁹) of the model's: divided by 10⁹ "
              "once too often and by 8 (GB/s, not Gbit/s)"),
    (8e-9, "bit/s or Gbit/s, and bytes or bits? yours is 8·10⁻⁹ of the model's: divided by 10⁹ once "
           "too often and ×8 once too often"),
)


def _unit_slip(got: float, want: float, rel_tol: float = 0.05) -> str | None:
    """The unit mix-up that turns the model's ``want`` Gbit/s into ``got``: a factor of 8 (bytes
    for bits), 10⁹ (bit/s for Gbit/s, or the reverse), or both; ``None`` if none does."""
    return next((says for k, says in _UNIT_SLIPS if math.isclose(got, want * k, rel_tol=rel_tol)), None)


def _variations(case: dict) -> list[dict]:
    """The case, and others in which each term matters more: a formula must hold for all of them."""
    return [case, {**case, "latency_s": case["latency_s"] * 10}, {**case, "messages_powersgd": 12},
            {**case, "compute_powersgd_s": case["compute_powersgd_s"] * 2}]


def _check_formula(fn, case: dict) -> Verdict | None:
    """A callable answer ``fn(case) -> Gbit/s`` judged as a formula, on several cases."""
    for c in _variations(case):
        want = crossover(c)
        try:
            got = number(fn(dict(c)), "a bandwidth in Gbit/s")
        except Exception as e:  # the learner's formula raised: say so, naming the case
            return Verdict(False, f"your formula raised {type(e).__name__}: {e} on {c}")
        if not math.isclose(got, want, rel_tol=1e-6):
            unit = _unit_slip(got, want, rel_tol=1e-6)
            slip = (" — it leaves out PowerSGD's extra messages·α"
                    if math.isclose(got, _no_latency(c), rel_tol=1e-6) else f" — {unit}" if unit else "")
            return Verdict(False, f"on {c} your formula gives {got:.4g} Gbit/s, the model {want:.4g}{slip}")
    return None


def _check_crossover(answer, case: dict, run_check: bool = True) -> Verdict:
    formula = callable(answer) and not isinstance(answer, torch.Tensor)
    if formula:
        wrong = _check_formula(answer, case)
        if wrong is not None:
            return wrong
        answer = answer(dict(case))
    g = number(answer, "one number (the bandwidth in Gbit/s), or a function of the case that returns it")
    want = crossover(case)
    if want <= 0:
        return Verdict(False, "with these measurements PowerSGD never costs more time than it saves; "
                              "rerun the sweep (a noisy machine) and use its numbers")
    wants = (want, crossover(_as_printed(case)))  # exact, or from the printed (rounded) numbers
    on_it = any(math.isclose(g, w, rel_tol=0.003) for w in wants)
    slips = [_no_latency(c) for c in (case, _as_printed(case))]
    if not on_it or (any(math.isclose(g, s, rel_tol=0.003) for s in slips)
                     and not math.isclose(slips[0], want, rel_tol=0.01)):
        unit = next(filter(None, (_unit_slip(g, w) for w in wants)), None)
        if unit:
            hint = unit
        elif any(math.isclose(g, s, rel_tol=0.003) for s in slips):
            hint = "PowerSGD also sends more messages, and each pays the latency α"
        elif math.isclose(g, want, rel_tol=0.05):
            hint = ("near it but not on it: work it out from the numbers above without rounding them "
                    "(3 significant figures at least), with every term")
        else:
            hint = "set compute + messages·α + bytes/B equal for the two and solve for B"
        said = f"{g:.3g}" if unit else f"{g:.3g} Gbit/s"  # a unit slip: its number is not in Gbit/s
        return Verdict(False, f"{said} is not where the α-β model puts it ({hint})")
    if not run_check:
        return Verdict(True, f"{g:.3g} Gbit/s")
    # the emulated link: both compressors just below and just above your answer
    t = {(c, b): run_warm(cm.Config.laptop(compressor=c, steps=10, rank=2, link_gbps=b,
                                           link_latency_us=case["latency_s"] * 1e6)).median_step_time()
         for b in (g / 3, g * 3) for c in ("none", "powersgd")}
    said = [f"at {b:.3g} Gbit/s (emulated) none {1e3 * t['none', b]:.2f} ms vs PowerSGD "
            f"{1e3 * t['powersgd', b]:.2f} ms per step" for b in (g / 3, g * 3)]
    # the answer is the model's; a run that disagrees with the model is said, not hidden
    slow_pays, fast_pays = (t["powersgd", b] < t["none", b] for b in (g / 3, g * 3))
    agrees = slow_pays and not fast_pays
    how = ("the runs agree: PowerSGD is faster below it and not above" if agrees else
           "the runs do NOT agree with the model here: " + ("PowerSGD was faster even at 3× the crossover"
            if fast_pays else "PowerSGD was not faster even at a third of it") +
           " — on shared cores its extra computation and the ranks' scheduling cost more than the "
           "model's compute term says; rerun, or try a larger gap")
    judged = "your formula gives the model's crossover on every case tried" if formula else \
        "the α-β model's crossover"
    return Verdict(True, f"{g:.3g} Gbit/s: {judged}. What the emulated link measured (not part of the "
                         f"verdict): " + "; ".join(said) + f". {how}")
