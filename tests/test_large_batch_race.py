"""Chapter 5's fair race: every optimizer gets the same sweep; the runs are the training the
data-parallel grid does, so the grid's runs can stand in for them; the best is picked by accuracy."""

import math

import pytest

from lesson_lib import close_all, run
from lesson_lib.chapters.ch05_race import _from_grid
from lesson_lib.milestones import large_batch as lb
from lesson_lib.milestones import large_batch_race as race

pytestmark = pytest.mark.ch5


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


def test_every_optimizer_gets_the_same_four_rates_relative_to_its_base():
    todo = race.entries(batch=2048)
    assert len(todo) == 16
    for e in todo:
        k = 2048 / lb.BASE_BATCH
        grow = k if e["rule"] == "linear" else math.sqrt(k)
        assert e["lr"] == pytest.approx(e["multiplier"] * lb.BASE_LR[e["optimizer"]] * grow)
        assert e["cfg"].lr == e["lr"] and e["cfg"].weight_decay == race.WEIGHT_DECAY
        assert e["cfg"].warmup_steps == e["cfg"].steps // 10 and e["cfg"].world_size == 1
    per = {o: sorted((e["multiplier"], e["rule"]) for e in todo if e["optimizer"] == o) for o in lb.BASE_LR}
    assert len({tuple(v) for v in per.values()}) == 1  # the same budget for each


@pytest.mark.parametrize("options, name", [({"optimizers": ("nesterov",)}, "optimizer"),
                                           ({"rules": ("cubic",)}, "rule"),
                                           ({"batch": 10 ** 6}, "global_batch")])
def test_a_bad_sweep_is_refused_naming_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        race.entries(**options)


def test_the_best_is_the_most_accurate_and_a_diverged_run_never_wins():
    rows = [{"optimizer": "sgd", "eval_accuracy": 0.0, "eval_loss": math.inf, "diverged": True, "lr": 3.2},
            {"optimizer": "sgd", "eval_accuracy": 0.7, "eval_loss": 0.9, "diverged": False, "lr": 0.3},
            {"optimizer": "sgd", "eval_accuracy": 0.7, "eval_loss": 0.8, "diverged": False, "lr": 0.6}]
    assert race.best(rows)["sgd"]["lr"] == 0.6  # a tie on accuracy goes to the lower loss


@pytest.mark.slow
def test_a_race_run_is_the_grids_run_so_the_grid_can_stand_in(clusters):
    from lesson_lib import warm_cluster

    entry = next(e for e in race.entries(optimizers=("lamb",), batch=128, preset="tiny")
                 if e["multiplier"] == 1 and e["rule"] == "sqrt")
    mine = warm_cluster(2).run(race.race_job, [entry])
    raced = [r for rows in mine for r in rows][0]
    grid = run("large-batch", entry["cfg"].replace(world_size=2, eval_every=1), cluster=clusters(2))
    stood_in = _from_grid(entry, {("lamb", 128): grid})
    assert stood_in is not None and stood_in["rule"] == "sqrt"
    # one process against two ranks: the same training up to the order of float sums
    one_sample = 1 / lb.Config.PRESETS["tiny"]["eval_samples"]
    assert abs(stood_in["eval_accuracy"] - raced["eval_accuracy"]) <= 2 * one_sample
    other = race.entries(optimizers=("lamb",), batch=128, preset="tiny")[0]  # ×½: another training
    assert _from_grid(other, {("lamb", 128): grid}) is None


class _GridRun:  # what _from_grid reads of a grid Result: its config, whether it diverged, its steps
    def __init__(self, config):
        self.config = config

    def __getitem__(self, key):
        return {"diverged": False, "steps": []}[key]


_TINY = race.entries(optimizers=("lamb",), batch=128, preset="tiny")[0]["cfg"].as_dict()
_NOT_TRAINING = ("world_size", "backend", "timeout_s", "eval_every", "noise_scale", "peak_memory")


@pytest.mark.parametrize("field", [f for f in _TINY if f not in _NOT_TRAINING])
def test_a_grid_run_that_differs_in_one_training_field_is_not_reused(field, monkeypatch):
    """The grid stands in for a race entry only when it trained exactly the same thing: change any
    one field that defines the training (epochs, warm-up, seed, model, data, ...) and it must not."""
    entry = race.entries(optimizers=("lamb",), batch=128, preset="tiny")[0]
    same = entry["cfg"].as_dict()
    monkeypatch.setattr(race, "result_row", lambda *a: "reused")
    assert _from_grid(entry, {("lamb", 128): _GridRun(dict(same, world_size=2))}) == "reused"
    value = same[field]
    if isinstance(value, bool):
        other = not value
    elif isinstance(value, int | float):
        other = value * 2 + 1
    else:
        other = "adam" if value != "adam" else "sgd"
    assert _from_grid(entry, {("lamb", 128): _GridRun(dict(same, **{field: other}))}) is None, field


def _claims(fair: dict) -> None:
    """The chapter's checks on the race (notebooks/scripts/05_large_batch.py §3), on any race's rows."""
    best = fair["best"]
    sgd_linear = [r for r in fair["rows"] if r["optimizer"] == "sgd" and r["rule"] == "linear"]
    assert sgd_linear and all(r["diverged"] for r in sgd_linear), sgd_linear
    assert all(b["eval_accuracy"] > 0.7 for b in best.values()), best
    adaptive = [best[o]["eval_accuracy"] for o in ("adam", "lars", "lamb")]
    assert max(adaptive) - min(adaptive) <= 0.04, best
    assert best["lamb"]["rule"] == "sqrt", best["lamb"]


def test_the_chapter_shows_a_dated_record_of_the_race_that_its_claims_hold_on():
    import json

    import ipywidgets as W

    from lesson_lib.chapters import ch05_race

    fair = json.loads(ch05_race.RECORD.read_text())
    assert {"date", "machine", "nproc", "load_1min", "command", "seconds"} <= set(fair)
    assert fair["command"] == ch05_race.COMMAND and len(fair["rows"]) == len(race.entries()) == fair["runs"]
    assert fair["best"] == race.best(fair["rows"])  # the best is the rows', not typed
    _claims(fair)
    shown = []
    from unittest import mock

    with mock.patch.object(ch05_race, "display", side_effect=shown.append):
        assert ch05_race.recorded() == fair
    buttons = [w for box in shown if isinstance(box, W.VBox) for w in box.children if isinstance(w, W.Button)]
    # one button, not "primary": the browser test takes the first primary button as the chapter's control
    assert len(buttons) == 1 and buttons[0].button_style != "primary"


def test_a_missing_record_names_the_command_that_writes_it(tmp_path):
    from lesson_lib.chapters import ch05_race

    with pytest.raises(FileNotFoundError, match="record_ch05_race"):
        ch05_race.recorded(path=tmp_path / "none.json")


@pytest.mark.slow
def test_the_race_run_for_real_supports_the_chapters_claims(tmp_path):
    from lesson_lib.chapters import ch05_race

    fair = ch05_race.record(tmp_path / "race.json")  # what benchmarks/record_ch05_race.py runs
    _claims(fair)
    assert ch05_race.recorded(path=tmp_path / "race.json")["rows"] == fair["rows"]
