"""What the front process of ``ditmem serve --devices N`` loads of the model: only what the
request checks need.

The device workers run the model; the front only checks requests before they reach the
node loop (``ModelRules`` — size multiples, frame steps, the scheduler's step rules —,
the tokenizer's prompt length, ``estimate_pages``) and names the cost model's key. So it
builds the model's own generator class over a pipeline whose networks (transformers, VAE,
text encoder) are created from their configs on the ``meta`` device — shapes and configs,
no weights in memory — with the real tokenizer and scheduler. The checks are the same code
as on a device (the generator's own ``estimate_pages``); running the model (``encode``,
``step``, ``decode``) on this generator fails (meta tensors hold no data).

* embedded tiny models: their configs (``ditmem.models.<model>.tiny``), no seeded weights;
* a diffusers folder: each network's ``config.json`` (``from_config``), tokenizer and
  scheduler ``from_pretrained`` (small files); no weight file is opened.
"""

from __future__ import annotations

import json
import os

import torch

META = torch.device("meta")


def weight_bytes(generator) -> int:
    """Bytes of parameters and buffers the generator's networks hold in memory (meta
    tensors hold none)."""
    total = 0
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        module = getattr(generator.pipe, name, None)
        if module is None:
            continue
        for t in (*module.parameters(), *module.buffers()):
            if not t.is_meta:
                total += t.numel() * t.element_size()
    return total


def load_for_checks(model: str, dtype=None):
    """The generator of ``model`` (an embedded name or a diffusers folder) for request
    checks only (see module docstring); ``dtype`` as ``ditmem.models.load`` takes it on
    the CPU (it sets the page estimate's element size). ValueError for an unknown model."""
    from ditmem.models import EMBEDDED
    from ditmem.models.common.dtypes import resolve_dtype

    dtype = resolve_dtype(dtype, "cpu")
    if model in EMBEDDED:
        kind = "wan" if model == "tiny-wan" else "qwen"
        pipe = _tiny_wan() if kind == "wan" else _tiny_qwen()
    else:
        kind, pipe = _folder(model)
    _cast(pipe, dtype)
    if kind == "wan":
        return _wan_generator(pipe, model)
    from ditmem.models.qwen.generate import QwenGenerator

    return QwenGenerator(pipe, name=model)


def _cast(pipe, dtype: torch.dtype) -> None:
    from ditmem.models.common.dtypes import cast_pipeline

    if dtype != torch.float32:
        cast_pipeline(pipe, dtype)  # meta tensors: only their dtype changes


def _wan_generator(pipe, name: str):
    from ditmem.models.wan.generate import WanGenerator
    from ditmem.models.wan.solver import SolverSchedules

    gen = WanGenerator(pipe, name=name)
    # the step schedule (expert per step, in the page estimate) on the CPU, not on meta
    gen.schedules = SolverSchedules(pipe.scheduler, "cpu")
    return gen


def _tiny_qwen():
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    from ditmem.models.common.tokenizer import qwen_tokenizer
    from ditmem.models.qwen import tiny

    with META:
        transformer = QwenImageTransformer2DModel(**tiny.TRANSFORMER_CONFIG)
        vae = AutoencoderKLQwenImage(**tiny.VAE_CONFIG)
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**tiny.SCHEDULER_CONFIG),
                             vae=vae, text_encoder=None, tokenizer=qwen_tokenizer(),
                             transformer=transformer)


def _tiny_wan():
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    from ditmem.models.common.tokenizer import t5_tokenizer
    from ditmem.models.wan import tiny

    with META:
        transformer = WanTransformer3DModel(**tiny.TRANSFORMER_CONFIG)
        vae = AutoencoderKLWan(**tiny.VAE_CONFIG)
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=None, vae=vae,
                       scheduler=UniPCMultistepScheduler(**tiny.SCHEDULER_CONFIG),
                       transformer=transformer)


def _folder(path: str):
    """(kind, pipeline) of a diffusers folder: networks from their configs on meta."""
    import diffusers
    import transformers

    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        raise ValueError(f"model: {path!r} is neither an embedded model nor a diffusers "
                         "folder with model_index.json")
    with open(index_path) as f:
        index = json.load(f)
    pipeline_cls = getattr(diffusers, index.get("_class_name", ""), None)
    if pipeline_cls is None:
        raise ValueError(f"model: {path}: unknown pipeline class {index.get('_class_name')!r}")
    parts = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or len(spec) != 2:
            continue
        library, cls_name = spec
        if cls_name is None:
            parts[name] = None
            continue
        cls = getattr({"diffusers": diffusers, "transformers": transformers}.get(library),
                      cls_name, None)
        if cls is None:
            raise ValueError(f"model: {path}: component {name!r} is {library}.{cls_name}, "
                             "not a class of diffusers or transformers")
        sub = os.path.join(path, name)
        if name in ("tokenizer", "scheduler"):
            parts[name] = cls.from_pretrained(sub)
        elif name == "text_encoder":
            parts[name] = None  # the front never encodes text
        elif library == "diffusers":
            with META:
                parts[name] = cls.from_config(cls.load_config(sub))
        else:
            parts[name] = None
    extra = {k: v for k, v in index.items() if not k.startswith("_")
             and not isinstance(v, list)}
    pipe = pipeline_cls(**parts, **extra)
    kind = "wan" if index.get("_class_name", "").startswith("Wan") else "qwen"
    return kind, pipe
