"""RequestState: named tensors + scalars, bit-exact round trip through the host."""

import pytest
import torch

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
