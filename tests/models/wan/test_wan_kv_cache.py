"""Wan cross-attention K/V cached in pages: contents, packed forward over the cache,
offload/restore into other pages, geometry and pool exhaustion."""

import pytest
import torch

import ditmem.models as dm
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models.wan.attention import text_kv
from ditmem.models.wan.kv_cache import cross_kv_geometry, geometry_of
from ditmem.models.wan.tiny import build_tiny_transformer


@pytest.fixture()
def model():
    return build_tiny_transformer()


def _requests(g, text_lens=(512, 37, 5)):
    shapes = [(2, 8, 8), (1, 6, 10), (3, 4, 4)]
    return [dict(hidden_states=torch.randn(1, 4, *s, generator=g),
                 timestep=torch.tensor([t]),
                 encoder_hidden_states=torch.randn(1, n, 32, generator=g))
            for s, t, n in zip(shapes, (999, 400, 21), text_lens, strict=True)]


def _stock(model, kws):
    with torch.no_grad():
        return [model(**kw, return_dict=False)[0] for kw in kws]


def _cached(kws, caches):
    return [dict(hidden_states=kw["hidden_states"], timestep=kw["timestep"], cross_kv=c)
            for kw, c in zip(kws, caches, strict=True)]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_cached_kv_equals_recomputed(model):
    kws = _requests(torch.Generator().manual_seed(0))
    adapter = dm.patch(model)
    pool = PagePool(64, 1 << 14)
    for kw in kws:
        cache = adapter.cache_cross_kv(kw["encoder_hidden_states"], pool)
        keys, values = cache.read()
        with torch.no_grad():
            text = model.condition_embedder.text_embedder(kw["encoder_hidden_states"])[0]
            for layer, block in enumerate(model.blocks):
                k, v = text_kv(block.attn2, text)
                assert torch.equal(keys[layer], k) and torch.equal(values[layer], v)


# all layers in a page, read as 64-row blocks / one layer per page, page blocks
@pytest.mark.parametrize("page_bytes", [1 << 16, 1 << 9])
def test_forward_over_cache_matches_unpatched(model, page_bytes):
    kws = _requests(torch.Generator().manual_seed(1))
    ref = _stock(model, kws)
    adapter = dm.patch(model)
    pool = PagePool((1 << 20) // page_bytes, page_bytes)
    caches = [adapter.cache_cross_kv(kw["encoder_hidden_states"], pool) for kw in kws]
    assert len(caches[0].tensors) == len(geometry_of(model, page_bytes).groups)
    outs = adapter.forward_packed(_cached(kws, caches))
    recomputed = adapter.forward_packed(kws)
    for out, again, r in zip(outs, recomputed, ref, strict=True):
        assert _rel(out, r) <= 1e-4
        assert _rel(out, again) <= 1e-5


def test_detach_offload_restore_elsewhere_attach_is_bit_identical(model):
    kws = _requests(torch.Generator().manual_seed(2))
    adapter = dm.patch(model)
    pool, host = PagePool(64, 1 << 14), HostPool(64, 1 << 14)
    engine = OffloadEngine(pool, host)
    caches = [adapter.cache_cross_kv(kw["encoder_hidden_states"], pool) for kw in kws]
    before = adapter.forward_packed(_cached(kws, caches))
    pages_before = caches[1].tensors[0].pages
    engine.offload(caches[1].detach())
    with pytest.raises(ValueError, match="detached"):
        adapter.forward_packed(_cached(kws, caches))
    grabbed = pool.allocate(pool.num_free_pages)  # hold the old pages, free the others
    pool.free([p for p in grabbed if p not in pages_before])
    assert engine.restore(caches[1].tensors)
    caches[1].attach()
    assert set(caches[1].tensors[0].pages).isdisjoint(pages_before)
    after = adapter.forward_packed(_cached(kws, caches))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_attach_refuses_offloaded_tensors(model):
    adapter = dm.patch(model)
    pool, host = PagePool(16, 1 << 14), HostPool(16, 1 << 14)
    cache = adapter.cache_cross_kv(torch.randn(1, 9, 32), pool)
    OffloadEngine(pool, host).offload(cache.detach())
    with pytest.raises(RuntimeError, match="restore it first"):
        cache.attach()


def test_geometry_and_pool_exhaustion(model):
    geo = cross_kv_geometry(num_layers=40, heads=40, head_dim=128, dtype=torch.bfloat16,
                            page_bytes=64 << 20)  # Wan2.2 A14B, 64 MiB pages
    assert geo.groups == ((0, 40),) and geo.tokens_per_page == geo.block_size == 81
    assert geo.pages(512) == 7
    small = cross_kv_geometry(num_layers=40, heads=40, head_dim=128, dtype=torch.bfloat16,
                              page_bytes=1 << 20)
    assert len(small.groups) == 40 and small.tokens_per_page == 51
    exact = cross_kv_geometry(2, 2, 16, torch.float32, page_bytes=1 << 20)  # 8192 rows a page
    assert exact.tokens_per_page == 2048 and exact.block_size == 64
    with pytest.raises(ValueError, match="page"):
        cross_kv_geometry(2, 2, 16, torch.float32, page_bytes=100)
    with pytest.raises(ValueError, match="page_bytes"):
        cross_kv_geometry(2, 2, 16, torch.float32, page_bytes=200)

    adapter = dm.patch(model)
    page_bytes = 1 << 9
    need = geometry_of(model, page_bytes).pages(100)
    pool = PagePool(need - 1, page_bytes)
    assert adapter.cache_cross_kv(torch.randn(1, 100, 32), pool) is None
    assert pool.num_free_pages == need - 1  # nothing leaked
    pool = PagePool(need, page_bytes)
    assert adapter.cache_cross_kv(torch.randn(1, 100, 32), pool) is not None
    assert pool.num_free_pages == 0


def test_cache_of_another_transformer_is_rejected(model):
    other = build_tiny_transformer(seed=9)
    pool = PagePool(16, 1 << 14)
    foreign = dm.patch(other).cache_cross_kv(torch.randn(1, 5, 32), pool)
    kw = _requests(torch.Generator().manual_seed(3))[0]
    adapter = dm.patch(model)
    with pytest.raises(ValueError, match="another transformer"):
        adapter.forward_packed(_cached([kw], [foreign]))
    with pytest.raises(ValueError, match="mix"):
        adapter.forward_packed([_cached([kw], [foreign])[0], kw])
    with pytest.raises(RuntimeError, match="already patched"):
        dm.patch(model)
