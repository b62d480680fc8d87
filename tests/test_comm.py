"""Our ring all-reduce against the library's, and its counted bytes against the formula."""

import probes
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lesson_lib import comm
from lesson_lib.comm import chunk_bounds, ring_bytes_sent

pytestmark = pytest.mark.ch0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 4), length=st.integers(0, 37), dtype=st.sampled_from(["float32", "float64"]),
       seed=st.integers(0, 2**16), algorithm=st.sampled_from(["ring", "pipelined-ring"]))
def test_ring_equals_the_sum_for_any_length_and_world_size(clusters, n, length, dtype, seed, algorithm):
    g = torch.Generator().manual_seed(seed)
    values = [torch.randint(-50, 50, (length,), generator=g).tolist() for _ in range(n)]
    out = clusters(n).run(probes.ring, values, dtype, algorithm)
    expected = torch.tensor(values, dtype=torch.float64).sum(0).tolist() if length else []
    for rank, (result, ops) in enumerate(out):
        assert result == expected  # small integers: exact in any order of summation
        sent = ops.get("ring_all_reduce", {}).get("bytes_sent", 0)
        recv = ops.get("ring_all_reduce", {}).get("bytes_recv", 0)
        size = 8 if dtype == "float64" else 4
        assert sent == ring_bytes_sent(length, size, n, rank)
        # catches: received bytes miscounted; a rank receives what its left neighbour sends it
        assert recv == ring_bytes_sent(length, size, n, (rank - 1) % n)


@pytest.mark.parametrize("algorithm", ["ring", "pipelined-ring"])
def test_ring_matches_dist_all_reduce_on_random_floats(clusters, algorithm):
    n, length = 3, 1001
    values = [torch.randn(length, generator=torch.Generator().manual_seed(r)).tolist() for r in range(n)]
    ours = clusters(n).run(probes.ring, values, "float32", algorithm)
    theirs = clusters(n).run(probes.library_all_reduce_values, values)
    for (a, _), b in zip(ours, theirs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["ring", "pipelined-ring"])
def test_ring_bfloat16(clusters, algorithm):
    out = clusters(2).run(probes.ring, [[1.0, 2.5, -3.0], [0.5, 0.5, 1.0]], "bfloat16", algorithm)
    assert out[0][0] == out[1][0] == [1.5, 3.0, -2.0]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_bytes_are_bandwidth_optimal_up_to_chunk_rounding(n):
    for numel in (0, 1, 7, 1000, 1001):
        s = 4 * numel
        for rank in range(n):
            exact = ring_bytes_sent(numel, 4, n, rank)
            assert abs(exact - 2 * (n - 1) * s / n) <= 2 * 4, (numel, rank)


def test_chunks_cover_the_tensor_and_differ_by_at_most_one():
    for numel in range(0, 20):
        for parts in range(1, 6):
            b = chunk_bounds(numel, parts)
            assert b[0][0] == 0 and b[-1][1] == numel
            assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
            sizes = [e - s for s, e in b]
            assert max(sizes) - min(sizes) <= 1


def _pipelined(values, dtype, segment_bytes):
    """Runs on every rank (sent by value): the pipelined ring with segments of ``segment_bytes``."""
    import torch.distributed as dist

    from lesson_lib import comm
    from lesson_lib.metrics import counters

    counters().reset()
    t = torch.tensor(values[dist.get_rank()], dtype=getattr(torch, dtype))
    comm.pipelined_ring_all_reduce(t, segment_bytes=segment_bytes, op="p")
    return t.double().tolist(), counters().as_dict(), counters().scratch_live, counters().scratch_peak


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 4), length=st.integers(0, 37),
       dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
       segment_bytes=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_pipelined_ring_equals_the_sum_for_any_segment_size(clusters, n, length, dtype, segment_bytes, seed):
    # segments smaller than an element leave some pieces empty: they must be skipped, not deadlock
    g = torch.Generator().manual_seed(seed)
    values = [torch.randint(-9, 10, (length,), generator=g).tolist() for _ in range(n)]
    fn = lambda v, d, k: _pipelined(v, d, k)
    out = clusters(n).run(fn, values, dtype, segment_bytes)
    expected = torch.tensor(values, dtype=torch.float64).sum(0).tolist() if length else []
    size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    # receives posted a step ahead: the reduce-scatter's segments alternate between two chunks of
    # scratch (one on 2 ranks, whose reduce-scatter is a single step)
    scratch = min(comm.ring.RECV_AHEAD + 1, n - 1) * -(-length // n) * size if n > 1 else 0
    for rank, (result, ops, scratch_live, scratch_peak) in enumerate(out):
        assert result == expected  # small integers: exact in any order, even in bfloat16
        assert scratch_peak == scratch
        assert ops.get("p", {}).get("bytes_sent", 0) == ring_bytes_sent(length, size, n, rank)
        # catches: received bytes miscounted; a rank receives what its left neighbour sends it
        assert ops.get("p", {}).get("bytes_recv", 0) == ring_bytes_sent(length, size, n, (rank - 1) % n)
        assert scratch_live == 0  # the scratch is given back


@pytest.mark.parametrize("segment_bytes", [0, -1, 2.0, True, "4"])
def test_pipelined_ring_rejects_a_bad_segment_size(segment_bytes):
    from lesson_lib import comm

    with pytest.raises(ValueError, match="segment_bytes"):
        comm.pipelined_ring_all_reduce(torch.ones(3), segment_bytes=segment_bytes)
