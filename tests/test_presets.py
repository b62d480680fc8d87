"""Presets live on the configs: every experiment's ``Config`` has the sizes the course runs.

``Config.laptop()`` is what a chapter's figures run, ``Config.tiny()`` the smallest size that still
shows the result; both validate, take changes on top, and refuse what they do not know by name.
"""

import pytest

from lesson_lib import experiments
from lesson_lib.milestones import data_parallel as dp

pytestmark = pytest.mark.ch0


@pytest.mark.parametrize("name", experiments.names())
def test_every_experiment_has_a_laptop_and_a_tiny_preset_that_validate(name):
    # bug caught: a milestone without presets, or a preset naming an option its Config lacks
    cls = experiments.load(name).Config
    assert {"laptop", "tiny"} <= set(cls.PRESETS), f"{name}: presets {sorted(cls.PRESETS)}"
    for preset in cls.PRESETS:
        cfg = cls.from_preset(preset)
        assert type(cfg) is cls
        for option, value in cls.PRESETS[preset].items():
            assert getattr(cfg, option) == value, (name, preset, option)


def test_a_preset_takes_changes_on_top_and_keeps_the_rest():
    cfg = dp.Config.laptop(world_size=4, steps=3)
    assert (cfg.world_size, cfg.steps) == (4, 3)
    assert cfg.hidden == dp.Config.PRESETS["laptop"]["hidden"]
    assert dp.Config.PRESETS["laptop"]["steps"] != 3  # the preset itself is untouched


def test_a_bad_preset_or_option_is_refused_by_name():
    with pytest.raises(ValueError, match="preset must be one of laptop, tiny.*got 'huge'"):
        dp.Config.from_preset("huge")
    with pytest.raises(TypeError, match="unknown option.*hiden"):
        dp.Config.laptop(hiden=3)
    with pytest.raises(ValueError, match="global_batch"):  # changes are validated like any config
        dp.Config.tiny(global_batch=0)


def test_run_warm_finds_the_experiment_of_a_config():
    for name in experiments.names():
        assert experiments.experiment_of(experiments.load(name).Config.tiny()) == name
    with pytest.raises(TypeError, match="no experiment's Config"):
        experiments.experiment_of(object())
