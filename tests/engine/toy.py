"""A small deterministic generator on real pages, for engine mechanics tests.

It keeps its latents in a ``RequestState`` of the engine's pool like the real models do, so
paging, offload and release are real; its "denoiser" is a cheap closed-form update whose
result :meth:`reference` computes independently (no pages, no engine). Prompts containing
``fail-encode`` / ``fail-step`` / ``fail-decode`` make that stage raise for that request.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from ditmem.memory import RequestState

CHANNELS = 4


def _noise(request) -> torch.Tensor:
    g = torch.Generator().manual_seed(request.seed)
    shape = (request.num_frames, CHANNELS, request.height // 16, request.width // 16)
    return torch.randn(shape, generator=g)


def _update(x: torch.Tensor, step: int, total: int) -> torch.Tensor:
    return x * 0.9 + 0.1 * math.cos(step / max(1, total))


def _to_uint8(x: torch.Tensor) -> np.ndarray:
    img = x[:, :3].clamp(-2, 2).add(2).mul(63.75).round().to(torch.uint8)
    img = img.permute(0, 2, 3, 1).contiguous().numpy()
    return img[0] if img.shape[0] == 1 else img


class ToyGenerator:
    name = "toy"

    def __init__(self, step_sleep_s: float = 0.0):
        self.step_sleep_s = step_sleep_s
        self.steps_run = 0

    def estimate_pages(self, request, page_bytes: int) -> int:
        n = request.num_frames * CHANNELS * (request.height // 16) * (request.width // 16)
        return math.ceil(4 * n / page_bytes)

    def encode(self, request, pool):
        if "fail-encode" in request.prompt:
            raise RuntimeError("injected encode failure")
        state = RequestState(pool, request.request_id)
        if state.put("latents", _noise(request)) is None:
            state.free()
            return None
        state.scalars.update(step=0, total=request.num_inference_steps, prompt=request.prompt)
        return state

    def step(self, states):
        if any("fail-step" in s.scalars["prompt"] for s in states):
            raise RuntimeError("injected step failure")
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        for s in states:
            s.put("latents", _update(s.get("latents"), s.scalars["step"], s.scalars["total"]))
            s.scalars["step"] += 1
        self.steps_run += 1

    def is_done(self, state) -> bool:
        return state.scalars["step"] >= state.scalars["total"]

    def progress(self, state):
        return state.scalars["step"], state.scalars["total"]

    def decode(self, state):
        if "fail-decode" in state.scalars["prompt"]:
            raise RuntimeError("injected decode failure")
        return _to_uint8(state.get("latents"))

    def release(self, state):
        state.free()

    def reference(self, request):
        x = _noise(request)
        for i in range(request.num_inference_steps):
            x = _update(x, i, request.num_inference_steps)
        return _to_uint8(x)


def table_profile(step_s: float = 0.001, page_bytes_per_token: int = 16 * 4) -> dict:
    """A version-1 'table' profile for the qwen-image key with a flat step time."""
    src = {"source": "test fixture"}
    n = lambda v: dict(src, value=v)
    return {
        "format": 1, "name": "test-table",
        "device_bytes": n(1e9), "host_bytes": n(1e9), "host_link_bytes_per_s": n(1e9),
        "models": {"qwen-image": {
            "weights_bytes": n(0), "workspace_bytes": n(0),
            "state_bytes_per_token": n(page_bytes_per_token), "state_bytes_per_request": n(0),
            "encode_s": n(0.0), "decode_s_per_megapixel": n(0.0), "max_batch": n(4),
            "step": {"kind": "table", "points": n([
                {"tokens": 16, "batch": 1, "seconds": step_s},
                {"tokens": 4096, "batch": 1, "seconds": step_s * 8}])},
        }},
    }
