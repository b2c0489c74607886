"""A host pool in chunks: pages spread over several pinned-size blocks, transfers split
per chunk, data bit exact; and the engine's pool sizing (--memory-fraction, --host-memory-gb)."""

import pytest
import torch

from ditmem.engine import factory
from ditmem.engine.factory import EngineConfig, make_pools, pool_sizes
from ditmem.memory import HostPool, OffloadEngine, PagePool


def test_host_pool_is_cut_into_chunks():
    host = HostPool(10, 256, chunk_bytes=3 * 256)
    assert host.num_chunks == 4 and host.chunk_pages == 3
    assert [c.shape[0] for c in host.chunks] == [3, 3, 3, 1]
    with pytest.raises(ValueError, match="chunks"):
        host.arena  # noqa: B018 - a multi-chunk pool has no single arena
    with pytest.raises(ValueError, match="chunk_bytes"):
        HostPool(4, 256, chunk_bytes=0)


@pytest.mark.parametrize("mode", ["sync", "thread"])
@pytest.mark.parametrize("trim", [False, True])
def test_transfers_across_chunks_are_bit_exact(mode, trim):
    page = 8192
    pool = PagePool(24, page)
    host = HostPool(24, page, chunk_bytes=5 * page)  # 5 chunks: transfers span several
    calls = []

    def counting_copy(src, dst, mapping):
        calls.append(dst.data_ptr())
        from ditmem.ops import copy_blocks
        copy_blocks(src, dst, mapping)

    eng = OffloadEngine(pool, host, mode=mode, trim_tails=trim, trim_granule=4096,
                        copy_fn=counting_copy)
    tensors = [pool.allocate_tensor(n, (), torch.float32) for n in (5000, 1, 9000, 3000)]
    data = [torch.randn(t.rows) for t in tensors]
    for t, x in zip(tensors, data, strict=True):
        t.write(x)
    for _ in range(2):
        eng.finish_offload(eng.start_offload(tensors))
        chunks_used = {p // host.chunk_pages for t in tensors for p in t._host_pages}
        assert len(chunks_used) > 1 and len(calls) == len(chunks_used)  # one copy per chunk
        for t, x in zip(tensors, data, strict=True):
            assert torch.equal(t.read(), x)  # read from the host pages, across chunks
        filler = pool.allocate(7)  # restore lands in other pages
        calls.clear()
        eng.finish_restore(eng.start_restore(tensors))
        calls.clear()
        pool.free(filler)
        for t, x in zip(tensors, data, strict=True):
            assert torch.equal(t.read(), x)
    assert host.num_free_pages == 24
    eng.close()


def test_pool_defaults_on_cpu_are_the_fixed_sizes():
    assert pool_sizes(EngineConfig(), "cpu") == (64 << 20, 4 * (64 << 20))
    assert pool_sizes(EngineConfig(pool_mb=8, host_mb=3), "cpu") == (8 << 20, 3 << 20)
    assert pool_sizes(EngineConfig(pool_mb=8, host_memory_gb=0.5), "cpu") == (8 << 20, 1 << 29)


def test_memory_fraction_takes_a_share_of_what_is_free(monkeypatch):
    free = {"bytes": 10 << 30}
    monkeypatch.setattr(factory, "_free_device_bytes", lambda device: (free["bytes"], 80 << 30))
    # accelerators: default 0.9 of the free memory after weights; CPU: MemAvailable less host
    assert pool_sizes(EngineConfig(host_memory_gb=1), "cuda")[0] == int(0.9 * (10 << 30))
    assert pool_sizes(EngineConfig(memory_fraction=0.5, host_memory_gb=2), "cpu") == \
        (4 << 30, 2 << 30)
    free["bytes"] = 1 << 20  # the weights took (almost) everything
    config = EngineConfig(memory_fraction=0.5, host_mb=1, page_kb=1024)
    with pytest.raises(ValueError, match="no 1024 KiB page"):
        make_pools(config, "cpu")


@pytest.mark.parametrize("bad, match", [
    (dict(pool_mb=8, memory_fraction=0.5), "not both"),
    (dict(host_mb=8, host_memory_gb=1), "not both"),
    (dict(memory_fraction=1.5), r"\(0, 1\]"),
])
def test_conflicting_or_bad_sizes_are_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        pool_sizes(EngineConfig(**bad), "cpu")


def test_make_pools_builds_a_chunked_host_pool(monkeypatch):
    from ditmem.memory import host_pool

    monkeypatch.setattr(host_pool, "CHUNK_BYTES", 1 << 20)  # 1 MiB chunks instead of 1 GiB
    pool, host = make_pools(EngineConfig(pool_mb=1, host_mb=2.5, page_kb=64), "cpu")
    assert pool.num_pages == 16 and host.num_pages == 40 and host.num_chunks == 3
