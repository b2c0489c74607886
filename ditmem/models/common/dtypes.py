"""Model dtypes: parse ``--dtype`` values, the per-device default, and casting a diffusers
component the way ``from_pretrained(torch_dtype=...)`` loads it.

``bfloat16`` is the default on CUDA/NPU (tensor cores, half the weight memory); ``float32``
on the CPU (the reference numerics; bf16 also runs there, see docs/results/models.md).
"""

from __future__ import annotations

import torch

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}
#: the names ``--dtype`` offers (aliases above are accepted too)
CHOICES = ("bfloat16", "float16", "float32")


def default_dtype(device) -> torch.dtype:
    """bfloat16 on an accelerator (cuda, npu), float32 on the CPU."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return torch.float32 if kind == "cpu" else torch.bfloat16


def resolve_dtype(dtype, device) -> torch.dtype:
    """``dtype`` (a torch floating dtype, a name such as ``"bfloat16"``/``"bf16"``, or
    ``None`` for :func:`default_dtype` of ``device``) as a ``torch.dtype``; ValueError
    naming the accepted values otherwise."""
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: {dtype} is not one of {', '.join(CHOICES)}")
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.").lower() in DTYPES:
        return DTYPES[dtype.removeprefix("torch.").lower()]
    raise ValueError(f"dtype: expected one of {', '.join(CHOICES)}, got {dtype!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def cast_module(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``module`` to ``dtype`` in place, keeping the submodules its class lists in
    ``_keep_in_fp32_modules`` (Wan: rope, time embedder, norms, modulation tables) in
    float32, as diffusers' ``from_pretrained(torch_dtype=dtype)`` does. Returns ``module``."""
    torch.nn.Module.to(module, dtype=dtype)  # ModelMixin.to warns on every dtype cast
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    if keep and dtype != torch.float32:
        for name, sub in module.named_modules():
            if keep & set(name.split(".")):
                torch.nn.Module.to(sub, dtype=torch.float32)
        for name, param in module.named_parameters():  # bare parameters (scale_shift_table)
            if keep & set(name.split(".")):
                param.data = param.data.float()
    return module


def cast_pipeline(pipe, dtype: torch.dtype):
    """Cast every torch component of a diffusers pipeline with :func:`cast_module`."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            cast_module(component, dtype)
    return pipe
