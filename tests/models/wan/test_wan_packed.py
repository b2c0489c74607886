"""Patched Wan transformer: packed multi-request forward vs the unpatched model."""

import pytest
import torch

import ditmem
import ditmem.models as dm
from ditmem.models.wan.tiny import build_pipeline, build_tiny_transformer


def _request(g, frames, h, w, text_len, t, latents=None):
    """Batch-1 forward kwargs of the tiny model (4 latent channels, text_dim 32)."""
    return dict(
        hidden_states=torch.randn(1, 4, frames, h, w, generator=g) if latents is None
        else latents,
        timestep=torch.tensor([t]),
        encoder_hidden_states=torch.randn(1, text_len, 32, generator=g),
    )


def _mixed(g):
    cfg_latents = torch.randn(1, 4, 2, 6, 10, generator=g)
    return [
        _request(g, 3, 8, 8, 16, 999),
        _request(g, 1, 6, 10, 7, 500),        # one frame, non-square grid 3x5
        _request(g, 5, 2, 14, 23, 37),        # 1x7 grid, odd text length
        _request(g, 2, 16, 16, 12, 875),      # 128 tokens: several attention blocks
        _request(g, 2, 6, 10, 9, 640, cfg_latents),   # CFG: same latents, two texts
        _request(g, 2, 6, 10, 9, 640, cfg_latents),
    ]


def _stock(model, kws):
    with torch.no_grad():
        return [model(**kw, return_dict=False)[0] for kw in kws]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture()
def model():
    return build_tiny_transformer()


def test_packed_matches_unpatched_per_request(model):
    kws = _mixed(torch.Generator().manual_seed(1))
    ref = _stock(model, kws)
    adapter = ditmem.patch(model)
    outs = adapter.forward_packed(kws)
    assert len(outs) == len(kws)
    for out, r, kw in zip(outs, ref, kws, strict=True):
        assert out.shape == kw["hidden_states"].shape == r.shape
        assert _rel(out, r) <= 1e-4
    # The requests really differ (CFG branches included), so matching each is not trivial.
    assert _rel(outs[4], outs[5]) > 1e-2


def test_patched_stock_forward_is_ditmem_and_matches(model):
    g = torch.Generator().manual_seed(2)
    kw = dict(hidden_states=torch.randn(2, 4, 3, 6, 8, generator=g),
              timestep=torch.tensor([999, 120]),
              encoder_hidden_states=torch.randn(2, 11, 32, generator=g))
    (ref,) = _stock(model, [kw])
    adapter = ditmem.patch(model)
    from ditmem.models.wan.attention import WanCrossAttention, WanSelfAttention

    kinds = {type(p) for p in model.attn_processors.values()}
    assert kinds == {WanSelfAttention, WanCrossAttention}
    (out,) = _stock(model, [kw])
    assert _rel(out, ref) <= 1e-4
    adapter.unpatch()


def test_unpatch_restores_exact_processors_and_outputs(model):
    kws = _mixed(torch.Generator().manual_seed(3))[:2]
    before = _stock(model, kws)
    original = dict(model.attn_processors)
    adapter = dm.patch(model)
    adapter.forward_packed(kws)
    adapter.unpatch()
    adapter.unpatch()  # idempotent
    after = _stock(model, kws)
    assert all(model.attn_processors[k] is v for k, v in original.items())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with pytest.raises(RuntimeError, match="unpatched"):
        adapter.forward_packed(kws)
    adapter.repatch()
    assert _rel(adapter.forward_packed(kws)[0], before[0]) <= 1e-4
    adapter.unpatch()


def test_per_token_timesteps_match_stock(model):
    g = torch.Generator().manual_seed(4)
    a = _request(g, 2, 4, 6, 8, 0)
    b = _request(g, 1, 6, 6, 5, 300)
    tokens = 2 * 2 * 3
    a["timestep"] = torch.linspace(0, 999, tokens)[None]  # Wan2.2 TI2V style [1, S]
    ref = _stock(model, [a, b])
    outs = dm.patch(model).forward_packed([a, b])
    for out, r in zip(outs, ref, strict=True):
        assert _rel(out, r) <= 1e-4


def test_block_ranges_equal_one_forward(model):
    kws = _mixed(torch.Generator().manual_seed(5))[:3]
    adapter = dm.patch(model)
    whole = adapter.forward_packed(kws)
    batch = adapter.prepare(kws)
    with pytest.raises(ValueError, match="next range"):
        adapter.run_blocks(batch, 1, 2)
    with pytest.raises(ValueError, match="blocks ran"):
        adapter.finish(batch)
    adapter.run_blocks(batch, 0, 1)
    adapter.run_blocks(batch, 1, adapter.num_blocks)
    parts = adapter.finish(batch)
    assert all(torch.equal(a, b) for a, b in zip(whole, parts, strict=True))


def test_fused_projections(model):
    kws = _mixed(torch.Generator().manual_seed(6))[:3]
    model.fuse_qkv_projections()
    ref = _stock(model, kws)
    outs = dm.patch(model).forward_packed(kws)
    for out, r in zip(outs, ref, strict=True):
        assert _rel(out, r) <= 1e-4


def test_bad_inputs_raise_clear_errors(model):
    adapter = dm.patch(model)
    g = torch.Generator().manual_seed(7)
    good = _request(g, 1, 4, 4, 5, 10)
    with pytest.raises(ValueError, match="empty"):
        adapter.forward_packed([])
    with pytest.raises(ValueError, match=r"hidden_states.*\[1, C, F, H, W\]"):
        adapter.forward_packed([{**good, "hidden_states": torch.randn(4, 1, 4, 4)}])
    with pytest.raises(ValueError, match="divisible by the patch"):
        adapter.forward_packed([{**good, "hidden_states": torch.randn(1, 4, 1, 5, 4)}])
    with pytest.raises(ValueError, match="timestep"):
        adapter.forward_packed([{**good, "timestep": torch.tensor([1.0, 2.0])}])
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        adapter.forward_packed([{**good, "encoder_hidden_states": torch.randn(5, 32)}])
    with pytest.raises(ValueError, match="missing"):
        adapter.forward_packed([{"hidden_states": good["hidden_states"]}])
    with pytest.raises(TypeError, match="WanTransformer3DModel"):
        dm.patch(torch.nn.Linear(2, 2))
    i2v = build_tiny_transformer(image_dim=8, added_kv_proj_dim=32)
    with pytest.raises(TypeError, match="image K/V projections"):
        dm.patch(i2v)


def test_patch_pipeline_with_two_experts():
    pipe = build_pipeline(two_experts=True)
    originals = [dict(t.attn_processors) for t in (pipe.transformer, pipe.transformer_2)]
    group = dm.patch(pipe)
    assert len(group.adapters) == 2
    assert [a.model for a in group.adapters] == [pipe.transformer, pipe.transformer_2]
    group.unpatch()
    for t, orig in zip((pipe.transformer, pipe.transformer_2), originals, strict=True):
        assert all(t.attn_processors[k] is v for k, v in orig.items())


def test_bfloat16_packed_matches_unpatched_loosely(model):
    model = model.to(torch.bfloat16)
    kws = _mixed(torch.Generator().manual_seed(8))[:3]
    for kw in kws:
        kw["hidden_states"] = kw["hidden_states"].bfloat16()
        kw["encoder_hidden_states"] = kw["encoder_hidden_states"].bfloat16()
    ref = _stock(model, kws)
    outs = dm.patch(model).forward_packed(kws)
    for out, r in zip(outs, ref, strict=True):
        assert out.dtype == torch.bfloat16
        assert _rel(out.float(), r.float()) <= 2e-2


def test_tiny_requests_are_batch_invariant(model):
    """A request's output is bit-identical alone or packed with others, even with fewer
    video tokens than the row count below which BLAS changes bits (the stream is padded)."""
    g = torch.Generator().manual_seed(9)
    kws = [_request(g, 1, 6, 4, 16, 900), _request(g, 1, 2, 6, 16, 300),
           _request(g, 1, 2, 2, 16, 100), _request(g, 3, 16, 16, 16, 200)]
    adapter = dm.patch(model)
    together = adapter.forward_packed(kws)
    for kw, out in zip(kws, together, strict=True):
        assert torch.equal(adapter.forward_packed([kw])[0], out)
    assert torch.equal(adapter.forward_packed(kws[::-1])[0], together[-1])
