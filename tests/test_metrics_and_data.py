"""Measurement helpers, shipped data and the memory-bill formulas."""

import shutil

import pytest
import torch

from lesson_lib import costmodel, data
from lesson_lib.metrics import ActivationMeter, memory_report, storage_bytes
from lesson_lib.models import mlp, mlp_param_count, param_count

pytestmark = pytest.mark.ch0


def test_storage_bytes_counts_shared_storage_once():
    a = torch.zeros(100)
    assert storage_bytes([a, a[:10], a.view(10, 10), None]) == 400
    assert storage_bytes([a, torch.zeros(5, dtype=torch.float64)]) == 440


def test_activation_meter_counts_saved_tensors_but_not_params():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    meter = ActivationMeter(exclude=model.parameters())
    with meter.measure():
        model(x).sum().backward()
    # Linear 1 saves x (5x8); ReLU saves its output (5x16), which Linear 2 saves again as its
    # input — the same storage, counted once. The pre-ReLU tensor is not kept.
    assert meter.peak == 4 * (5 * 8 + 5 * 16)


def test_memory_report_categories():
    model = mlp(4, 8, 2, 3, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    psi = param_count(model)
    assert psi == mlp_param_count(4, 8, 2, 3)
    m = memory_report(model, opt, activations=123, buffers=[torch.zeros(10)])
    assert m["params"] == m["grads"] == m["optimizer"] == 4 * psi
    assert m["activations"] == 123 and m["buffers"] >= 40


def test_generated_data_is_deterministic_and_learnable():
    x1, y1 = data.teacher_classification(256)
    x2, y2 = data.teacher_classification(256)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert len(set(y1.tolist())) > 3


def test_batches_shard_evenly_and_cover_the_global_batch():
    idx = data.batch_indices(100, 12, step=3, seed=1)
    parts = [data.shard(idx, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(parts), idx) and {len(p) for p in parts} == {3}


def test_shipped_data_is_checksum_verified(tmp_path, monkeypatch):
    rows = data.read_csv("model_sizes.csv")
    assert {"GPT-3", "AlexNet", "Switch-C"} <= {r["model"] for r in rows}
    shutil.copytree(data.DATA_DIR, tmp_path / "data")
    monkeypatch.setattr(data, "DATA_DIR", tmp_path / "data")
    with (tmp_path / "data" / "model_sizes.csv").open("a") as f:
        f.write("Fake,2022,1,nobody\n")
    with pytest.raises(ValueError, match="corrupt or changed"):
        data.read_csv("model_sizes.csv")


def test_memory_bill_is_16_bytes_per_parameter_for_adam():
    for precision in ("mixed-precision Adam", "fp32 Adam"):
        bill = costmodel.memory_bill(7.5e9, precision)
        assert bill["total"] == 16 * 7.5e9  # 120 GB (Rajbhandari et al., 2020)
    assert costmodel.memory_bill(1e9, "fp32 SGD + momentum")["total"] == 12e9


def test_gpt3_fits_no_device_and_gpt2_fits_a_big_one():
    assert not any(costmodel.fits(costmodel.memory_bill(175e9)["total"]).values())
    gpt2 = costmodel.fits(costmodel.memory_bill(1.5e9)["total"])
    assert gpt2["NVIDIA A100 (80 GB)"] and not gpt2["Laptop GPU (8 GB)"]
    assert costmodel.devices_needed(2.8e12, 80e9) == 35


@pytest.mark.parametrize("kw, name", [(dict(precision="fp8"), "precision"), (dict(params=-1), "params")])
def test_memory_bill_bad_input(kw, name):
    with pytest.raises(ValueError, match=name):
        costmodel.memory_bill(**{"params": 1e9, **kw})


def test_model_rejects_bad_sizes():
    with pytest.raises(ValueError, match="hidden"):
        mlp(4, 0, 2, 3, seed=0)


def test_solution_text_is_the_reference_source_without_its_docstring():
    from lesson_lib.exercises import solution_text

    def outer():
        def answer(x):
            """Not shown to the learner."""
            return x + 1  # shown

        return answer

    assert solution_text(outer()) == "def answer(x):\n    return x + 1  # shown"


def test_source_shows_the_library_code_itself_even_behind_a_cache():
    import inspect

    from lesson_lib import comm
    from lesson_lib.comm import schedules
    from lesson_lib.source import source

    s = source(comm.ring_all_reduce)
    lines, first = inspect.getsourcelines(comm.ring_all_reduce)
    assert s.text == "".join(lines) and s.first_line == first and s.path == "lesson_lib/comm/ring.py"
    cached = source(schedules.pipelined_ring_schedule)  # wrapped by a cache decorator
    assert "\ndef pipelined_ring_schedule(" in cached.text and cached.path == "lesson_lib/comm/schedules.py"
    with pytest.raises(TypeError, match="no Python source to show for <built-in function len>"):
        source(len)
