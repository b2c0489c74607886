"""copy_blocks' block-id check: ids valid for their own side pass even when src and dst have
different block counts; an id outside its side's range is named, on either side."""

import pytest
import torch

from ditmem import ops


@pytest.mark.parametrize("n_src,n_dst", [(10, 4), (4, 10)])
def test_ids_valid_for_their_own_side_pass(n_src, n_dst):
    src = torch.arange(n_src * 3, dtype=torch.float32).view(n_src, 3)
    dst = torch.zeros(n_dst, 3)
    mapping = torch.tensor([[n_src - 1, n_dst - 1], [0, 0]])
    ops.copy_blocks(src, dst, mapping)  # ids >= min(n_src, n_dst) on the larger side
    assert torch.equal(dst[n_dst - 1], src[n_src - 1]) and torch.equal(dst[0], src[0])


@pytest.mark.parametrize("pair,side,bound", [([10, 0], "src", 10), ([0, 4], "dst", 4),
                                             ([-1, 0], "src", 10), ([0, -2], "dst", 4),
                                             ([9, 4], "dst", 4), ([5, 3], None, None)])
def test_out_of_range_ids_are_named(pair, side, bound):
    src, dst = torch.randn(10, 2), torch.zeros(4, 2)
    mapping = torch.tensor([[0, 0], pair])
    if side is None:  # 5 >= n_dst but is a src id: valid
        ops.copy_blocks(src, dst, mapping)
        assert torch.equal(dst[3], src[5])
        return
    before = dst.clone()
    with pytest.raises(ValueError, match=rf"{side} block ids outside \[0, {bound}\)"):
        ops.copy_blocks(src, dst, mapping)
    assert torch.equal(dst, before)
