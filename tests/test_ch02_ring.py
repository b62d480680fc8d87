"""Chapter 2: our all-reduces against dist.all_reduce, counted bytes against the formulas, the
schedules, the milestone and its CLI, the α-β model and the benchmark."""

import json
import math

import pytest
import torch
from conftest import cli_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lesson_lib import comm, costmodel, experiments, plots
from lesson_lib.comm import schedules
from lesson_lib.milestones import ring_allreduce as ra

pytestmark = pytest.mark.ch2
OURS = ["ring", "halving-doubling", "naive"]


# --------------------------------------------------------------------------- multi-rank


def exact_bytes_recv(algorithm, numel, element_size, n, rank):
    """What ``rank`` receives, from the schedules: every transfer is one rank's send to its peer."""
    if n == 1:
        return 0
    if algorithm in ("ring", "pipelined-ring"):  # from the left neighbour, which sends only to us
        return schedules.ring_bytes_sent(numel, element_size, n, (rank - 1) % n)
    if algorithm == "naive":  # the root receives everyone's S, the others the root's result
        return (n - 1) * numel * element_size if rank == 0 else numel * element_size
    bounds = schedules.chunk_bounds(numel, schedules.power_of_two_below(n))
    spans = (schedules.span(bounds, st.recv) for st in schedules.halving_doubling_schedule(n)
             if st.rank == rank and st.recv is not None)
    return element_size * sum(hi - lo for lo, hi in spans)



@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 4), length=st.integers(0, 41),
       dtype=st.sampled_from(["float32", "float64", "bfloat16"]), seed=st.integers(0, 2**16))
def test_ours_equal_dist_all_reduce_for_any_length_and_world_size(clusters, n, length, dtype, seed):
    out = clusters(n).run(ra.compare_with_library, [(length, dtype, seed)], OURS)
    rows = [r for rank in out for r in rank]
    assert len(rows) == n * len(OURS)
    for r in rows:
        assert r["ok"], r
        assert r["bytes_sent"] == r["exact_bytes_sent"], r  # counted on the wire = exact count
        # catches: received bytes miscounted (each rank receives its peers' sends to it)
        es = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        assert r["bytes_recv"] == exact_bytes_recv(r["algorithm"], length, es, n, r["rank"]), r
        size = length * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        formula = comm.formula_bytes_sent(r["algorithm"], size, n, r["rank"])
        assert abs(r["bytes_sent"] - formula) <= 4 * 8, r   # = the formula up to chunk rounding
        # without the schedules: each of these all-reduces receives what it sends, up to chunk rounding
        # (the ring's left neighbour sends as much; naive's root takes N−1 messages and sends N−1)
        assert abs(r["bytes_recv"] - r["bytes_sent"]) <= 4 * 8, r


def test_ring_matches_library_bit_for_bit_on_integers_and_closely_on_floats(clusters):
    out = clusters(3).run(ra.compare_with_library, [(1001, "float32", 1), (1001, "bfloat16", 2)], OURS)
    rows = [r for rank in out for r in rank]
    assert all(r["max_error"] < 1e-5 for r in rows if r["dtype"] == "float32")
    assert all(r["max_error"] == 0 for r in rows if r["dtype"] == "bfloat16")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_milestone_runs_every_algorithm_correctly_with_counted_bytes(clusters, n):
    for alg in comm.ALGORITHMS:
        cfg = ra.Config(world_size=n, size_mb=0.01, algorithm=alg, steps=2)
        r = experiments.run("ring-allreduce", cfg, cluster=clusters(n))
        assert r["correct"] and r["size_bytes"] == cfg.numel() * 4 and len(r["per_rank"]) == n
        assert r["counted"] == (alg != "library")
        if alg != "library":
            assert r["bytes_sent_per_call"] == r["exact_bytes_sent"]
            # catches: received bytes miscounted (each rank receives its peers' sends to it)
            assert r["bytes_recv_per_call"] == [exact_bytes_recv(alg, cfg.numel(), 4, n, k) for k in range(n)]
        for got, want in zip(r["bytes_sent_per_call"], r["formula_bytes_sent"]):
            assert abs(got - want) <= 16
        assert r["time_s"] > 0 and r["algbw_GBps"] >= 0


def test_naive_root_moves_2_n_minus_1_times_s(clusters):
    r = experiments.run("ring-allreduce", ra.Config(world_size=4, size_mb=0.25, algorithm="naive", steps=1),
                        cluster=clusters(4))
    s = r["size_bytes"]
    assert r["bytes_sent_per_call"][0] + r["bytes_recv_per_call"][0] == 2 * 3 * s
    assert all(a + b == 2 * s for a, b in zip(r["bytes_sent_per_call"][1:], r["bytes_recv_per_call"][1:]))


def test_bandwidth_measures_ours_and_the_library_in_one_run(clusters):
    rows = ra.bandwidth(sizes=(4096, 65536), world_sizes=(2,), algorithms=("ring", "library"), repeats=2,
                           cluster_for=clusters)
    assert {(r["size_bytes"], r["algorithm"]) for r in rows} == {(s, a) for s in (4096, 65536)
                                                                 for a in ("ring", "library")}
    assert all(r["time_s"] > 0 and r["vs_library"] > 0 for r in rows)


class _TimedCluster:
    """Stands in for a cluster whose ranks report set call times: the arithmetic of bandwidth(), exactly."""

    oversubscribed = False

    def __init__(self, outs):
        self.outs = outs

    def run(self, fn, sizes, algorithms, repeats, dtype="float32", batch_bytes=2**23):
        return self.outs


def test_bandwidth_times_the_slowest_rank_and_pairs_each_repeat_with_the_library():
    # catches: vs_library inverted (ours / library), taken from the overall medians instead of the
    # median of paired per-repeat ratios, or from one rank's times rather than the slowest rank's
    s = 4096
    outs = [{s: {"library": [[2, 2], [4, 4], [6, 6]], "ring": [[1, 1], [4, 4], [2, 2]]}},  # rank 0
            {s: {"library": [[1, 3], [1, 1], [1, 1]], "ring": [[1, 1], [1, 1], [1, 1]]}}]  # rank 1
    rows = ra.bandwidth(sizes=(s,), world_sizes=(2,), algorithms=("ring", "library"), repeats=3,
                           cluster_for=lambda n: _TimedCluster(outs))
    by = {r["algorithm"]: r for r in rows}
    # slowest rank per call: library [[2, 3], [4, 4], [6, 6]], ring [[1, 1], [4, 4], [2, 2]]
    assert by["library"]["time_s"] == 4 and by["ring"]["time_s"] == 2  # medians of the six calls
    assert by["ring"]["algbw_GBps"] == s / 2 / 1e9
    # per repeat, median library / median ring: 2.5 / 1, 4 / 4, 6 / 2; their median is 2.5
    assert by["ring"]["vs_library"] == 2.5 and by["library"]["vs_library"] == 1.0


# --------------------------------------------------------------------------- schedules (pure)


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_schedule_leaves_each_rank_one_full_chunk_then_all(n):
    frames = schedules.ring_states(n)
    assert len(frames) == 1 + 2 * (n - 1)
    after_rs = frames[n - 1]["state"]
    for r in range(n):
        full = [c for c in range(n) if after_rs[r][c] == list(range(n))]
        assert full == [(r + 1) % n]
    assert all(c == list(range(n)) for row in frames[-1]["state"] for c in row)
    # each step: every rank sends exactly one chunk, to its right neighbour
    for f in frames[1:]:
        assert sorted(s for s, _, _ in f["moves"]) == list(range(n))
        assert all(d == (s + 1) % n for s, d, _ in f["moves"])


@pytest.mark.parametrize("n", range(1, 10))
def test_halving_doubling_schedule_sums_exactly(n):
    for numel in (0, 1, 3, 7, 100, 101):
        bounds = schedules.chunk_bounds(numel, schedules.power_of_two_below(n))
        values = [[(7 * r + i) % 11 - 5 for i in range(numel)] for r in range(n)]
        cur = [list(v) for v in values]
        sched = schedules.halving_doubling_schedule(n)
        for key in dict.fromkeys((x.phase, x.step) for x in sched):
            here = [x for x in sched if (x.phase, x.step) == key]
            before = [list(v) for v in cur]
            for x in here:
                if x.recv is None:
                    continue
                peer = next(y for y in here if y.rank == x.peer)
                assert peer.send == x.recv
                lo, hi = schedules.span(bounds, x.recv)
                for i in range(lo, hi):
                    cur[x.rank][i] = cur[x.rank][i] + before[x.peer][i] if x.reduce else before[x.peer][i]
        total = [sum(v[i] for v in values) for i in range(numel)]
        assert all(c == total for c in cur), (n, numel)


def test_byte_formulas():
    for n in (2, 4, 8):
        for numel in (0, 1, 1000, 1001):
            for r in range(n):
                exact = schedules.halving_doubling_bytes_sent(numel, 4, n, r)
                assert abs(exact - 2 * (n - 1) * 4 * numel / n) <= 4 * 2 * int(math.log2(n))
    assert schedules.naive_bytes_sent(10, 4, 4, 0) == 3 * 40 and schedules.naive_bytes_sent(10, 4, 4, 2) == 40
    assert comm.formula_bytes_sent("halving-doubling", 100.0, 3, 0) == 100.0  # folds into rank 1


@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pipelined_schedule_is_the_ring_in_segments(n, k):
    ring = schedules.ring_schedule(n)
    sched = schedules.pipelined_ring_schedule(n, k)
    assert len(sched) == k * len(ring)
    for rs in ring:  # every ring step's chunk goes as k segments, between the same ranks
        mine = [x for x in sched if (x.phase, x.step, x.rank) == (rs.phase, rs.step, rs.rank)]
        assert [x.segment for x in mine] == list(range(k))
        assert {(x.send_to, x.send_chunk, x.recv_from, x.recv_chunk) for x in mine} == \
            {(rs.send_to, rs.send_chunk, rs.recv_from, rs.recv_chunk)}
    for numel in (0, 1, 7, 1001):  # the segments' bytes add up to the ring's exact count
        bounds = schedules.chunk_bounds(numel, n)
        size = [hi - lo for lo, hi in bounds]
        for r in range(n):
            sent = sum(hi - lo for x in sched if x.rank == r
                       for lo, hi in [schedules.chunk_bounds(size[x.send_chunk], k)[x.segment]])
            assert 4 * sent == schedules.ring_bytes_sent(numel, 4, n, r)


@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pipelined_slots_send_only_finished_segments_and_overlap_every_add(n, k):
    sched = schedules.pipelined_ring_schedule(n, k)
    frames = schedules.pipelined_ring_slots(n, k)
    full = list(range(n))
    # the replay sends what a segment holds at that slot: if any segment left before its add,
    # some contribution would be missing at the end
    assert all(s == full for row in frames[-1]["state"] for c in row for s in c)
    for f in frames[1:]:
        assert len({src for src, *_ in f["moves"]}) == len(f["moves"])  # one segment per link per slot
        assert all(d == (s + 1) % n for s, d, *_ in f["moves"])
        if k > 1:  # with two segments or more, every add overlaps a transfer
            assert f["moves"]
    assert not any(f["adding"] for f in frames if f["phase"] == "all-gather" and not f["moves"])
    if n > 1:
        # the link never idles once k ≥ 2: 2(N−1)·k slots, one per segment of every step
        slots = [f["slot"] for f in frames[1:]]
        assert len(slots) == (2 * (n - 1) * k if k > 1 else 2 * (n - 1) + (n - 1))
        # when the last reduce-scatter segment has been added, rank r holds chunk r+1 summed over all
        last_add = max(x.slot for x in sched if x.phase == "reduce-scatter") + 1
        state = next(f["state"] for f in frames if f["slot"] == last_add)
        assert all(all(s == full for s in state[r][(r + 1) % n]) for r in range(n))


@pytest.mark.parametrize("k", [0, -2, 1.5, True])
def test_pipelined_schedule_rejects_a_bad_segment_count(k):
    with pytest.raises(ValueError, match="segments"):
        schedules.pipelined_ring_schedule(3, k)


def test_pipelined_animation_is_built_from_the_slots():
    from lesson_lib.plots.collectives import pipelined_ring_animation

    frames = schedules.pipelined_ring_slots(4, 2)
    fig = pipelined_ring_animation(frames)
    assert len(fig.frames) == len(frames)
    added = [fr for fr, f in zip(fig.frames, frames) if f["adding"] and f["moves"]]
    assert added and all("<b>added</b>" in fr.layout.title.text for fr in added)


def test_animation_is_built_from_the_schedule():
    fig = plots.collectives.ring_animation(schedules.ring_states(4))
    assert len(fig.frames) == 1 + 2 * 2 * 3  # start, then (sending, landed) for each of 6 steps


# --------------------------------------------------------------------------- bad input, CLI


@pytest.mark.parametrize("options, name", [
    ({"size_mb": -1.0}, "size_mb"), ({"size_mb": 1e9}, "size_mb"), ({"algorithm": "tree"}, "algorithm"),
    ({"dtype": "int8"}, "dtype"), ({"steps": 0}, "steps"),
])
def test_bad_config_names_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        ra.Config(**options).validate()


def test_unknown_algorithm_in_comm_names_it():
    with pytest.raises(ValueError, match="algorithm"):
        comm.all_reduce(torch.ones(2), "tree")


def test_cli_run_writes_the_json(tmp_path):
    f = tmp_path / "ring.json"
    out = cli_in_process("run", "ring-allreduce", "--world-size", "2", "--size-mb", "0.05", "--steps", "3",
                         "--json", str(f))
    assert out.returncode == 0, out.stderr
    d = json.loads(f.read_text())
    assert d["experiment"] == "ring-allreduce" and d["world_size"] == 2 and d["correct"]
    assert d["bytes_sent_per_call"] == d["exact_bytes_sent"] and len(d["per_rank"]) == 2
    assert {"formula_bytes_sent", "time_s", "time_s_per_rank", "algbw_GBps", "busbw_GBps"} <= set(d)


@pytest.mark.parametrize("args, name", [(["--size-mb", "-1"], "size_mb"),
                                        (["--algorithm", "tree"], "algorithm")])
def test_cli_bad_input_is_a_clear_error(args, name):
    out = cli_in_process("run", "ring-allreduce", *args)
    assert out.returncode != 0 and name in out.stderr and "Traceback" not in out.stderr


# --------------------------------------------------------------------------- the model


def test_fit_recovers_alpha_and_beta():
    # The times are the ring's textbook cost written out here, 2(N−1)α + 2(N−1)/N·S·β (Patarasuk &
    # Yuan, 2009), not costmodel.allreduce_time: the fit uses allreduce_terms as its model, so times
    # made by the same terms would be recovered whatever those terms said.
    alpha, beta = 50e-6, 1 / 2e9
    rows = [{"world_size": n, "size_bytes": s, "time_s": 2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta}
            for n in (2, 4) for s in (4096 * 4**k for k in range(8))]
    fit = costmodel.fit_alpha_beta(rows)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=1e-6) and fit["beta_s_per_byte"] == pytest.approx(beta)
    assert fit["rms_rel_error"] < 1e-9
    s_star = costmodel.latency_crossover_bytes(4, alpha, beta)
    # 2(N−1)α = 2(N−1)/N·S*·β gives S* = N·α/β = 4 × 50 µs × 2e9 B/s = 400,000 bytes
    assert s_star == pytest.approx(400_000)
    a, b = costmodel.allreduce_terms("ring", 4, s_star)
    assert a * alpha == pytest.approx(b * beta)
    with pytest.raises(ValueError, match="algorithm"):
        costmodel.allreduce_terms("butterfly", 4, 1.0)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1000, 1024])
def test_the_tree_term_and_its_limits(n):
    # catches: a tree term that grows with N (or with N's bytes), or a wrong crossover with the ring
    s, alpha, beta = 1e8, 5e-6, 1 / 25e9
    log2n = math.floor(math.log2(n))
    assert costmodel.allreduce_terms("tree", n, s) == (2 * log2n, 2 * s)
    assert costmodel.allreduce_terms("tree", 1, s) == (0.0, 0.0)         # one rank sends nothing
    assert costmodel.allreduce_terms("tree", n, 0.0) == (2 * log2n, 0.0)
    ring_a, ring_b = costmodel.allreduce_terms("ring", n, s)
    hd_a, hd_b = costmodel.allreduce_terms("halving-doubling", n, s)
    assert 2 * s / ring_b == pytest.approx(n / (n - 1))     # the tree's bytes: N/(N−1) the ring's
    if n & (n - 1) == 0:  # a power of two: halving-doubling has the tree's latency and the ring's bytes
        assert (hd_a, hd_b) <= (2 * log2n, 2 * s) and hd_b == ring_b
    else:  # MPICH folds the ranks above p′ in and out (Thakur et al. 2005); it was once 2⌊log₂N⌋α
        p2 = 2**log2n
        assert (hd_a, hd_b) == (2 * log2n + 2, pytest.approx((2 * (p2 - 1) / p2 + 2) * s))

    def tree(size):
        return costmodel.allreduce_time("tree", n, size, alpha, beta)

    def ring(size):
        return costmodel.allreduce_time("ring", n, size, alpha, beta)

    assert tree(0.0) <= ring(0.0) and (tree(0.0) < ring(0.0)) == (n > 2)  # latency-bound: the tree's log₂N
    assert ring(1e15) < tree(1e15)                                        # bandwidth-bound: the ring
    star = costmodel.ring_beats_tree_bytes(n, alpha, beta)
    assert star == pytest.approx(n * (n - 1 - log2n) * alpha / beta)
    if star > 0:
        assert tree(star) == pytest.approx(ring(star), rel=1e-12)    # equal at the crossover ...
        assert ring(1.01 * star) < tree(1.01 * star)                 # ... the ring above it,
        assert tree(0.99 * star) < ring(0.99 * star)                 # the tree below


def test_bus_bandwidth_is_nccl_tests_convention():
    assert costmodel.bus_bandwidth(10.0, 2) == 10.0                       # two ranks: the same figure
    assert costmodel.bus_bandwidth(10.0, 4) == pytest.approx(15.0)        # 2(N−1)/N = 1.5
    assert costmodel.bus_bandwidth(10.0, 1) == 0.0
    rows = [{"world_size": 4, "size_bytes": 2**20, "algorithm": a, "time_s": 1e-3,
             "algbw_GBps": 2**20 / 1e-3 / 1e9} for a in ("ring", "library", "naive")]
    from lesson_lib.chapters import ch02_scale

    got = ch02_scale.bus_bandwidth({"rows": rows})
    assert [r["algorithm"] for r in got] == ["our ring", "Gloo's dist.all_reduce"]
    assert got[0]["sent_per_s"] == pytest.approx(got[0]["busbw"], rel=1e-12)  # bytes a rank sends / time


def test_the_model_at_scale_puts_ring_and_tree_where_the_formula_says(monkeypatch):
    from lesson_lib.chapters import ch02_scale

    monkeypatch.setattr(ch02_scale, "display", lambda fig: None)
    out = ch02_scale.model_scaling(link="ib-hdr", nbytes=100e6)
    net = out["link"]
    t = {(r["algorithm"], r["size_bytes"], r["world_size"]): r["time_s"] for r in out["rows"]}
    assert t["tree", 100e6, 1024] == pytest.approx(2 * 10 * net["alpha"] + 2 * 100e6 * net["beta"])
    for c in out["crossover"]:
        n, star = c["world_size"], c["bytes"]
        assert star == pytest.approx(n * (n - 1 - math.floor(math.log2(n))) * net["alpha"] / net["beta"])
        for s in ch02_scale.SIZES_AT_SCALE:   # the ring wins exactly above the crossover
            assert (t["ring", s, n] < t["tree", s, n]) == (s > star)


# The chapter's exercises are tested in tests/test_exercises_ch0_2.py (on real ranks).


def test_the_model_at_cluster_scale_puts_the_ring_latency_crossover_at_s_beta_over_alpha(monkeypatch):
    # bug caught: N* computed from the laptop's fit, or a latency share that ignores the 2(N−1) steps
    from lesson_lib.chapters import ch02, ch02_scale

    monkeypatch.setattr(ch02_scale, "display", lambda fig: None)
    out = ch02.at_scale({"alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "bandwidth_GBps": 1.0},
                        world_sizes=(2, 200, 1024))
    net = out["link"]
    assert out["crossover_n"][25e6] == pytest.approx(25e6 * net["beta"] / net["alpha"])
    rows = {(r["link"], r["algorithm"], r["size_bytes"], r["world_size"]): r for r in out["rows"]}
    n = round(out["crossover_n"][25e6])  # at N* latency and bandwidth terms are equal
    r = rows[net["name"], "ring", 25e6, n] if n in (2, 200, 1024) else None
    assert r is not None and r["latency_share"] == pytest.approx(0.5)
    ring = rows[net["name"], "ring", 25e6, 1024]
    assert ring["time_s"] == pytest.approx(2 * 1023 * net["alpha"] + 2 * 1023 / 1024 * 25e6 * net["beta"])
    laptop = rows["this laptop (fitted)", "ring", 25e6, 1024]
    assert laptop["time_s"] == pytest.approx(2 * 1023 * 1e-3 + 2 * 1023 / 1024 * 25e6 * 1e-9)
