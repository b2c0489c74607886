"""write_blocks / gather_blocks / copy_blocks on every backend available here, against
plain indexing written out in the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ditmem.ops as ops

sys.path.insert(0, str(Path(__file__).parent))
from ops_factories import device_for  # noqa: E402

BACKENDS = [n for n, why in ops.available_backends().items() if why is None and n != "npu"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Forces the backend; with a GPU, triton's tests make their tensors on CUDA (the
    default device), as its kernels need."""
    dev = device_for(request.param)
    previous = torch.get_default_device()
    torch.set_default_device(dev)
    try:
        with ops.use_backend(request.param):
            yield request.param
    finally:
        torch.set_default_device(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_write_blocks_scatters_and_skips(backend, dtype):
    cache = torch.zeros(5, 4, 3, 2, dtype=dtype)
    x = (torch.arange(10 * 6).reshape(10, 3, 2) % 200).to(dtype)
    slots = torch.tensor([0, 1, 2, -1, 7, 8, 19, 18, 5, -1])
    ops.write_blocks(x, cache, slots)
    flat = cache.view(20, 3, 2)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s], x[t])
    untouched = sorted(set(range(20)) - {s for s in slots.tolist() if s >= 0})
    assert flat[untouched].abs().sum() == 0


def test_write_blocks_converts_dtype_and_device(backend):
    cache = torch.zeros(2, 2, 3, dtype=torch.bfloat16)
    ops.write_blocks(torch.ones(2, 3, dtype=torch.float64), cache, torch.tensor([3, 0]))
    assert cache.view(4, 3)[[0, 3]].eq(1).all() and cache.view(4, 3)[[1, 2]].eq(0).all()


def test_gather_blocks_reads_rows_in_order(backend):
    cache = torch.randn(6, 4, 2, 3)
    table = torch.tensor([[4, 1, 0], [2, 3, 5], [0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([6, 9, 0], dtype=torch.int32)
    out = ops.gather_blocks(cache, table, lens)
    rows = cache.view(24, 2, 3)
    expect = torch.cat([rows[16:20], rows[4:6], rows[8:12], rows[12:16], rows[20:21]])
    assert torch.equal(out, expect)
    assert ops.gather_blocks(cache, table[:0], lens[:0]).shape == (0, 2, 3)


def test_gather_blocks_strided_block_pool(backend):
    arena = torch.randn(4, 10)  # 4 pages of 10 floats, 8 used as [2 rows, 4]
    cache = arena[:, :8].view(4, 2, 4)
    out = ops.gather_blocks(cache, torch.tensor([[3, 1]], dtype=torch.int32),
                            torch.tensor([3], dtype=torch.int32))
    assert torch.equal(out, torch.cat([arena[3, :8].view(2, 4), arena[1, :4].view(1, 4)]))


@pytest.mark.parametrize("block_shape", [(4, 2, 3), (1,), (64, 1024)])
def test_copy_blocks_copies_whole_blocks(backend, block_shape):
    src = torch.randn(6, *block_shape)
    dst = torch.zeros(8, *block_shape)
    mapping = torch.tensor([[0, 7], [4, 2], [1, 1], [2, 3]])
    ops.copy_blocks(src, dst, mapping)
    for s, d in mapping.tolist():
        assert torch.equal(dst[d], src[s])
    assert dst[[0, 4, 5, 6]].abs().sum() == 0


def test_copy_blocks_between_pools_of_other_dtype_layouts(backend):
    src = torch.arange(3 * 8, dtype=torch.int16).view(3, 8)
    dst = torch.zeros(5, 12, dtype=torch.int16)[:, :8]  # strided blocks
    ops.copy_blocks(src, dst, torch.tensor([[2, 0], [0, 4]]))
    assert torch.equal(dst[0], src[2]) and torch.equal(dst[4], src[0])
    assert ops.copy_blocks(src, dst, torch.zeros(0, 2, dtype=torch.int64)) is None


def test_copy_blocks_many_blocks_same_device(backend):
    src = torch.randn(64, 5)
    dst = torch.zeros(64, 5)
    perm = torch.randperm(64)
    ops.copy_blocks(src, dst, torch.stack([torch.arange(64), perm], 1))
    assert torch.equal(dst[perm], src)


def test_copy_blocks_large_copies_stream_past_the_caches(backend):
    # > 16 MiB in total takes the streaming-store path; odd sizes and a dst pool whose
    # blocks start 1 byte off alignment exercise its unaligned head and tail
    if backend == "triton" and not torch.cuda.is_available():
        pytest.skip("18 MiB through the Triton interpreter takes minutes; runs on a GPU")
    g = torch.Generator().manual_seed(0)
    dev = torch.get_default_device()
    src = torch.randint(0, 255, (18, (1 << 20) + 3), dtype=torch.uint8, generator=g,
                        device="cpu").to(dev)
    pool = torch.zeros(20, (1 << 20) + 9, dtype=torch.uint8)
    dst = pool[:, 1 : (1 << 20) + 4]
    mapping = torch.stack([torch.randperm(18, generator=g, device="cpu"),
                           torch.randperm(20, generator=g, device="cpu")[:18]], 1).to(dev)
    ops.copy_blocks(src, dst, mapping)
    assert torch.equal(dst[mapping[:, 1]], src[mapping[:, 0]])
    assert pool[:, 0].eq(0).all() and pool[:, (1 << 20) + 4 :].eq(0).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 23), min_size=0, max_size=5), st.sampled_from([1, 3, 4, 8]),
       st.integers(0, 2**16))
def test_write_then_gather_round_trips_through_shuffled_pages(lens, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.zeros(len(lens), max([*need, 1]), dtype=torch.int32)
    slots, used = [], 0
    for b, n in enumerate(lens):
        table[b, : need[b]] = perm[used : used + need[b]]
        used += need[b]
        slots += [int(table[b, r // block_size]) * block_size + r % block_size for r in range(n)]
    x = torch.randn(sum(lens), 2, 3, generator=g)
    cache = torch.full((num_blocks, block_size, 2, 3), float("nan"))
    ops.write_blocks(x, cache, torch.tensor(slots, dtype=torch.int64))
    out = ops.gather_blocks(cache, table, torch.tensor(lens, dtype=torch.int32))
    assert torch.equal(out, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("direction", ["offload", "restore"])
def test_triton_copy_blocks_reads_and_writes_pinned_host_memory(direction):
    dev = torch.device("cuda")
    host = torch.zeros(9, 4096, dtype=torch.uint8).pin_memory()
    device = torch.randint(0, 255, (7, 4096), dtype=torch.uint8, device=dev)
    mapping = torch.tensor([[0, 8], [3, 1], [6, 0], [2, 5]])
    src, dst = (device, host) if direction == "offload" else (host.random_(0, 255), device)
    with ops.use_backend("triton"):
        ops.copy_blocks(src, dst, mapping)
    torch.cuda.synchronize()
    for s, d in mapping.tolist():
        assert torch.equal(dst[d].cpu(), src[s].cpu())


def test_triton_block_ops_run_one_kernel_launch(monkeypatch):
    if ops.available_backends()["triton"] is not None:
        pytest.skip(ops.available_backends()["triton"])
    from ditmem.ops.triton import blocks

    launches = []
    original = blocks._launch
    monkeypatch.setattr(blocks, "_launch", lambda *a: launches.append(a[4]) or original(*a))
    dev = device_for("triton")
    cache = torch.zeros(16, 4, 3, device=dev)
    slots = torch.randperm(64, device=dev)[:40]
    x = torch.randn(40, 3, device=dev)
    with ops.use_backend("triton"):
        ops.write_blocks(x, cache, slots)
        table = torch.arange(16, device=dev, dtype=torch.int32).view(2, 8)
        out = ops.gather_blocks(cache, table, torch.tensor([30, 3], dtype=torch.int32,
                                                            device=dev))
        ops.copy_blocks(cache, torch.zeros_like(cache),
                        torch.stack([torch.arange(16), torch.randperm(16)], 1).to(dev))
    assert launches == [40, 33, 16]  # one launch per call, over all its rows
    flat = cache.view(64, 3)
    assert torch.equal(flat[slots], x)
    assert torch.equal(out, torch.cat([flat[:30], flat[32:35]]))
