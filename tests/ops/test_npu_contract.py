"""Contract test of the npu backend: no NPU here, so a fake ``torch_npu`` records the call to
``npu_fused_infer_attention_score`` and computes the attention the documented arguments
describe (TND layout, cumulative actual_seq_lengths, per-request actual_seq_lengths_kv,
K/V as [blocks, block_size, H_kv*D] read through block_table). The result must equal per-request
SDPA, which holds only if ditmem.ops.npu maps every argument as documented."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from ops_factories import TOLERANCE, make_case, sdpa_reference

from ditmem.ops import npu


def fake_fia(calls):
    def npu_fused_infer_attention_score(query, key, value, **kw):
        calls.append({"query": query, "key": key, "value": value, **kw})
        assert kw["input_layout"] == "TND" and kw["sparse_mode"] == 0
        heads, kv_heads, bs = kw["num_heads"], kw["num_key_value_heads"], kw["block_size"]
        dim = query.shape[2]
        ends = kw["actual_seq_lengths"]
        out = torch.zeros_like(query)
        for b, (end, n) in enumerate(zip(ends, kw["actual_seq_lengths_kv"], strict=True)):
            start = ends[b - 1] if b else 0
            if end == start or n == 0:
                continue
            blocks = kw["block_table"][b, : -(-n // bs)].long()
            k = key[blocks].reshape(-1, kv_heads, dim)[:n].float().transpose(0, 1)
            v = value[blocks].reshape(-1, kv_heads, dim)[:n].float().transpose(0, 1)
            qb = query[start:end].float().transpose(0, 1)
            o = F.scaled_dot_product_attention(qb, k, v, scale=kw["scale"],
                                               enable_gqa=heads != kv_heads)
            out[start:end] = o.transpose(0, 1).to(query.dtype)
        return out, torch.zeros(query.shape[0], heads, 1)

    return npu_fused_infer_attention_score


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    module = types.ModuleType("torch_npu")
    module.npu_fused_infer_attention_score = fake_fia(recorded)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return recorded


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_argument_mapping_matches_sdpa(calls, dtype):
    case = make_case([5, 0, 12, 7], [40, 9, 33, 0], heads=4, kv_heads=2, dim=8,
                     block_size=16, dtype=dtype, seed=2)
    out = npu.paged_attention(*case.args(), scale=0.2)
    torch.testing.assert_close(out.float(), sdpa_reference(case, scale=0.2), **TOLERANCE[dtype])
    (call,) = calls
    assert call["key"].shape == (case.k_cache.shape[0], 16, 2 * 8)
    assert call["key"].data_ptr() == case.k_cache.data_ptr()  # a view, not a copy
    assert call["block_table"].dtype == torch.int32
    assert call["actual_seq_lengths"] == [5, 5, 17, 24]
    assert call["actual_seq_lengths_kv"] == [40, 9, 33, 0]
    assert (call["num_heads"], call["num_key_value_heads"]) == (4, 2)
    assert out[17:24].abs().max() == 0  # request without keys


def test_rejects_what_the_kernel_cannot_take(calls):
    with pytest.raises(ValueError, match="float16/bfloat16"):
        npu.paged_attention(*make_case([2], [3], block_size=16).args(), scale=1.0)
    case = make_case([2], [3], block_size=8, dtype=torch.float16)
    with pytest.raises(ValueError, match="block_size % 16"):
        npu.paged_attention(*case.args(), scale=1.0)
    assert calls == []
