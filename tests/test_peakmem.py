"""The measured peak (lesson_lib.peakmem): it sees known allocations, temporaries inside a step and
another thread's, and not an earlier run's memory; on ZeRO ranks it is per rank, the same in every
run of a warm worker, never below the inventory, and falls with the stage where that holds."""

import threading

import pytest
import torch
import torch.nn.functional as F

from lesson_lib import comm, run
from lesson_lib.milestones import zero
from lesson_lib.models import mlp
from lesson_lib.peakmem import PeakMemory

pytestmark = pytest.mark.ch4
MiB = 2**20


def test_a_known_allocation_is_seen_to_the_byte_and_an_empty_window_sees_nothing():
    with PeakMemory() as peak:
        t = torch.ones(16 * MiB // 4)
        del t
    assert peak.peak == 16 * MiB, peak.as_dict()
    with PeakMemory() as quiet:
        pass
    assert quiet.peak == 0, quiet.as_dict()


def _step(model, opt, x, y, extra_bytes: int = 0):
    held = torch.ones(extra_bytes // 4) if extra_bytes else None  # a temporary of the step
    opt.zero_grad(set_to_none=False)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    del held


def test_an_extra_allocation_inside_a_step_shows_up_in_the_peak():
    torch.manual_seed(0)
    model, x, y = mlp(32, 256, 2, 10, 0), torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt = torch.optim.Adam(model.parameters())
    _step(model, opt, x, y)  # Adam's state exists from here on
    peaks = []
    for extra in (0, 3 * MiB):
        with PeakMemory() as peak:
            peak.reset_peak()
            _step(model, opt, x, y, extra)
        peaks.append(peak.peak)
    assert peaks[0] > 0  # the step's own temporaries (Adam's, the backward's)
    assert peaks[1] - peaks[0] == 3 * MiB, peaks


def test_what_was_alive_at_the_reset_counts_and_an_earlier_runs_block_freed_inside_does_not():
    with PeakMemory():  # an earlier run (a warm worker): its block is known to the allocator's table
        earlier = torch.ones(8 * MiB // 4)
    with PeakMemory() as peak:
        states = torch.zeros(MiB // 4)
        mine = torch.zeros(2 * MiB // 4)
        peak.reset_peak()
        del earlier  # freed inside: reported by the allocator, but it must not lower this window's count
        tmp = torch.ones(2 * MiB // 4)
        del tmp
    assert peak.at_reset == 3 * MiB and peak.peak == 5 * MiB, peak.as_dict()
    with PeakMemory() as falling:
        held = torch.zeros(MiB // 4)
        falling.reset_peak()
        del held, mine  # only frees after the reset: the peak is what was alive at it
    assert falling.peak == falling.at_reset == MiB, falling.as_dict()
    del states


def test_another_threads_allocations_count_inside_its_own_session():
    def other(meter, into):
        with meter.thread() if meter is not None else _nothing():
            into.append(torch.ones(4 * MiB // 4))  # allocated there, freed here
            tmp = torch.ones(2 * MiB // 4)  # and one freed there
            del tmp

    seen = []
    for counted in (True, False):
        box = []
        with PeakMemory() as peak:
            peak.reset_peak()
            t = threading.Thread(target=other, args=(peak if counted else None, box))
            t.start()
            t.join()
            box.clear()  # the main thread frees the other thread's tensor
        seen.append(peak.peak)
    assert seen == [6 * MiB, 0], seen  # without its session the thread is invisible (documented)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_stop_ends_the_window_early():
    with PeakMemory() as peak:
        a = torch.ones(MiB // 4)
        peak.stop()
        b = torch.ones(4 * MiB // 4)
    assert peak.peak == MiB, peak.as_dict()
    del a, b


def test_the_comm_layers_kept_buffers_are_released_when_a_window_opens():
    comm.p2p._scratch(MiB, torch.float32, torch.device("cpu"))
    assert comm.p2p._SCRATCH
    with PeakMemory():
        assert not comm.p2p._SCRATCH and not comm.p2p._RECENT


def test_the_cpu_path_makes_no_cuda_call(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a CUDA API was called on the CPU path")

    for name in ("synchronize", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, boom)
    with PeakMemory(torch.device("cpu")) as peak:
        peak.reset_peak()
        torch.ones(10)
    assert peak.as_dict()["measured_method"].startswith("torch CPU allocator")


def test_every_zero_rank_reports_its_measured_peak_beside_the_inventory(clusters):
    cfg = zero.Config(stage=3, world_size=2, peak_memory=True, **zero.Config.PRESETS["tiny"])
    r = run("zero", cfg, cluster=clusters(2))
    assert len(r.per_rank) == 2
    for p in r.per_rank:
        m = p["memory"]
        states = m["params"] + m["grads"] + m["optimizer"]
        assert m["measured_peak"] >= states + m["buffers"] > 0, m  # the inventory is still there
        assert 0 < m["measured_at_reset"] <= m["measured_peak"], m
    plain = run("zero", zero.Config(stage=3, world_size=2, **zero.Config.PRESETS["tiny"]),
                cluster=clusters(2))
    assert "measured_peak" not in plain.per_rank[0]["memory"]  # off by default: it costs step time


@pytest.mark.slow
def test_memory_preset_peaks_repeat_in_warm_workers_and_fall_with_the_stage(clusters):
    c, preset = clusters(2), "memory"
    cfg = zero.Config.from_preset(preset)
    assert zero.param_count(cfg) > 10e6 and cfg.world_size == 2 and not cfg.return_params and cfg.peak_memory

    def peaks(stage, **options):
        r = run("zero", zero.Config.from_preset(preset, stage=stage, **options), cluster=c)
        return [p["memory"]["measured_peak"] for p in r.per_rank], r

    first, r0 = peaks(0)
    one, _ = peaks(1)
    two, r2 = peaks(2)
    buckets, _ = peaks(2, bucket_mb=4.0)
    three, _ = peaks(3)
    again, _ = peaks(0)
    assert again == first  # a warm worker that ran other stages meanwhile: the same bytes
    assert min(first) > max(one) > 0 and min(one) > max(buckets) and min(buckets) > max(three), \
        (first, one, buckets, three)
    assert min(two) > max(one)  # no buckets: the whole full gradient beside its shard
    whole = sum(r2["layer_bytes"])
    for p in r2.per_rank:
        m = p["memory"]
        assert m["measured_peak"] - (m["params"] + m["grads"] + m["optimizer"]) >= whole, m
    for p in r0.per_rank:  # stage 0: model states dominate the measured peak
        m = p["memory"]
        assert m["params"] + m["grads"] + m["optimizer"] >= 0.9 * m["measured_peak"], m
