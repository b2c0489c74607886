"""paged_attention on every backend available here vs torch SDPA run per request."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ops_factories import TOLERANCE, device_for, make_case, on_device, sdpa_reference

import ditmem.ops as ops

AVAILABLE = [n for n, why in ops.available_backends().items() if why is None and n != "npu"]
FAST = [n for n in AVAILABLE if n != "triton"]  # triton runs through its slow interpreter here
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run(backend, case, **kw):
    """The op on ``backend``, inputs on its device (CUDA for triton with a GPU)."""
    with ops.use_backend(backend):
        return ops.paged_attention(*on_device(case, device_for(backend)).args(), **kw)


def check(out, case, dtype, **kw):
    assert out.dtype == dtype and out.shape == case.q.shape
    torch.testing.assert_close(out.float().cpu(), sdpa_reference(case, **kw), **TOLERANCE[dtype])


def test_cpu_and_reference_backends_are_available_here():
    assert "reference" in AVAILABLE and "cpu" in AVAILABLE


@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ragged_gqa_shuffled(backend, dtype):
    # empty query segment, empty key set, lengths off the block size, GQA 4:2
    case = make_case([3, 0, 17, 9, 5], [5, 9, 0, 30, 1], heads=4, kv_heads=2, dim=16,
                     block_size=8, dtype=dtype, seed=1)
    out = run(backend, case)
    check(out, case, dtype)
    assert out[3:20].abs().max() == 0  # request 2 has no keys: zeros


@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("block_size", [1, 5, 16, 32])
def test_block_sizes(backend, block_size):
    case = make_case([7, 12], [33, 50], heads=2, kv_heads=1, dim=8, block_size=block_size,
                     seed=block_size)
    check(run(backend, case), case, torch.float32)


@pytest.mark.parametrize("backend", AVAILABLE)
def test_custom_scale_and_mha(backend):
    case = make_case([6, 11], [19, 4], heads=3, kv_heads=3, dim=12, block_size=4, seed=7)
    check(run(backend, case, scale=0.3), case, torch.float32, scale=0.3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_larger_requests_cross_tiles(dtype):
    # several key tiles (512 rows) and query tiles (256 rows) of the C++ kernel, GQA 8:2
    case = make_case([300, 1, 520], [1100, 3, 700], heads=8, kv_heads=2, dim=64,
                     block_size=128, dtype=dtype, seed=3)
    check(run("cpu", case), case, dtype)


@pytest.mark.parametrize("backend", FAST)
def test_block_table_padding_is_ignored(backend):
    case = make_case([4, 4], [10, 3], block_size=4, pad_value=10_000)
    check(run(backend, case), case, torch.float32)


@pytest.mark.parametrize("backend", AVAILABLE)
def test_non_contiguous_query_and_strided_block_pool(backend):
    case = make_case([5, 9], [13, 20], heads=2, kv_heads=2, dim=8, block_size=4, seed=5)
    q = case.q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    pool_k = torch.zeros(case.k_cache.shape[0], 6, 2, 8)  # blocks 6 rows apart, 4 used
    pool_v = torch.zeros_like(pool_k)
    pool_k[:, :4] = case.k_cache
    pool_v[:, :4] = case.v_cache
    dev = device_for(backend)
    with ops.use_backend(backend):
        out = ops.paged_attention(q.to(dev), pool_k.to(dev)[:, :4], pool_v.to(dev)[:, :4],
                                  *(t.to(dev) for t in case.args()[3:]))
    check(out, case, torch.float32)


@pytest.mark.parametrize("backend", AVAILABLE)
def test_no_requests_and_no_queries(backend):
    case = make_case([], [], heads=2, kv_heads=1)
    assert run(backend, case).shape == (0, 2, 16)
    case = make_case([0, 0], [5, 0], heads=2, kv_heads=1)
    assert run(backend, case).shape == (0, 2, 16)


lengths = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths, st.sampled_from([1, 3, 8, 16]), st.sampled_from([(4, 4), (4, 2), (6, 1)]),
       st.sampled_from(DTYPES), st.integers(0, 2**16))
def test_random_ragged_batches_cpu(lens, block_size, heads, dtype, seed):
    case = make_case([a for a, _ in lens], [b for _, b in lens], heads=heads[0],
                     kv_heads=heads[1], dim=8, block_size=block_size, dtype=dtype, seed=seed)
    check(run("cpu", case), case, dtype)


@pytest.mark.skipif("triton" not in AVAILABLE, reason=ops.available_backends()["triton"] or "")
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=4),
       st.sampled_from([3, 16]), st.integers(0, 2**16))
def test_random_ragged_batches_triton(lens, block_size, seed):
    case = make_case([a for a, _ in lens], [b for _, b in lens], heads=2, kv_heads=1, dim=8,
                     block_size=block_size, seed=seed)
    check(run("triton", case), case, torch.float32)


@pytest.mark.parametrize("backend", AVAILABLE)
def test_cache_with_permuted_layout(backend):
    case = make_case([5, 9], [13, 20], heads=2, kv_heads=2, dim=8, block_size=4, seed=9)
    dev = device_for(backend)
    k = case.k_cache.to(dev).permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)  # heads first
    v = case.v_cache.to(dev).permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    with ops.use_backend(backend):
        out = ops.paged_attention(case.q.to(dev), k, v, *(t.to(dev) for t in case.args()[3:]))
    check(out, case, torch.float32)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same int32 values as a non-contiguous view (every other element of a buffer)."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=torch.int32, device=t.device)
    buf[..., ::2] = t
    return buf[..., ::2]


@pytest.mark.parametrize("backend", AVAILABLE)
def test_strided_index_views(backend):
    case = on_device(make_case([3, 0, 9, 5], [7, 4, 0, 19], heads=4, kv_heads=2, dim=8,
                               block_size=4, seed=11), device_for(backend))
    cu, table, lens = case.args()[3:]
    views = {"cu_seqlens_q": _strided(cu), "kv_lens": _strided(lens),
             "block_table": _strided(table), "block_table.T": table.t().contiguous().t()}
    for name, view in views.items():
        args = dict(zip(("cu_seqlens_q", "block_table", "kv_lens"), (cu, table, lens),
                        strict=True))
        args[name.split(".")[0]] = view
        assert not view.is_contiguous(), name
        with ops.use_backend(backend):
            out = ops.paged_attention(case.q, case.k_cache, case.v_cache, args["cu_seqlens_q"],
                                      args["block_table"], args["kv_lens"])
        check(out, case, torch.float32)


@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_planned_attention_equals_the_op_and_reads_nothing_back(backend, dtype, monkeypatch):
    from ditmem.ops.plan import AttentionPlan

    case = make_case([3, 0, 9, 5], [7, 4, 0, 19], heads=4, kv_heads=2, dim=8, block_size=4,
                     dtype=dtype, seed=12)
    dev = device_for(backend)
    need = [-(-n // 4) for n in case.kv_lens.tolist()]
    plan = AttentionPlan.build(q_lens=[3, 0, 9, 5], kv_lens=case.kv_lens.tolist(),
                               block_tables=[r[:k] for r, k in zip(case.block_table.tolist(),
                                                                    need, strict=True)],
                               block_size=4, num_blocks=case.k_cache.shape[0], device=dev)
    moved = on_device(case, dev)
    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__index__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _o=original, _n=name: reads.append(_n) or _o(self, *a))
    with ops.use_backend(backend):
        out = ops.planned_attention(moved.q, moved.k_cache, moved.v_cache, plan)
    monkeypatch.undo()
    if backend != "reference":  # the reference backend is plain Python over the lengths
        assert reads == []
    check(out, case, dtype)


def test_plan_rejects_bad_values_when_built():
    from ditmem.ops.plan import AttentionPlan

    kw = dict(q_lens=[2, 3], block_tables=[[0], [1, 2]], kv_lens=[4, 8], block_size=4,
              device="cpu")
    assert AttentionPlan.build(**kw, num_blocks=3).min_blocks == 3
    with pytest.raises(ValueError, match="kv_lens: request 1 has 9 keys"):
        AttentionPlan.build(**{**kw, "kv_lens": [4, 9]})
    with pytest.raises(ValueError, match=r"block ids outside \[0, 2\)"):
        AttentionPlan.build(**kw, num_blocks=2)
    with pytest.raises(ValueError, match="q_lens: negative"):
        AttentionPlan.build(**{**kw, "q_lens": [-1, 3]})
    plan = AttentionPlan.build(**kw)
    q, k = torch.zeros(5, 2, 8), torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="fewer blocks than the plan reads"):
        ops.planned_attention(q, k, k, plan)
    with pytest.raises(ValueError, match="total_q=5"):
        ops.planned_attention(q[:4], torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8), plan)
