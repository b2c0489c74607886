"""ditmem.models: diffusers adapters (patched attention, packed mixed-resolution steps)
and step-decomposed generation for the engine.

    adapter = ditmem.patch(transformer)          # or a pipeline: patches transformer(_2)
    outs = adapter.forward_packed([kw1, kw2])    # one forward over several requests
    adapter.unpatch()

    gen = ditmem.models.load("tiny-qwen-image")  # or "tiny-wan", or a diffusers folder
    state = gen.encode(GenerationRequest(...), pool)
    gen.step([state, ...]); image = gen.decode(state)
"""

from __future__ import annotations

from ditmem.models.common.request import GenerationRequest

SUPPORTED = {
    "QwenImageTransformer2DModel": "ditmem.models.qwen",
    "WanTransformer3DModel": "ditmem.models.wan",
}

EMBEDDED = {
    "tiny-qwen-image": "ditmem.models.qwen",
    "tiny-wan": "ditmem.models.wan",
}


def _module(name: str):
    import importlib

    return importlib.import_module(name)


def patch(model):
    """Patch a supported diffusers transformer, or a pipeline holding one or two of them.

    Returns an adapter (``forward_packed``, ``unpatch``); for a pipeline with
    ``transformer_2`` (Wan2.2 A14B) a handle whose ``unpatch`` undoes both.
    Raises TypeError naming the supported classes for anything else.
    """
    transformers = [getattr(model, a, None) for a in ("transformer", "transformer_2")]
    transformers = [t for t in transformers if t is not None]
    if transformers:
        adapters = [patch(t) for t in transformers]
        return adapters[0] if len(adapters) == 1 else PatchGroup(adapters)
    cls = type(model).__name__
    if cls not in SUPPORTED:
        raise TypeError(
            f"ditmem.patch: unsupported model class {cls}; supported: {', '.join(SUPPORTED)} "
            "(or a diffusers pipeline holding one as .transformer)"
        )
    return _module(SUPPORTED[cls]).patch(model)


class PatchGroup:
    """Adapters of a pipeline with two transformers (Wan2.2 A14B experts)."""

    def __init__(self, adapters):
        self.adapters = adapters

    def unpatch(self) -> None:
        for a in self.adapters:
            a.unpatch()


def load(name_or_path: str, *, device="cpu", dtype=None, **kwargs):
    """Build a step-decomposed generator: an embedded tiny model by name or a local folder
    with real diffusers weights (``from_pretrained``, every component on ``device``).

    ``dtype``: ``torch.bfloat16|float16|float32`` or its name (``"bf16"`` ...); ``None``
    means bfloat16 on CUDA/NPU and float32 on the CPU (``ditmem.models.common.dtypes``). Other
    kwargs: see the model modules. ValueError for an unknown dtype or path."""
    import logging
    import time

    from ditmem.models.common.dtypes import resolve_dtype

    kwargs["device"] = device
    kwargs["dtype"] = resolve_dtype(dtype, device)
    t0 = time.perf_counter()
    generator = _load(name_or_path, kwargs)
    logging.getLogger(__name__).info("loaded %s on %s in %s (%.1f s)", name_or_path, device,
                                     kwargs["dtype"], time.perf_counter() - t0)
    return generator


def _load(name_or_path: str, kwargs: dict):
    if name_or_path in EMBEDDED:
        return _module(EMBEDDED[name_or_path]).load(name_or_path, **kwargs)
    import json
    import os

    index = os.path.join(name_or_path, "model_index.json")
    if not os.path.isfile(index):
        raise ValueError(
            f"ditmem.models.load: {name_or_path!r} is neither an embedded model "
            f"({', '.join(EMBEDDED)}) nor a diffusers folder with model_index.json"
        )
    with open(index) as f:
        pipeline_class = json.load(f).get("_class_name", "")
    module = "ditmem.models.wan" if pipeline_class.startswith("Wan") else "ditmem.models.qwen"
    return _module(module).load(name_or_path, **kwargs)


def __getattr__(name: str):
    """``decode_job`` (``from ditmem.models import decode_job``, as the README shows) loads
    :mod:`ditmem.models.common.tiled_decode` on first use, not with the package."""
    if name == "decode_job":
        from ditmem.models.common.tiled_decode import decode_job

        return decode_job
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GenerationRequest", "decode_job", "patch", "load", "SUPPORTED", "EMBEDDED"]
