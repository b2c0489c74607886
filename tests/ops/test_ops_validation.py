"""Malformed inputs raise ValueError naming the argument and its shape, on every op."""

from __future__ import annotations

import pytest
import torch
from ops_factories import make_case

import ditmem.ops as ops

I32 = torch.int32


def good():
    c = make_case([3, 5], [6, 9], heads=4, kv_heads=2, dim=8, block_size=4)
    return dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, cu_seqlens_q=c.cu_seqlens_q,
                block_table=c.block_table, kv_lens=c.kv_lens)


def attention_error(match, **changes):
    args = good()
    args.update(changes)
    scale = args.pop("scale", None)
    with pytest.raises(ValueError, match=match):
        ops.paged_attention(*args.values(), scale=scale)


def test_good_inputs_pass():
    ops.paged_attention(*good().values())


@pytest.mark.parametrize("name, bad, match", [
    ("q", torch.zeros(8, 4), r"q \(shape \(8, 4\).*\[total_q, num_heads, head_dim\]"),
    ("q", torch.zeros(8, 4, 8, dtype=torch.int64), r"q .*float32, float16 or bfloat16"),
    ("k_cache", torch.zeros(7, 4, 16), r"k_cache \(shape \(7, 4, 16\).*num_blocks"),
    ("k_cache", torch.zeros(7, 4, 2, 8, dtype=torch.float16), r"k_cache .*q's dtype"),
    ("v_cache", torch.zeros(9, 4, 2, 8), r"v_cache \(shape \(9, 4, 2, 8\).*k_cache's shape"),
    ("cu_seqlens_q", torch.tensor([0.0, 3, 8]), r"cu_seqlens_q .*int32 or int64"),
    ("cu_seqlens_q", torch.tensor([[0, 3, 8]], dtype=I32), r"cu_seqlens_q .*rank 1"),
    ("cu_seqlens_q", torch.tensor([0, 8], dtype=I32), r"block_table .*B=1 rows"),
    ("kv_lens", torch.tensor([6], dtype=I32), r"kv_lens \(shape \(1,\).*B=2 entries"),
    ("block_table", torch.zeros(2, 3), r"block_table .*int32 or int64"),
])
def test_bad_shapes_and_dtypes(name, bad, match):
    attention_error(match, **{name: bad})


def test_gqa_heads_must_divide():
    args = good()
    attention_error(r"num_heads must be a multiple of num_kv_heads=3",
                    k_cache=torch.zeros(7, 4, 3, 8), v_cache=torch.zeros(7, 4, 3, 8),
                    q=torch.zeros(args["q"].shape[0], 4, 8))


def test_head_dim_must_match():
    attention_error(r"head_dim must equal q's head_dim 8", k_cache=torch.zeros(8, 4, 2, 6),
                    v_cache=torch.zeros(8, 4, 2, 6))


@pytest.mark.parametrize("small_index", [4096, 0], ids=["as-lists", "as-tensors"])
def test_values_are_checked(monkeypatch, small_index):
    from ditmem.ops import validation

    monkeypatch.setattr(validation, "SMALL_INDEX", small_index)  # both ways of checking
    attention_error(r"kv_lens exceeds the block table's capacity \(4 blocks x 4 rows = 16\)",
                    kv_lens=torch.tensor([6, 17], dtype=I32))
    attention_error(r"kv_lens has negative", kv_lens=torch.tensor([-1, 9], dtype=I32))
    table = good()["block_table"].clone()
    table[1, 2] = 99  # request 1 uses 3 blocks
    attention_error(r"block_table \(shape \(2, 4\)\) holds block ids outside \[0, 8\)",
                    block_table=table)
    attention_error(r"cu_seqlens_q .*non-decreasing",
                    cu_seqlens_q=torch.tensor([0, 9, 8], dtype=I32),
                    q=torch.zeros(8, 4, 8))
    attention_error(r"must end at total_q=8", cu_seqlens_q=torch.tensor([0, 3, 7], dtype=I32))
    attention_error(r"must start at 0", cu_seqlens_q=torch.tensor([1, 3, 8], dtype=I32))
    attention_error(r"scale must be a positive finite", scale=-1.0)


@pytest.mark.parametrize("small_index", [4096, 0], ids=["as-lists", "as-tensors"])
def test_unused_table_entries_are_not_checked(monkeypatch, small_index):
    from ditmem.ops import validation

    monkeypatch.setattr(validation, "SMALL_INDEX", small_index)
    table = good()["block_table"].clone()
    table[0, 3] = -5  # request 0 uses 2 blocks
    ops.paged_attention(*{**good(), "block_table": table}.values())


def test_devices_must_match():
    attention_error(r"k_cache .*must be on q's device", k_cache=torch.zeros(7, 4, 2, 8,
                                                                           device="meta"))


def test_block_op_errors():
    cache = torch.zeros(4, 2, 3)
    with pytest.raises(ValueError, match=r"cache \(shape \(4, 2, 3\).*rows of x"):
        ops.write_blocks(torch.zeros(2, 5), cache, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"slot_mapping \(shape \(1,\).*one slot per row"):
        ops.write_blocks(torch.zeros(2, 3), cache, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"slot_mapping .*-1 or in \[0, 8\)"):
        ops.write_blocks(torch.zeros(2, 3), cache, torch.tensor([0, 8]))
    table = torch.tensor([[0, 1]], dtype=I32)
    with pytest.raises(ValueError, match=r"lens exceeds the block table's capacity"):
        ops.gather_blocks(cache, table, torch.tensor([5], dtype=I32))
    with pytest.raises(ValueError, match=r"block ids outside \[0, 4\)"):
        ops.gather_blocks(cache, torch.tensor([[0, 4]], dtype=I32), torch.tensor([3],
                                                                                dtype=I32))
    with pytest.raises(ValueError, match=r"dst \(shape \(4, 3, 3\).*block shape"):
        ops.copy_blocks(cache, torch.zeros(4, 3, 3), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"dst .*src's dtype"):
        ops.copy_blocks(cache, torch.zeros(4, 2, 3, dtype=torch.half), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"mapping \(shape \(2,\).*\[N, 2\]"):
        ops.copy_blocks(cache, cache.clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"dst block ids outside \[0, 4\)"):
        ops.copy_blocks(cache, cache.clone(), torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match=r"src block ids outside"):
        ops.copy_blocks(cache, cache.clone(), torch.tensor([[-1, 0]]))
