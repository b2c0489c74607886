"""Shard arithmetic and aligned device groups (pure, hand-computed)."""

import pytest

from ditmem.parallel.groups import aligned_groups, backend_for, is_aligned
from ditmem.parallel.shards import bounds, shard, shard_lens


def test_bounds_cover_rows_contiguously_sizes_within_one():
    assert bounds(15, 2) == [(0, 7), (7, 15)]
    assert bounds(3, 4) == [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert bounds(0, 2) == [(0, 0), (0, 0)]
    for n in range(0, 40):
        for d in (1, 2, 3, 4):
            b = bounds(n, d)
            assert b[0][0] == 0 and b[-1][1] == n
            assert all(b[i][1] == b[i + 1][0] for i in range(d - 1))
            sizes = [hi - lo for lo, hi in b]
            assert max(sizes) - min(sizes) <= 1


def test_shard_lens_and_bad_input():
    assert shard_lens([15, 32, 1], 2, 0) == [7, 16, 0]
    assert shard_lens([15, 32, 1], 2, 1) == [8, 16, 1]
    assert shard(10, 1, 0) == (0, 10)
    with pytest.raises(ValueError, match="rank"):
        shard(10, 2, 2)
    with pytest.raises(ValueError, match="degree"):
        bounds(10, 0)


def test_aligned_groups():
    assert aligned_groups(1) == [(0,)]
    assert aligned_groups(2) == [(0,), (1,), (0, 1)]
    assert aligned_groups(4) == [(0,), (1,), (2,), (3,), (0, 1), (2, 3), (0, 1, 2, 3)]
    assert aligned_groups(3) == [(0,), (1,), (2,), (0, 1)]
    assert is_aligned((2, 3), 4) and not is_aligned((1, 2), 4)
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"
    assert backend_for("npu") == "hccl"
    with pytest.raises(ValueError, match="mps"):
        backend_for("mps")
