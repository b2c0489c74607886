"""Block-aligned packing: layout invariants and ragged attention vs per-segment SDPA."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ditmem.models.common.packing import PackedLayout, blocks_for
from ditmem.ops import paged_attention


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 150), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16, 64]),
)
def test_layout_invariants(lengths, block_size):
    lay = PackedLayout.build(lengths, block_size)
    assert lay.total == sum(lengths)
    assert lay.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert lay.kv_lens.tolist() == lengths
    used = []
    for b, n in enumerate(lengths):
        k = blocks_for(n, block_size)
        row = lay.block_table[b, :k].tolist()
        assert row == list(range(lay.block_starts[b], lay.block_starts[b] + k))
        used += row
        # each segment's first row sits at a block boundary
        if n:
            first = lay.slots[lay.cu_seqlens[b]].item()
            assert first % block_size == 0 and first // block_size == lay.block_starts[b]
    assert sorted(used) == list(range(lay.num_blocks))  # disjoint, no gaps
    x = torch.randn(lay.total, 3)
    blocked = lay.to_blocks(x)
    assert blocked.shape == (lay.num_blocks, block_size, 3)
    assert torch.equal(lay.from_blocks(blocked), x)
    assert blocked.abs().sum() == pytest.approx(x.abs().sum().item(), rel=1e-5)  # padding zero
    assert [p.shape[0] for p in lay.split(x)] == lengths


@pytest.mark.parametrize("lengths", [[5, 70, 64], [1], [130, 0, 3, 64], [200, 17]])
def test_ragged_self_attention_matches_sdpa(lengths):
    g = torch.Generator().manual_seed(0)
    lay = PackedLayout.build(lengths, 64)
    q, k, v = (torch.randn(lay.total, 4, 16, generator=g) for _ in range(3))
    out = paged_attention(
        q, lay.to_blocks(k), lay.to_blocks(v), lay.cu_seqlens, lay.block_table, lay.kv_lens
    )
    for qs, ks, vs, os_ in zip(lay.split(q), lay.split(k), lay.split(v), lay.split(out),
                               strict=True):
        if qs.shape[0] == 0:
            continue
        ref = F.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1)
        ).transpose(0, 1)
        torch.testing.assert_close(os_, ref, rtol=1e-5, atol=1e-5)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="empty"):
        PackedLayout.build([])
    with pytest.raises(ValueError, match="negative"):
        PackedLayout.build([3, -1])
    with pytest.raises(ValueError, match="block_size"):
        PackedLayout.build([3], block_size=0)
    lay = PackedLayout.build([3, 4], 4)
    with pytest.raises(ValueError, match="rows"):
        lay.to_blocks(torch.zeros(6, 2))
    with pytest.raises(ValueError, match="shape"):
        lay.from_blocks(torch.zeros(3, 4, 2))


@pytest.mark.parametrize("rows", [16, 100, 256 + 16, 256 + 17, 600, 1024 + 3])
def test_tiled_linear_is_bit_identical(rows):
    from ditmem.models.common.packing import MIN_ROWS, tiled

    g = torch.Generator().manual_seed(rows)
    lin = torch.nn.Linear(32, 48)
    x = torch.randn(rows, 32, generator=g)
    calls = []

    def fn(t):
        calls.append(t.shape[0])
        return lin(t)

    with torch.no_grad():
        assert torch.equal(tiled(fn, x, tile=256), lin(x))
    assert sum(calls) == rows and min(calls) >= MIN_ROWS


@pytest.mark.parametrize("shape", [(64, 384), (256, 1536), (32, 64)])
def test_rowwise_linear_gives_each_row_its_own_bits(shape):
    """Per-request conditioning: every row equals a one-row call (the stock model's batch-1
    computation), whatever the batch size — the basis of batch invariance."""
    from ditmem.models.common.packing import rowwise, rowwise_linear

    g = torch.Generator().manual_seed(shape[1])
    lin = torch.nn.Linear(*shape)
    x = torch.randn(20, shape[0], generator=g) * 3
    with torch.no_grad():
        alone = torch.cat([lin(x[i : i + 1]) for i in range(20)])
        for b in (1, 2, 5, 11, 12, 16, 20):
            assert torch.equal(rowwise_linear(lin, x[:b]), alone[:b]), b
        nobias = torch.nn.Linear(*shape, bias=False)
        assert torch.equal(rowwise_linear(nobias, x[:7]), torch.cat(
            [nobias(x[i : i + 1]) for i in range(7)]))
        mod = torch.nn.Sequential(torch.nn.SiLU(), lin)
        assert torch.equal(rowwise(mod, x[:9]), torch.cat([mod(x[i : i + 1]) for i in range(9)]))


@pytest.mark.parametrize("batch,seq,block_size", [(1, 406, 64), (3, 64, 64), (2, 5, 4), (4, 1, 16)])
def test_batch_to_blocks_matches_layout(batch, seq, block_size):
    from ditmem.models.common.packing import batch_to_blocks

    x = torch.randn(batch, seq, 2, 8)
    blocks, table, lens = batch_to_blocks(x, block_size)
    lay = PackedLayout.build([seq] * batch, block_size)
    assert torch.equal(blocks, lay.to_blocks(x.flatten(0, 1)))
    assert torch.equal(table, lay.block_table) and torch.equal(lens, lay.kv_lens)
