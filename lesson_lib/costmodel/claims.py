"""What chapter 7's chart says, checked under each assumption it rests on: the talk's conclusions
evaluated at every overlap (none and all of the data-parallel communication hidden; chapters 0 and
4 measure buckets and prefetch hiding it), the compression bar's days as a function of the extra
steps it needs (chapter 6), and "from months to days" in the chart's own numbers.
"""

from __future__ import annotations

from dataclasses import replace

from .planner import estimate, memory, milestones, plan_for


def _fit(rows: dict) -> dict:
    return {m: r for m, r in rows.items() if r["fits"]}


# Each claim: its words, and a test on one chart (rows by milestone). Chapter 7 prints which hold at
# every overlap, which flip, and which hold at none; the notebook asserts only the first kind.
CLAIMS = {
    "memory": ("pipeline and ZeRO-3 (+ LAMB, compression) fit; ring, ZeRO-1 and ZeRO-2 do not",
               lambda r: all(r[m]["fits"] for m in ("pipeline", "zero-3", "lamb", "compression"))
               and not any(r[m]["fits"] for m in ("ring", "zero-1", "zero-2"))),
    "ps-hotspot": ("one parameter server is over 100× slower than K = N server shards",
                   lambda r: r["parameter-server"]["days"] > 100 * r["ps-sharded"]["days"]),
    "ps-sharded": ("K = N server shards take the ring's days (within 1/(N−1)), on twice the machines",
                   lambda r: abs(r["ps-sharded"]["days"] / r["ring"]["days"] - 1)
                   <= 1 / (r["ring"]["data_parallel"] - 1)
                   and r["ps-sharded"]["machines"] == 2 * r["ring"]["machines"]),
    "lamb": ("LAMB's 4× batch takes at least a quarter off ZeRO-3's days",
             lambda r: r["lamb"]["days"] <= 0.75 * r["zero-3"]["days"]),
    "pipeline-vs-zero-3": ("the pipeline is faster than ZeRO-3",
                           lambda r: r["pipeline"]["days"] < r["zero-3"]["days"]),
    "zero-3-bandwidth": ("ZeRO-3 is bandwidth-bound", lambda r: r["zero-3"]["dominant"] == "bandwidth"),
    "compression": ("compression takes more than 5 % off LAMB's days",
                    lambda r: r["compression"]["days"] < 0.95 * r["lamb"]["days"]),
    "every-milestone": ("each milestone that fits is faster than the one before it (the talk's chart)",
                        lambda r: all(b["days"] < a["days"] for a, b in zip(list(_fit(r).values()),
                                                                            list(_fit(r).values())[1:]))),
}


def chart(params: float, tokens: float, devices: int, overlaps=(0.0, 1.0), **options) -> dict[float, list]:
    """The talk's chart (:func:`~.planner.milestones`) once per overlap: {overlap: rows}."""
    return {ov: milestones(params, tokens, devices, overlap=ov, **options) for ov in overlaps}


def conclusions(by_overlap: dict[float, list]) -> list[dict]:
    """Each of :data:`CLAIMS` at every overlap: ``holds`` {overlap: bool} and its ``verdict``:
    "holds at every overlap", "flips with overlap" or "holds at none"."""
    out = []
    for name, (words, test) in CLAIMS.items():
        holds = {ov: bool(test({r["milestone"]: r for r in rows})) for ov, rows in by_overlap.items()}
        verdict = ("holds at every overlap" if all(holds.values()) else
                   "holds at none" if not any(holds.values()) else "flips with overlap")
        out.append({"claim": name, "words": words, "holds": holds, "verdict": verdict})
    return out


def conclusions_table(rows: list[dict]) -> str:
    overlaps = list(rows[0]["holds"])
    head = f"{'claim':<88}" + "".join(f"{f'overlap {ov:g}':>11}" for ov in overlaps) + "  verdict"
    return "\n".join([head] + [f"{r['words'][:87]:<88}" + "".join(
        f"{'yes' if r['holds'][ov] else 'no':>11}" for ov in overlaps) + f"  {r['verdict']}" for r in rows])


def compression_days(params: float, tokens: float, devices: int, extra_steps=(0.0, 0.05, 0.1, 0.25),
                     overlaps=(0.0, 1.0), **options) -> dict:
    """The compression bar's days at each ``extra_steps`` (a share: 0.1 = 10 % more steps for the same
    tokens) and overlap, beside LAMB's (the bar it builds on), and the extra steps at which it stops
    beating LAMB: days grow as (1 + e), so e* = LAMB's days / compression's days at e = 0, minus 1."""
    rows, even = [], {}
    for ov in overlaps:
        lamb = estimate(plan_for("lamb", params, tokens, devices, overlap=ov, **options))["days"]
        for e in extra_steps:
            days = estimate(plan_for("compression", params, tokens, devices, overlap=ov, extra_steps=e,
                                     **options))["days"]
            rows.append({"overlap": ov, "extra_steps": e, "days": days, "lamb_days": lamb})
        even[ov] = lamb / next(r["days"] for r in rows if r["overlap"] == ov and r["extra_steps"] == 0) - 1
    return {"rows": rows, "break_even_extra_steps": even}


def largest_fitting(milestone: str, tokens: float, devices: int, lo: float = 1e8, hi: float = 1e13,
                    **options) -> float:
    """The most parameters (to 0.1 %) ``milestone`` fits on ``devices`` (GPT-3's aspect, bisected)."""
    if not memory(plan_for(milestone, lo, tokens, devices, **options))["fits"]:
        raise ValueError(f"lo={lo:g} parameters already does not fit under {milestone}")
    while hi / lo > 1.001:
        mid = (lo * hi) ** 0.5
        fits = memory(plan_for(milestone, mid, tokens, devices, **options))["fits"]
        lo, hi = (mid, hi) if fits else (lo, mid)
    return lo


def months_to_days(params: float, tokens: float, devices: int, overlaps=(0.0, 1.0), **options) -> dict:
    """"From months to days" in the chart's numbers. At the fixed model: the days of the plain ring
    (as if it fitted) against the fastest bar that fits, at each overlap. Across sizes: the largest
    model the plain ring fits on the same devices, and its days, against ``params`` with the milestones."""
    out = {"fixed": {}}
    for ov, rows in chart(params, tokens, devices, overlaps, **options).items():
        by = {r["milestone"]: r for r in rows}
        best = min(_fit(by).values(), key=lambda r: r["days"])
        out["fixed"][ov] = {"ring_days": by["ring"]["days"], "best": best["milestone"],
                            "best_days": best["days"]}
    small = largest_fitting("ring", tokens, devices, **options)
    small_plan = plan_for("ring", small, tokens, devices, **options)
    out["ring_largest"] = {"params": small, "days": {ov: estimate(replace(small_plan, overlap=ov))["days"]
                                                      for ov in overlaps}}
    out["params"] = params
    return out
