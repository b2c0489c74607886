"""paged_attention on every backend available here vs torch SDPA run per request."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ops_factories import TOLERANCE, make_case, sdpa_reference

import ditmem.ops as ops

AVAILABLE = [n for n, why in ops.available_backends().items() if why is None and n != "npu"]
FAST = [n for n in AVAILABLE if n != "triton"]  # triton runs through its slow interpreter here
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run(backend, case, **kw):
    with ops.use_backend(backend):
        return ops.paged_attention(*case.args(), **kw)


def check(out, case, dtype, **kw):
    assert out.dtype == dtype and out.shape == case.q.shape
    torch.testing.assert_close(out.float(), sdpa_reference(case, **kw), **TOLERANCE[dtype])


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
    with ops.use_backend(backend):
        out = ops.paged_attention(q, pool_k[:, :4], pool_v[:, :4], *case.args()[3:])
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
    k = case.k_cache.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)  # heads outermost
    v = case.v_cache.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    with ops.use_backend(backend):
        out = ops.paged_attention(case.q, k, v, *case.args()[3:])
    check(out, case, torch.float32)
