"""RequestState: named tensors + scalars, bit-exact round trip through the host."""

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from ditmem.memory import HostPool, OffloadEngine, PagePool, RequestState, TensorState


def make_state(pool):
    g = torch.Generator().manual_seed(0)
    s = RequestState(pool, request_id="r0")
    tensors = {
        "latents": torch.randn(1, 16, 8, 8, generator=g),
        "prompt_embeds.cond": torch.randn(1, 7, 24, generator=g).bfloat16(),
        "prompt_embeds.uncond": torch.randn(1, 5, 24, generator=g).bfloat16(),
        "prompt_mask.cond": torch.rand(1, 7, generator=g) > 0.3,
        "prompt_mask.uncond": torch.ones(1, 5, dtype=torch.int64),
        "solver.model_outputs.0": torch.randn(1, 16, 8, 8, generator=g).half(),
    }
    for name, x in tensors.items():
        assert s.put(name, x) is not None
    k = torch.randn(7, 2, 4, generator=g).bfloat16()
    s.put("cross_k.0.cond", k, row_ndim=2)
    tensors["cross_k.0.cond"] = k
    s.scalars.update(step=3, sigmas=[1.0, 0.5, 0.0])
    return s, tensors


def test_roundtrip_through_host_is_bit_exact():
    pool = PagePool(num_pages=64, page_bytes=512)
    host = HostPool(num_pages=64, page_bytes=512)
    eng = OffloadEngine(pool, host)
    s, ref = make_state(pool)
    assert s.location == "device" and s.device_bytes == s.num_pages * 512
    assert s.paged("cross_k.0.cond").row_shape == (2, 4)
    filler = None
    for _ in range(2):
        h = s.start_offload(eng)
        assert s.location == "in_flight"
        eng.finish_offload(h)
        assert s.location == "host" and s.device_pages == 0
        assert pool.num_free_pages == 64 - (0 if filler is None else len(filler))
        with pytest.raises(Exception, match="on_host"):
            s.get("latents")
        filler = filler or pool.allocate(5)  # shuffle: restore lands elsewhere
        assert s.restore(eng)
        for name, x in ref.items():
            y = s.get(name)
            assert y.dtype == x.dtype and y.shape == x.shape
            assert torch.equal(y.view(torch.uint8) if y.dtype.is_floating_point else y,
                               x.view(torch.uint8) if x.dtype.is_floating_point else x), name
    assert s.scalars["step"] == 3
    s.free()
    pool.free(filler)
    assert pool.num_free_pages == 64 and host.num_free_pages == 64


def test_put_overwrites_in_place_or_reallocates():
    pool = PagePool(num_pages=16, page_bytes=256)
    s = RequestState(pool)
    p = s.put("latents", torch.zeros(2, 10))
    x = torch.randn(2, 10)
    assert s.put("latents", x) is p and torch.equal(s.get("latents"), x)
    y = torch.randn(3, 10)
    q = s.put("latents", y)
    assert q is not p and p.state is TensorState.FREED and torch.equal(s.get("latents"), y)
    assert s.put("huge", torch.zeros(10_000)) is None  # no room: None, nothing changed
    assert "huge" not in s and torch.equal(s.get("latents"), y)
    s.delete("latents")
    assert len(s) == 0 and pool.num_free_pages == 16
    with pytest.raises(KeyError, match="latents"):
        s.get("latents")


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8]


@st.composite
def named_tensors(draw):
    out = {}
    for i in range(draw(st.integers(1, 5))):
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        seed = draw(st.integers(0, 2**16))
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, 2**15, shape, generator=g)
        x = x.to(torch.float32).div(7).to(dtype) if dtype.is_floating_point else x.to(dtype)
        row_ndim = draw(st.integers(0, len(shape))) if shape else None
        if row_ndim is not None and not 0 < math.prod(shape[len(shape) - row_ndim:]) * \
                dtype.itemsize <= 128:
            row_ndim = None  # a row must be non-empty and fit in a 128-byte page
        out[f"t{i}"] = (x, row_ndim)
    return out


@settings(max_examples=60, deadline=None)
@given(tensors=named_tensors(), filler=st.integers(0, 20))
def test_any_state_roundtrips_bit_exact(tensors, filler):
    pool = PagePool(num_pages=256, page_bytes=128)
    host = HostPool(num_pages=256, page_bytes=128)
    eng = OffloadEngine(pool, host, mode="sync")
    s = RequestState(pool)
    for name, (x, row_ndim) in tensors.items():
        assert s.put(name, x, row_ndim=row_ndim) is not None
    s.offload(eng)
    held = pool.allocate(filler)  # restore lands in other pages
    assert s.restore(eng)
    for name, (x, _) in tensors.items():
        y = s.get(name)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert torch.equal(y.reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8))
    s.free()
    pool.free(held)
    assert pool.num_free_pages == 256 and host.num_free_pages == 256
