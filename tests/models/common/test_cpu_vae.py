"""The VAE's CPU fast paths vs torch's own conv3d dispatch and the stock RMS norm, and a
patched VAE's decode vs an unpatched one (the references)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ditmem.models as dm
from ditmem.models.common.cpu_vae import (
    VaePatch,
    conv3d,
    is_rms_norm,
    onednn_ready,
    rms_norm,
    speed_up_vae,
)

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


def _unpatched(vae):
    stock = copy.deepcopy(vae)
    VaePatch.found_in(stock).undo()
    return stock


@pytest.mark.parametrize("model", ["tiny-qwen-image", "tiny-wan"])
def test_patch_routes_every_conv3d_and_norm_and_undo_restores_them(model):
    vae = dm.load(model).pipe.vae  # the generator already patched its VAE
    convs = [m for m in vae.modules() if isinstance(m, nn.Conv3d)]
    norms = [m for m in vae.modules() if is_rms_norm(m)]
    assert convs and norms
    assert all("_conv_forward" in m.__dict__ for m in convs)
    assert all("forward" in m.__dict__ for m in norms)
    again = speed_up_vae(vae)
    assert again.convs == [] and again.norms == []  # already patched: nothing twice
    fresh = _unpatched(vae)
    patch = speed_up_vae(fresh)
    assert (len(patch.convs), len(patch.norms)) == (len(convs), len(norms))
    patch.undo()
    assert not any({"_conv_forward", "forward"} & m.__dict__.keys() for m in fresh.modules())


@pytest.mark.parametrize("model", ["tiny-qwen-image", "tiny-wan"])
def test_rms_norm_equals_the_stock_norm(model):
    stock = _unpatched(dm.load(model).pipe.vae)
    torch.manual_seed(0)
    for m in (m for m in stock.modules() if is_rms_norm(m)):
        with torch.no_grad():
            m.gamma.uniform_(0.5, 1.5)
            if isinstance(m.bias, torch.Tensor):
                m.bias.uniform_(-0.1, 0.1)
        c = m.gamma.shape[0]
        shape = (2, c, 3, 5, 7) if m.gamma.dim() == 4 else (2, c, 5, 7)
        x = torch.randn(shape) * 3
        x[0, :, 0] = 0.0  # a zero vector: the 1e-12 floor, no NaN
        with torch.no_grad():
            ref, out = m(x), rms_norm(m, x)
            assert torch.equal(rms_norm(m, x.double()), m(x.double()))  # not routed
        assert out.shape == ref.shape and torch.isfinite(out).all()
        assert _rel(out, ref) < 1e-6


@pytest.mark.parametrize("model, latent", [
    ("tiny-qwen-image", (1, 4, 1, 32, 40)),  # one image: the decode the demo runs
    ("tiny-wan", (1, 4, 3, 8, 8)),           # 9 frames: the causal cache across frames
])
def test_vae_decode_equals_the_unpatched_vae(model, latent):
    routed = dm.load(model).pipe.vae
    stock = _unpatched(routed)
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
    """The mechanism of the speed-up: torch's slow_conv3d and its channel vector norm are
    gone from the decode."""
    from torch.profiler import ProfilerActivity, profile

    routed = dm.load("tiny-qwen-image").pipe.vae
    stock = _unpatched(routed)
    z = torch.randn(1, 4, 1, 16, 16)

    def kernels(vae):
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            vae.decode(z)
        return {e.key for e in prof.key_averages()}

    slow = {"aten::slow_conv3d_forward", "aten::linalg_vector_norm"}
    assert slow <= kernels(stock)
    routed_kernels = kernels(routed)
    assert not slow & routed_kernels
    assert "aten::mkldnn_convolution" in routed_kernels

