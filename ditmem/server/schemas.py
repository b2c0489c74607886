"""Request bodies of the HTTP API and their validation.

Every check raises :class:`InvalidField` naming the offending field, which the app turns into
an OpenAI-style 400 error (``{"error": {"message", "type", "param"}}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PRIORITY_NAMES = {"high": 0, "normal": 1, "low": 2}
SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


class InvalidField(ValueError):
    """A request field is missing or out of range; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = f"{field}: {message}"


@dataclass(slots=True, frozen=True)
class Limits:
    """What this server accepts. ``size_multiple`` is the model's pixel granularity
    (VAE factor × patch size); steps and sizes are bounds per request."""

    min_side: int = 16
    max_side: int = 4096
    size_multiple: int = 16
    max_steps: int = 200
    max_n: int = 4
    max_frames: int = 257
    max_prompt_chars: int = 10_000


@dataclass(slots=True)
class GenerationSpec:
    """A validated generation request, before it becomes engine requests (``n`` of them)."""

    prompt: str
    width: int
    height: int
    num_inference_steps: int
    n: int
    seed: int | None
    priority: int
    slo_ms: float | None
    negative_prompt: str | None
    guidance_scale: float | None
    num_frames: int = 1


def _int(body: dict, field: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise InvalidField(field, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InvalidField(field, f"must be in [{lo}, {hi}], got {value}")
    return value


def _float(body: dict, field: str, lo: float, hi: float) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, f"must be a number, got {value!r}")
    if not lo <= float(value) <= hi:
        raise InvalidField(field, f"must be in [{lo}, {hi}], got {value}")
    return float(value)


def parse_priority(value: Any) -> int:
    """0/1/2 or "high"/"normal"/"low" (also "0".."2") -> 0/1/2; InvalidField otherwise."""
    if value is None:
        return 1
    if isinstance(value, str):
        key = value.strip().lower()
        if key in PRIORITY_NAMES:
            return PRIORITY_NAMES[key]
        if key in ("0", "1", "2"):
            return int(key)
    elif isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2):
        return value
    raise InvalidField("priority", f"must be 0/1/2 or high/normal/low, got {value!r}")


def parse_size(value: Any, limits: Limits, default: str) -> tuple[int, int]:
    """"WxH" -> (width, height), each a multiple of ``limits.size_multiple`` in range."""
    value = default if value is None else value
    match = SIZE_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidField("size", f'must be "WIDTHxHEIGHT" like "256x256", got {value!r}')
    width, height = int(match.group(1)), int(match.group(2))
    for side in (width, height):
        if not limits.min_side <= side <= limits.max_side:
            raise InvalidField(
                "size", f"sides must be in [{limits.min_side}, {limits.max_side}], got {value!r}"
            )
        if side % limits.size_multiple:
            raise InvalidField(
                "size", f"sides must be multiples of {limits.size_multiple}, got {value!r}"
            )
    return width, height


def _prompt(value: Any, limits: Limits) -> str:
    if value is None:
        raise InvalidField("prompt", "is required")
    if not isinstance(value, str) or not value.strip():
        raise InvalidField("prompt", "must be a non-empty string")
    if len(value) > limits.max_prompt_chars:
        raise InvalidField("prompt", f"is longer than {limits.max_prompt_chars} characters")
    return value


def parse_generation(
    body: dict, limits: Limits, *, default_size: str, default_steps: int, prompt: Any = None,
    video: bool = False,
) -> GenerationSpec:
    """Validate the generation fields shared by all endpoints. ``prompt`` overrides
    ``body["prompt"]`` (chat completions take it from the messages)."""
    if not isinstance(body, dict):
        raise InvalidField("body", "must be a JSON object")
    text = _prompt(body.get("prompt") if prompt is None else prompt, limits)
    if "width" in body or "height" in body:
        w = _int(body, "width", None, limits.min_side, limits.max_side)
        h = _int(body, "height", None, limits.min_side, limits.max_side)
        dw, dh = parse_size(default_size, limits, default_size)
        size = f"{w or dw}x{h or dh}"
    else:
        size = body.get("size")
    width, height = parse_size(size, limits, default_size)
    fmt = body.get("response_format", "b64_json")
    if fmt not in (None, "b64_json"):
        raise InvalidField("response_format", f'only "b64_json" is supported, got {fmt!r}')
    slo = _float(body, "slo_ms", 1e-3, 1e9)
    negative = body.get("negative_prompt")
    if negative is not None and not isinstance(negative, str):
        raise InvalidField("negative_prompt", "must be a string")
    guidance = _float(body, "guidance_scale", 0.0, 100.0)
    if body.get("true_cfg_scale") is not None:
        guidance = _float(body, "true_cfg_scale", 0.0, 100.0)
    frames = _int(body, "num_frames", 1, 1, limits.max_frames) if video else 1
    return GenerationSpec(
        prompt=text,
        width=width,
        height=height,
        num_inference_steps=_int(body, "num_inference_steps", default_steps, 1, limits.max_steps),
        n=_int(body, "n", 1, 1, limits.max_n),
        seed=_int(body, "seed", None, 0, 2**63 - 1),
        priority=parse_priority(body.get("priority")),
        slo_ms=slo,
        negative_prompt=negative,
        guidance_scale=guidance,
        num_frames=frames,
    )


def chat_prompt(body: dict) -> str:
    """The text of the last user message of a chat completion body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidField("messages", "must be a non-empty list")
    for message in reversed(messages):
        if not isinstance(message, dict):
            raise InvalidField("messages", "each message must be an object")
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = " ".join(p for p in parts if p)
        if isinstance(content, str) and content.strip():
            return content
        raise InvalidField("messages", "the last user message has no text content")
    raise InvalidField("messages", "no message with role 'user'")


def chat_fields(body: dict) -> dict:
    """Generation fields of a chat completion: top level (the OpenAI SDK merges its
    ``extra_body`` there) overlaid by a literal ``extra_body`` object (raw JSON clients)."""
    fields = {k: v for k, v in body.items() if k not in ("messages", "extra_body")}
    extra = body.get("extra_body")
    if extra is not None:
        if not isinstance(extra, dict):
            raise InvalidField("extra_body", "must be an object")
        fields.update(extra)
    return fields
