"""Chapter 5's fair race at 32·B₀ over several seeds: every optimizer's sweep of the same tuning
budget (lesson_lib.milestones.large_batch_race), to see what varies with the seed."""

from __future__ import annotations


def measure(seeds=(0, 1)) -> list[dict]:
    """Every entry of the race at each seed, two single-process runs at a time on a warm cluster."""
    from lesson_lib import warm_cluster
    from lesson_lib.milestones import large_batch_race as race

    rows = []
    for seed in seeds:
        todo = race.entries()
        for e in todo:
            e["cfg"] = e["cfg"].replace(seed=seed)
        rows += [r | {"seed": seed} for mine in warm_cluster(2).run(race.race_job, todo) for r in mine]
    return rows


def show(rows: list[dict]) -> None:
    from lesson_lib.milestones import large_batch_race as race

    print("held-out accuracy at B = 2,048 after 48 epochs (0 = diverged)")
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["seed"] == seed]
        for r in sorted(mine, key=lambda r: (r["optimizer"], r["lr"])):
            print(f"seed {seed} {r['optimizer']:>5} ×{r['multiplier']:g} {r['rule']:>6} lr {r['lr']:<9.4g} "
                  f"{'diverged' if r['diverged'] else format(r['eval_accuracy'], '.3f')}")
        best = race.best(mine).items()
        print(f"seed {seed} best: " + ", ".join(
            f"{o} {b['eval_accuracy']:.3f} ({b['rule']}, ×{b['multiplier']:g})" for o, b in best))
