"""The embedded ``tiny-wan`` model: the stock diffusers ``WanPipeline`` with tiny configs
and seeded random weights (no downloads).

Components are the real classes: ``WanTransformer3DModel`` (2 layers, 2 heads of 16, RoPE
split 8+4+4, patch 1x2x2, cross-attention norm), ``AutoencoderKLWan`` (base 4, z 4, 4x
temporal / 8x spatial like the real one), ``UniPCMultistepScheduler`` configured as Wan
ships it (flow prediction, flow sigmas, shift 3, order 2), a ``UMT5EncoderModel`` (d_model
32, 2 layers) and the code-built byte-level T5 tokenizer. Each component is initialised by
its own default init under a fixed torch seed (``torch.random.fork_rng``: the global RNG is
left untouched), so every process builds bit-identical models.
"""

from __future__ import annotations

import torch

from ditmem.models.common.dtypes import cast_pipeline
from ditmem.models.common.tokenizer import t5_tokenizer

TRANSFORMER_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
    cross_attn_norm=True,
    rope_max_seq_len=256,
)

VAE_CONFIG = dict(
    base_dim=4,
    z_dim=4,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    latents_mean=[0.1, -0.2, 0.05, 0.0],
    latents_std=[1.5, 0.8, 1.2, 1.0],
)

SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
    solver_order=2,
    solver_type="bh2",
    lower_order_final=True,
)

TEXT_ENCODER_CONFIG = dict(
    d_model=32,
    d_kv=16,
    d_ff=64,
    num_layers=2,
    num_heads=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=32,
)


def _build_seeded(seed: int, build):
    """Run ``build()`` (a module constructor) under a private RNG seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def build_tiny_transformer(seed: int = 2, **overrides):
    """A tiny ``WanTransformer3DModel`` (float32, CPU); ``overrides`` patch the config."""
    from diffusers import WanTransformer3DModel

    config = {**TRANSFORMER_CONFIG, **overrides}
    return _build_seeded(seed, lambda: WanTransformer3DModel(**config))


def build_pipeline(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu",
                   two_experts: bool = False):
    """Build the tiny ``WanPipeline`` (deterministic for a given seed).

    two_experts: add a second transformer (``transformer_2``) with ``boundary_ratio`` 0.875,
    the layout of Wan2.2 A14B (high-noise expert first, low-noise expert after the boundary).
    """
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = t5_tokenizer()
    text_config = UMT5Config(vocab_size=len(tokenizer), **TEXT_ENCODER_CONFIG)
    text_encoder = _build_seeded(seed + 1, lambda: UMT5EncoderModel(text_config))
    transformer = build_tiny_transformer(seed + 2)
    transformer_2 = build_tiny_transformer(seed + 4) if two_experts else None
    vae = _build_seeded(seed + 3, lambda: AutoencoderKLWan(**VAE_CONFIG))
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG),
        transformer=transformer,
        transformer_2=transformer_2,
        boundary_ratio=0.875 if two_experts else None,
    )
    pipe.to(device=device)
    if dtype != torch.float32:  # norms and modulation stay float32, as from_pretrained keeps them
        cast_pipeline(pipe, dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe
