"""Edge cases every milestone meets: a one-step run of every registered experiment, on
its tiny preset, with the runtime's collective check on. A one-step run of the impact experiment once
failed with a false collective mismatch (its async parameter server receives from any source)."""

import math

import pytest

from lesson_lib import experiments

pytestmark = pytest.mark.ch0


@pytest.mark.parametrize("name", experiments.names())
def test_a_one_step_run_of_every_experiment_finishes_and_summarises(name, clusters):
    mod = experiments.load(name)
    cfg = mod.Config.tiny(steps=1)
    r = experiments.run(name, cfg, cluster=clusters(cfg.world_size))
    if name != "large-batch":  # its steps come from its epochs: steps=1 is not its knob
        assert len(r.losses) <= 1, r.losses
    assert all(math.isfinite(x) for x in r.losses)
    t = r.median_step_time()  # one step: that step (step 0 is skipped only when others exist)
    assert (t > 0) if r.step_times() else math.isnan(t)
    assert r.summary()
    assert r.to_dict()["experiment"] == mod.NAME
