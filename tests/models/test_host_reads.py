"""Plan once, run per layer: a packed step reads the device back on the host a fixed number
of times, whatever the number of transformer blocks (counted for the same requests on a
2-block and a 4-block model, Qwen-Image and Wan, with text K/V packed or cached in pages).

Host reads are counted at the Python boundary where a tensor value becomes a Python value
(``Tensor.tolist/item/__bool__/__int__/__index__/__float__``), plus calls of the
per-call validation of ``paged_attention`` (which reads its index tensors)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import ditmem
from ditmem.memory import PagePool
from ditmem.ops import validation

READS = ("tolist", "item", "__bool__", "__int__", "__index__", "__float__")


@contextlib.contextmanager
def counting(monkeypatch):
    counts: dict[str, int] = {}

    def wrap(owner, name):
        original = getattr(owner, name)

        def counted(*args, **kw):
            counts[name] = counts.get(name, 0) + 1
            return original(*args, **kw)

        monkeypatch.setattr(owner, name, counted)

    for name in READS:
        wrap(torch.Tensor, name)
    wrap(validation, "check_paged_attention")
    try:
        yield counts
    finally:
        monkeypatch.undo()


def _qwen(layers):
    from diffusers import QwenImageTransformer2DModel

    from ditmem.models.qwen.tiny import TRANSFORMER_CONFIG

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(**{**TRANSFORMER_CONFIG, "num_layers": layers}).eval()


def _qwen_requests(channels, text_dim):
    g = torch.Generator().manual_seed(1)
    out = []
    for h, w, s_txt in ((8, 8, 20), (5, 7, 13), (16, 16, 9)):
        out.append(dict(hidden_states=torch.randn(1, h * w, channels, generator=g),
                        encoder_hidden_states=torch.randn(1, s_txt, text_dim, generator=g),
                        encoder_hidden_states_mask=None, timestep=torch.tensor([0.5]),
                        img_shapes=[[(1, h, w)]]))
    return out


def _wan_requests():
    g = torch.Generator().manual_seed(2)
    return [dict(hidden_states=torch.randn(1, 4, f, h, w, generator=g),
                 timestep=torch.tensor([t]),
                 encoder_hidden_states=torch.randn(1, n, 32, generator=g))
            for f, h, w, n, t in ((3, 8, 8, 16, 999), (1, 6, 10, 7, 500), (2, 16, 16, 12, 875))]


def _reads_per_step(monkeypatch, adapter, kws):
    adapter.forward_packed(kws)  # warm-up: lazily built state is not per step
    with counting(monkeypatch) as counts:
        adapter.forward_packed(kws)
    return counts


def test_qwen_host_reads_do_not_grow_with_blocks(monkeypatch):
    results = {}
    for layers in (2, 4):
        model = _qwen(layers)
        cfg = model.config
        adapter = ditmem.patch(model)
        kws = _qwen_requests(cfg.in_channels, cfg.joint_attention_dim)
        results[layers] = _reads_per_step(monkeypatch, adapter, kws)
    assert results[2] == results[4], results
    assert results[2].get("check_paged_attention", 0) == 0  # every layer runs on the plan


@pytest.mark.parametrize("cached", [False, True])
def test_wan_host_reads_do_not_grow_with_blocks(monkeypatch, cached):
    from ditmem.models.wan.tiny import build_tiny_transformer

    results = {}
    for layers in (2, 4):
        model = build_tiny_transformer(num_layers=layers)
        adapter = ditmem.patch(model)
        kws = _wan_requests()
        if cached:
            pool = PagePool(256, 1 << 14)
            kws = [{"hidden_states": kw["hidden_states"], "timestep": kw["timestep"],
                    "cross_kv": adapter.cache_cross_kv(kw["encoder_hidden_states"], pool)}
                   for kw in kws]
        results[layers] = _reads_per_step(monkeypatch, adapter, kws)
    assert results[2] == results[4], results
    assert results[2].get("check_paged_attention", 0) == 0
