"""3-D convolutions of a VAE on the CPU through oneDNN, whatever their size.

PyTorch sends an fp32 ``conv3d`` on the CPU to oneDNN only when ``N·C·T·H`` of its input
exceeds 20,480 (a heuristic written for 4-D inputs); below that it runs
``aten::slow_conv3d``. The causal 3-D convolutions of the Qwen-Image and Wan VAEs decode one
latent frame at a time (``T`` = 1 + 2 cached frames), so with few channels — the embedded tiny
models, or any VAE's narrow last layers — every one of them takes the slow path: a 1024²
decode of ``tiny-qwen-image`` spends two thirds of its time there (docs/results/models.md).
:func:`use_onednn_conv3d` routes those calls to ``torch.mkldnn_convolution``, the kernel
PyTorch itself uses above the threshold (bit-identical there), so only the small calls
change: they are summed in another order, within 1e-6 of the slow path relative to their
magnitude (``tests/models/common/test_cpu_conv.py``).

A call keeps the stock ``F.conv3d`` when the input is not an fp32 CPU tensor, the module
pads other than with zeros or groups its channels, or oneDNN is not built in or is switched
off (``torch.backends.mkldnn``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

log = logging.getLogger(__name__)


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


@dataclass(slots=True)
class OneDnnConvs:
    """The handle :func:`use_onednn_conv3d` returns: the patched modules; ``undo()`` puts
    the stock convolution back."""

    modules: list[nn.Conv3d] = field(default_factory=list)

    def undo(self) -> None:
        for m in self.modules:
            m.__dict__.pop("_conv_forward", None)
        self.modules.clear()


def use_onednn_conv3d(root: nn.Module) -> OneDnnConvs:
    """Route every ``nn.Conv3d`` under ``root`` (the VAE's causal convolutions are
    subclasses) through :func:`conv3d`, per instance (the class is untouched); returns the
    handle that undoes it. Modules already routed are left as they are."""
    handle = OneDnnConvs()
    for m in root.modules():
        if isinstance(m, nn.Conv3d) and "_conv_forward" not in m.__dict__:
            m._conv_forward = partial(conv3d, m)
            handle.modules.append(m)
    if handle.modules and not onednn_ready():
        log.info("oneDNN is %s in this torch build: %d VAE conv3d layers keep torch's own "
                 "dispatch", "off" if torch.backends.mkldnn.is_available() else "missing",
                 len(handle.modules))
    return handle
