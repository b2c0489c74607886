"""The embedded ``tiny-qwen-image`` model: the stock diffusers ``QwenImagePipeline`` with
tiny configs and seeded random weights (no downloads).

Components are the real classes: ``QwenImageTransformer2DModel`` (2 layers, 2 heads of 32,
RoPE axes 8+12+12), ``AutoencoderKLQwenImage`` (base 4, z 4, 8x spatial: base 4 keeps the
CPU decode, torch's slow_conv3d, from dominating a request: 0.09 s at 256² vs 0.54 s at base
16), Qwen-Image's
``FlowMatchEulerDiscreteScheduler`` config (dynamic exponential shifting, terminal shift
0.02), a ``Qwen2_5_VLForConditionalGeneration`` text encoder (hidden 32, 2 layers, mrope
sections 2+3+3 = half its head dim 16, a 1-layer vision tower) and a code-built byte-level
``Qwen2TokenizerFast``. Weights are drawn from ``torch.Generator`` seeds, so every process
builds bit-identical models.
"""

from __future__ import annotations

import torch

from ditmem.models.common.dtypes import cast_pipeline
from ditmem.models.common.tokenizer import qwen_tokenizer

TRANSFORMER_CONFIG = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=32,
    num_attention_heads=2,
    joint_attention_dim=32,
    axes_dims_rope=(8, 12, 12),
)

VAE_CONFIG = dict(
    base_dim=4,
    z_dim=4,
    dim_mult=[1, 2, 2, 2],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    latents_mean=[0.1, -0.2, 0.05, 0.0],
    latents_std=[1.5, 0.8, 1.2, 1.0],
)

SCHEDULER_CONFIG = dict(
    base_image_seq_len=256,
    base_shift=1.0986122886681098,  # ln 3
    invert_sigmas=False,
    max_image_seq_len=8192,
    max_shift=1.0986122886681098,
    num_train_timesteps=1000,
    shift=1.0,
    shift_terminal=0.02,
    stochastic_sampling=False,
    time_shift_type="exponential",
    use_beta_sigmas=False,
    use_dynamic_shifting=True,
    use_exponential_sigmas=False,
    use_karras_sigmas=False,
)


def text_encoder_config(vocab_size: int):
    """A tiny ``Qwen2_5_VLConfig``: text hidden 32, 2 layers, 2 heads (1 KV head), mrope
    sections [2, 3, 3]; vision tower depth 1."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
            layer_types=["full_attention"] * 2,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=vocab_size - 6,  # <|im_end|>
            pad_token_id=vocab_size - 8,  # <|endoftext|>
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[0],
        ),
        image_token_id=262,
        video_token_id=263,
        vision_start_token_id=259,
        vision_end_token_id=260,
    )


def fill_seeded_noise(module: torch.nn.Module, seed: int, std: float = 0.02) -> torch.nn.Module:
    """Overwrite every parameter with seeded normal noise (norm weights keep 1 +- noise);
    the result does not depend on the default init or on global RNG state."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * std
            if "norm" in name and name.endswith("weight"):
                noise = noise + 1.0
            p.copy_(noise.to(p.dtype))
    return module.eval()


def fill_fan_in_noise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Overwrite every parameter with seeded noise scaled to keep activations at unit size
    through deep stacks: weights ``N(0, 1/fan_in)``, norm scales ``1 +- 0.05``, biases
    ``N(0, 0.02)``. A fixed small spread (``fill_seeded_noise``) shrinks the signal layer by
    layer, and a VAE decoder filled that way puts out the same image for every latent."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() > 1:
                noise = noise / (p[0].numel() ** 0.5)
            elif "norm" in name or name.endswith("gamma"):
                noise = 1.0 + 0.05 * noise
            else:
                noise = 0.02 * noise
            p.copy_(noise.to(p.dtype))
    return module.eval()


def build_pipeline(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Build the tiny ``QwenImagePipeline`` (deterministic for a given seed)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen_tokenizer()
    text_encoder = Qwen2_5_VLForConditionalGeneration(text_encoder_config(len(tokenizer)))
    transformer = QwenImageTransformer2DModel(**TRANSFORMER_CONFIG)
    vae = AutoencoderKLQwenImage(**VAE_CONFIG)
    # Transformer weights get a larger spread than 0.02 so that outputs differ visibly
    # between requests (a near-zero network would make equivalence tests too easy).
    fill_seeded_noise(text_encoder, seed + 1, std=0.1)
    fill_seeded_noise(transformer, seed + 2, std=0.1)
    fill_fan_in_noise(vae, seed + 3)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    if dtype != torch.float32:
        cast_pipeline(pipe, dtype)
    if str(device) != "cpu":
        pipe.to(device=device)
    pipe.set_progress_bar_config(disable=True)
    return pipe
