"""Two CPU fast paths for the Qwen-Image and Wan VAEs, patched per module instance.

* **conv3d through oneDNN.** PyTorch sends an fp32 ``conv3d`` on the CPU to oneDNN only when
  ``N·C·T·H`` of its input exceeds 20,480 (a heuristic written for 4-D inputs); below that
  it runs ``aten::slow_conv3d``. These VAEs decode one latent frame at a time (``T`` = 1 + 2
  cached frames), so with few channels — the embedded tiny models, or a VAE's narrow last
  layers — every causal convolution takes the slow path. :func:`conv3d` calls
  ``torch.mkldnn_convolution``, the kernel PyTorch itself uses above the threshold
  (bit-identical there).
* **RMS norm over channels by a sum of squares.** The VAEs' ``*RMS_norm`` layers call
  ``F.normalize(x, dim=1)``, whose ``linalg_vector_norm`` over a non-innermost dimension of
  a 5-D tensor runs 10-40 × slower on the CPU than ``(x * x).sum(1)`` (4 channels at
  1024²: 71 vs 2 ms). :func:`rms_norm` computes the same ``x / max(‖x‖₂, 1e-12)``, then the
  layer's ``scale · gamma + bias``.

A 1024² decode of ``tiny-qwen-image`` goes from ~3.1 to ~0.7 s (``benchmarks/models/
bench_vae_decode.py``, docs/results/models.md). The results are summed in another order:
within 1e-6 relative per layer, 1e-4 after a whole decode, uint8 images within one level
(``tests/models/common/test_cpu_vae.py``). Each call keeps the stock path when its input
is not an fp32 CPU tensor, a convolution pads other than with zeros or groups its channels,
oneDNN is not built in or is switched off (``torch.backends.mkldnn``), or a norm is not
channel-first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

log = logging.getLogger(__name__)

#: F.normalize's floor on the norm
NORM_EPS = 1e-12


def onednn_ready() -> bool:
    """Whether this torch build has oneDNN and it is switched on."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


def conv3d(module: nn.Conv3d, x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None) -> torch.Tensor:
    """``module``'s convolution of ``x`` ``[N, C, T, H, W]``: oneDNN for an fp32 CPU input,
    else the module class's own ``_conv_forward`` (torch's dispatch, its padding modes).
    Returns ``[N, O, T', H', W']`` in ``x``'s dtype."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and module.padding_mode == "zeros" and module.groups == 1
            and not isinstance(module.padding, str) and onednn_ready()):
        return torch.mkldnn_convolution(x, weight, bias, module.padding, module.stride,
                                        module.dilation, module.groups)
    return type(module)._conv_forward(module, x, weight, bias)


def is_rms_norm(module: nn.Module) -> bool:
    """A diffusers VAE RMS norm (``QwenImageRMS_norm``, ``WanRMS_norm``): the attributes
    :func:`rms_norm` reads."""
    return (type(module).__name__.endswith("RMS_norm")
            and all(hasattr(module, a) for a in ("channel_first", "scale", "gamma", "bias")))


def rms_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s forward on ``x`` ``[N, C, ...]``: ``x / max(‖x‖₂ over C, 1e-12) · scale ·
    gamma + bias`` by a sum of squares for a channel-first fp32 CPU input, else the module
    class's own forward. Same shape and dtype as ``x``."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and module.channel_first:
        norm = (x * x).sum(1, keepdim=True).sqrt_().clamp_min_(NORM_EPS)
        return x / norm * module.scale * module.gamma + module.bias
    return type(module).forward(module, x)


@dataclass(slots=True)
class VaePatch:
    """The handle :func:`speed_up_vae` returns: the patched modules; ``undo()`` puts the
    stock paths back."""

    convs: list[nn.Conv3d] = field(default_factory=list)
    norms: list[nn.Module] = field(default_factory=list)

    @classmethod
    def found_in(cls, vae: nn.Module) -> VaePatch:
        """The handle of the modules under ``vae`` that are patched now (e.g. in a
        ``copy.deepcopy`` of a patched VAE, whose copies carry their own routing)."""
        return cls([m for m in vae.modules() if "_conv_forward" in m.__dict__],
                   [m for m in vae.modules() if "forward" in m.__dict__])

    def undo(self) -> None:
        for m in self.convs:
            m.__dict__.pop("_conv_forward", None)
        for m in self.norms:
            m.__dict__.pop("forward", None)
        self.convs.clear()
        self.norms.clear()


def speed_up_vae(vae: nn.Module) -> VaePatch:
    """Route every ``nn.Conv3d`` under ``vae`` through :func:`conv3d` and every RMS norm
    through :func:`rms_norm`, per instance (the classes are untouched); returns the handle
    that undoes it. Modules already routed are left as they are."""
    patch = VaePatch()
    for m in vae.modules():
        if isinstance(m, nn.Conv3d) and "_conv_forward" not in m.__dict__:
            m._conv_forward = partial(conv3d, m)
            patch.convs.append(m)
        elif is_rms_norm(m) and "forward" not in m.__dict__:
            m.forward = partial(rms_norm, m)
            patch.norms.append(m)
    if patch.convs and not onednn_ready():
        log.info("oneDNN is %s in this torch build: %d VAE conv3d layers keep torch's own "
                 "dispatch", "off" if torch.backends.mkldnn.is_available() else "missing",
                 len(patch.convs))
    return patch
