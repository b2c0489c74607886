"""Qwen-Image entry points: ``patch(model)`` and ``load(name_or_path, **kw)``."""

from __future__ import annotations

import torch

from ditmem.models.qwen.packed import QwenAdapter


def patch(model, block_size: int = 64) -> QwenAdapter:
    """Replace every attention processor of a ``QwenImageTransformer2DModel`` with ditmem's
    paged joint-attention processor; returns a :class:`QwenAdapter` (``forward_packed``,
    ``prepare``/``run_blocks``/``finish``, ``unpatch``)."""
    if type(model).__name__ != "QwenImageTransformer2DModel":
        raise TypeError(
            f"ditmem.models.qwen.patch: expected QwenImageTransformer2DModel, got "
            f"{type(model).__name__}"
        )
    return QwenAdapter(model, block_size=block_size)


def load(
    name_or_path: str = "tiny-qwen-image",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    block_size: int = 64,
):
    """Build a :class:`~ditmem.models.qwen.generate.QwenGenerator`.

    ``"tiny-qwen-image"`` builds the embedded tiny pipeline (weights from ``seed``); a folder
    with ``model_index.json`` loads real weights with ``QwenImagePipeline.from_pretrained``
    (every component on ``device``). ``dtype``: see :func:`ditmem.models.load`.
    """
    from ditmem.models.common.dtypes import resolve_dtype
    from ditmem.models.qwen.generate import QwenGenerator

    dtype = resolve_dtype(dtype, device)
    if name_or_path == "tiny-qwen-image":
        from ditmem.models.qwen.tiny import build_pipeline

        pipe = build_pipeline(seed=seed, dtype=dtype, device=str(device))
    else:
        from diffusers import QwenImagePipeline

        pipe = QwenImagePipeline.from_pretrained(name_or_path, torch_dtype=dtype).to(device)
        pipe.set_progress_bar_config(disable=True)
    return QwenGenerator(pipe, name=name_or_path, block_size=block_size)
