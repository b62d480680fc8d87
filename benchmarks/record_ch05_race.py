"""Record chapter 5's fair race at 32·B₀ in benchmarks/records/ch05-race.json.

The chapter shows this record (its rows, each optimizer's best, the date, the machine and this
command) and asserts its claims on it; a button there reruns the race live. Every entry runs as a
single-process training, two at a time on a warm 2-rank cluster (about 16 runs of 192 steps).

    .venv/bin/python benchmarks/record_ch05_race.py
"""

from __future__ import annotations

if __name__ == "__main__":
    from lesson_lib import close_all
    from lesson_lib.chapters import ch05_race
    from lesson_lib.milestones import large_batch_race as lbr

    try:
        fair = ch05_race.record()
    finally:
        close_all()
    for name, b in lbr.best(fair["rows"]).items():
        print(f"{name:>5}: {b['eval_accuracy']:.3f} ({b['rule']}, ×{b['multiplier']:g}, lr {b['lr']:.3g})")
    print(f"{fair['runs']} runs, {fair['seconds']:.0f} s; wrote {ch05_race.RECORD}")
