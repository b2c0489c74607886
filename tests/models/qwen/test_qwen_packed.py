"""Patched Qwen-Image transformer: packed multi-request forward vs the unpatched model."""

import pytest
import torch

import ditmem
import ditmem.models as dm
from ditmem.models.qwen.tiny import build_pipeline


@pytest.fixture(scope="module")
def pipe():
    return build_pipeline(seed=0)


def _request(g, h, w, s_txt, valid=None, t=0.5, latents=None):
    """Batch-1 forward kwargs; ``valid``: None (no mask), an int (first n tokens valid) or
    a list of 0/1 (any pattern)."""
    if valid is None:
        mask = None
    elif isinstance(valid, int):
        mask = (torch.arange(s_txt) < valid).long()[None]
    else:
        mask = torch.tensor(valid)[None]
    return dict(
        hidden_states=torch.randn(1, h * w, 16, generator=g) if latents is None else latents,
        encoder_hidden_states=torch.randn(1, s_txt, 32, generator=g),
        encoder_hidden_states_mask=mask,
        timestep=torch.tensor([t]),
        img_shapes=[[(1, h, w)]],
    )


def _stock(model, kws):
    with torch.no_grad():
        return [model(**kw, return_dict=False)[0] for kw in kws]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _mixed(g):
    cfg_latents = torch.randn(1, 6 * 10, 16, generator=g)
    return [
        _request(g, 8, 8, 20, None, 0.999),
        _request(g, 5, 7, 33, 25, 0.31),  # odd grid, padded text mask
        _request(g, 16, 16, 12, 12, 0.5),  # all-ones mask
        _request(g, 3, 1, 9, [1, 0, 1, 1, 0, 0, 1, 0, 1], 0.02),  # non-contiguous mask
        _request(g, 6, 10, 15, 11, 0.7, cfg_latents),  # CFG: same latents, two texts
        _request(g, 6, 10, 40, 30, 0.7, cfg_latents),
    ]


def test_packed_matches_unpatched_per_request(pipe):
    model = pipe.transformer
    kws = _mixed(torch.Generator().manual_seed(1))
    ref = _stock(model, kws)
    adapter = ditmem.patch(model)
    try:
        outs = adapter.forward_packed(kws)
    finally:
        adapter.unpatch()
    assert len(outs) == len(ref)
    for r, o in zip(ref, outs, strict=True):
        assert o.shape == r.shape
        assert _rel(o, r) <= 1e-4
    # the requests really differ (the test would not pass by returning one output)
    assert _rel(outs[4], outs[5]) > 1e-3


def test_patched_plain_forward_with_batch_and_mask(pipe):
    model = pipe.transformer
    g = torch.Generator().manual_seed(2)
    kw = dict(
        hidden_states=torch.randn(2, 48, 16, generator=g),
        encoder_hidden_states=torch.randn(2, 12, 32, generator=g),
        encoder_hidden_states_mask=torch.tensor([[1] * 12, [1] * 7 + [0] * 5]),
        timestep=torch.tensor([0.5, 0.2]),
        img_shapes=[[(1, 6, 8)]] * 2,
    )
    (ref,) = _stock(model, [kw])
    adapter = ditmem.patch(model)
    try:
        (out,) = _stock(model, [kw])
    finally:
        adapter.unpatch()
    assert _rel(out, ref) <= 1e-4


def test_unpatch_restores_exactly(pipe):
    model = pipe.transformer
    kws = _mixed(torch.Generator().manual_seed(3))[:2]
    before_procs = dict(model.attn_processors)
    before = _stock(model, kws)
    adapter = ditmem.patch(model)
    assert all(type(p).__name__ == "DitmemQwenAttnProcessor"
               for p in model.attn_processors.values())
    adapter.unpatch()
    adapter.unpatch()  # idempotent
    after_procs = dict(model.attn_processors)
    assert after_procs.keys() == before_procs.keys()
    assert all(after_procs[k] is before_procs[k] for k in before_procs)
    for a, b in zip(_stock(model, kws), before, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="unpatched"):
        adapter.forward_packed(kws)


def test_patch_pipeline_and_unsupported_class(pipe):
    adapter = dm.patch(pipe)
    try:
        assert adapter.model is pipe.transformer
    finally:
        adapter.unpatch()
    with pytest.raises(TypeError, match="QwenImageTransformer2DModel"):
        ditmem.patch(torch.nn.Linear(2, 2))


def test_batch_composition_does_not_change_a_request(pipe):
    """A request's output is bit-identical whether it runs alone or packed with others."""
    kws = _mixed(torch.Generator().manual_seed(4))
    adapter = ditmem.patch(pipe.transformer)
    try:
        together = adapter.forward_packed(kws)
        for i in (0, 1, 3):
            (alone,) = adapter.forward_packed([kws[i]])
            assert torch.equal(alone, together[i])
        swapped = adapter.forward_packed([kws[2], kws[0]])
        assert torch.equal(swapped[1], together[0])
    finally:
        adapter.unpatch()


def test_block_chunks_equal_full_forward(pipe):
    kws = _mixed(torch.Generator().manual_seed(5))[:3]
    adapter = ditmem.patch(pipe.transformer)
    try:
        full = adapter.forward_packed(kws)
        batch = adapter.prepare(kws)
        adapter.run_blocks(batch, 0, 1)
        with pytest.raises(ValueError, match="blocks_done"):
            adapter.run_blocks(batch, 0, 1)
        with pytest.raises(ValueError, match="blocks have run"):
            adapter.finish(batch)
        adapter.run_blocks(batch, 1, adapter.num_blocks)
        for a, b in zip(adapter.finish(batch), full, strict=True):
            assert torch.equal(a, b)
    finally:
        adapter.unpatch()


def test_bad_kwargs(pipe):
    g = torch.Generator().manual_seed(6)
    adapter = ditmem.patch(pipe.transformer)
    try:
        kw = _request(g, 4, 4, 5)
        with pytest.raises(ValueError, match="empty"):
            adapter.forward_packed([])
        bad = dict(kw, hidden_states=torch.randn(2, 16, 16))
        with pytest.raises(ValueError, match=r"request 1 hidden_states"):
            adapter.forward_packed([kw, bad])
        with pytest.raises(ValueError, match="mask"):
            adapter.forward_packed([dict(kw, encoder_hidden_states_mask=torch.ones(1, 3))])
        with pytest.raises(ValueError, match="guidance"):
            adapter.forward_packed([dict(kw, guidance=torch.ones(1))])
    finally:
        adapter.unpatch()
