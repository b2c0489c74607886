"""VAE conv3d through oneDNN on the CPU vs torch's own conv3d dispatch (the reference)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ditmem.models as dm
from ditmem.models.common.cpu_conv import conv3d, onednn_ready, use_onednn_conv3d

pytestmark = pytest.mark.skipif(not onednn_ready(), reason="this torch build has no oneDNN")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("cin, cout, kernel, stride, padding, dilation, shape", [
    (4, 4, (3, 3, 3), 1, 0, 1, (1, 3, 40, 36)),          # causal conv: T = kernel, small C
    (4, 8, (3, 3, 3), 1, (0, 1, 1), 1, (2, 5, 17, 23)),  # T > kernel, batch 2, odd sides
    (8, 4, (1, 1, 1), 1, 0, 1, (1, 1, 16, 16)),          # 1x1x1 projection
    (4, 4, (3, 1, 1), (2, 1, 1), 0, 1, (1, 6, 8, 8)),    # time conv with a time stride
    (3, 5, (1, 3, 3), (1, 2, 2), (0, 1, 1), (1, 2, 2), (1, 2, 19, 21)),  # stride + dilation
])
def test_conv3d_equals_torch_conv3d(cin, cout, kernel, stride, padding, dilation, shape):
    torch.manual_seed(0)
    conv = nn.Conv3d(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(shape[0], cin, *shape[1:])
    with torch.no_grad():
        ref = F.conv3d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation)
        out = conv3d(conv, x, conv.weight, conv.bias)
        no_bias = conv3d(conv, x, conv.weight, None)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert _rel(out, ref) < 1e-5
    assert _rel(no_bias, ref - conv.bias.view(1, -1, 1, 1, 1)) < 1e-5


def test_what_onednn_cannot_take_keeps_torchs_conv():
    torch.manual_seed(0)
    grouped = nn.Conv3d(4, 4, 3, groups=2)
    circular = nn.Conv3d(2, 2, 3, padding=1, padding_mode="circular")
    x = torch.randn(1, 4, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(conv3d(grouped, x, grouped.weight, grouped.bias), grouped(x))
        x2 = x[:, :2]
        assert torch.equal(conv3d(circular, x2, circular.weight, circular.bias), circular(x2))
        d = circular.double()
        assert torch.equal(conv3d(d, x2.double(), d.weight, d.bias), d(x2.double()))


def test_patch_routes_every_conv3d_and_undo_restores_them():
    vae = dm.load("tiny-qwen-image").pipe.vae  # the generator already routed its VAE
    n = sum(isinstance(m, nn.Conv3d) for m in vae.modules())
    assert n > 0
    assert all("_conv_forward" in m.__dict__ for m in vae.modules() if isinstance(m, nn.Conv3d))
    again = use_onednn_conv3d(vae)
    assert again.modules == []  # already routed: nothing added twice
    fresh = copy.deepcopy(vae)
    for m in fresh.modules():
        m.__dict__.pop("_conv_forward", None)
    handle = use_onednn_conv3d(fresh)
    assert len(handle.modules) == n
    handle.undo()
    assert not any("_conv_forward" in m.__dict__ for m in fresh.modules())


@pytest.mark.parametrize("model, latent", [
    ("tiny-qwen-image", (1, 4, 1, 32, 40)),  # one image: the decode the demo runs
    ("tiny-wan", (1, 4, 3, 8, 8)),           # 9 frames: the causal cache across frames
])
def test_vae_decode_equals_the_unpatched_vae(model, latent):
    routed = dm.load(model).pipe.vae
    stock = copy.deepcopy(routed)
    for m in stock.modules():
        m.__dict__.pop("_conv_forward", None)
    torch.manual_seed(0)
    z = torch.randn(latent)
    with torch.inference_mode():
        ref = stock.decode(z).sample
        out = routed.decode(z).sample
    assert out.shape == ref.shape
    assert _rel(out, ref) < 1e-4
    to8 = lambda t: np.round((t.clamp(-1, 1) / 2 + 0.5).numpy() * 255)  # noqa: E731
    assert np.abs(to8(out) - to8(ref)).max() <= 1


def test_the_routed_decode_runs_no_slow_conv3d():
    """The mechanism of the speed-up: torch's slow_conv3d kernel is gone from the decode."""
    from torch.profiler import ProfilerActivity, profile

    routed = dm.load("tiny-qwen-image").pipe.vae
    stock = copy.deepcopy(routed)
    for m in stock.modules():
        m.__dict__.pop("_conv_forward", None)
    z = torch.randn(1, 4, 1, 16, 16)

    def kernels(vae):
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            vae.decode(z)
        return {e.key for e in prof.key_averages()}

    assert "aten::slow_conv3d_forward" in kernels(stock)
    routed_kernels = kernels(routed)
    assert "aten::slow_conv3d_forward" not in routed_kernels
    assert "aten::mkldnn_convolution" in routed_kernels

