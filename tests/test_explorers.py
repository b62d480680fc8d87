"""Explorer widgets keep their controls consistent, checked without starting workers."""

import pytest

from lesson_lib.chapters import ch05
from lesson_lib.milestones import large_batch as lb


def _controls(box):
    return {w.description: w for w in box.children if hasattr(w, "value") and w.description}


@pytest.mark.parametrize("optimizer, batch", [("sgd", 512), ("lars", 2048), ("adam", 64), ("lamb", 128)])
def test_ch05_explorer_sets_the_scaled_rate_and_warmup_for_the_chosen_optimizer_and_batch(optimizer, batch):
    c = _controls(ch05.explorer())
    assert c["peak lr"].value == pytest.approx(lb.scaled_lr("lamb", 512), rel=1e-6)  # the first choice
    c["optimizer"].value = optimizer
    c["global batch"].value = batch
    cfg = lb.at_batch(optimizer, batch)
    assert c["peak lr"].value == pytest.approx(lb.scaled_lr(optimizer, batch), rel=1e-6)
    assert c["warm-up steps"].value == max(1, cfg.steps // 10) == cfg.warmup_steps
    c["optimizer"].value = "sgd"  # switching back from LAMB's rate: SGD's own, not LAMB's kept
    assert c["peak lr"].value == pytest.approx(lb.scaled_lr("sgd", batch), rel=1e-6)
