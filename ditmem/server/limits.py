"""What one server accepts: the ``serve`` limits and the model's own shape rules.

``Limits`` are the operator's bounds (each a ``ditmem serve`` flag, listed by
``GET /v1/limits`` and ``GET /v1/models``); ``ModelRules`` are what the loaded model can run
(pixel multiple, frame rule, fewest steps, text window), read from the generator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIB = 2**20


@dataclass(slots=True, frozen=True)
class Limits:
    """Per-request bounds. Sides and pixels are per frame; ``max_prompt_chars`` applies to
    ``prompt`` and ``negative_prompt`` and is checked before anything is tokenized;
    ``max_request_s`` (0: off) rejects a request whose standalone time on this device, by
    the cost model, is longer; video results are kept within ``video_store_bytes`` and for
    ``video_ttl_s`` seconds after they finish."""

    max_body_bytes: int = 16 * MIB
    max_prompt_chars: int = 10_000
    min_side: int = 16
    max_side: int = 4096
    max_pixels: int = 2048 * 2048
    max_frames: int = 257
    max_steps: int = 200
    max_n: int = 4
    max_fps: int = 120
    max_request_s: float = 1800.0
    video_store_bytes: int = 2048 * MIB
    video_ttl_s: float = 3600.0

    def __post_init__(self):
        for name in ("max_body_bytes", "max_prompt_chars", "min_side", "max_side", "max_pixels",
                     "max_frames", "max_steps", "max_n", "max_fps", "video_store_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"limits.{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_side < self.min_side:
            raise ValueError(f"limits.max_side: must be >= min_side {self.min_side}")
        if self.max_request_s < 0 or self.video_ttl_s <= 0:
            raise ValueError("limits: max_request_s must be >= 0 and video_ttl_s > 0")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class ModelRules:
    """Shape rules of the loaded model. ``size_multiple``: sides are rounded down to it (as
    the diffusers pipelines do, with a warning); ``frame_step``: 0 for an image model (one
    frame only), 1 for any frame count, t for ``t·k + 1`` frames (Wan: 4; other counts are
    rounded as the pipeline does, with a warning); ``min_steps``: fewest denoising steps
    that give a finite image; ``text_tokens``: the text encoder's window (prompt tokens
    past it are dropped, as the stock pipeline does), 0 when unknown."""

    size_multiple: int = 16
    frame_step: int = 1
    min_steps: int = 1
    text_tokens: int = 0
    min_steps_reason: str = ""

    @classmethod
    def of(cls, generator) -> ModelRules:
        """Read the rules off a ``ditmem.models`` generator (defaults for test doubles)."""
        shapes = getattr(generator, "shapes", None)
        if shapes is not None:  # Wan
            multiple, frame_step = shapes.spatial * shapes.patch[1], shapes.temporal
        elif getattr(generator, "multiple", None):  # Qwen-Image: images only
            multiple, frame_step = int(generator.multiple), 0
        else:
            multiple, frame_step = 16, 1
        min_steps, reason = 1, ""
        pipe = getattr(generator, "pipe", None)
        config = getattr(getattr(pipe, "scheduler", None), "config", None) or {}
        if config.get("shift_terminal"):
            # FlowMatchEuler stretches the sigmas so the last one hits shift_terminal; with
            # one sigma the stretch divides by zero (the stock pipeline gives NaN, a black
            # image)
            min_steps = 2
            reason = ("one step gives NaN in this model's flow-match schedule "
                      "(shift_terminal stretch), as in the stock pipeline")
        return cls(multiple, frame_step, min_steps,
                   int(getattr(generator, "max_sequence_length", 0) or 0), reason)

    def round_frames(self, frames: int) -> int:
        """The frame count the model runs for ``frames`` (diffusers' Wan rounding)."""
        if self.frame_step <= 1:
            return frames
        return frames // self.frame_step * self.frame_step + 1

    def as_dict(self) -> dict:
        out = asdict(self)
        out["video"] = self.frame_step != 0
        return out


def count_tokens(generator, text: str) -> int | None:
    """Tokens the model's tokenizer makes of ``text`` (None without a tokenizer). Slow for
    long text: never call it on the event loop."""
    tokenizer = getattr(getattr(generator, "pipe", None), "tokenizer", None)
    if tokenizer is None:
        return None
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def add_limit_arguments(p) -> None:
    """The ``serve`` flags for :class:`Limits` (one argument group)."""
    d = Limits()
    g = p.add_argument_group("request limits (listed by GET /v1/limits and /v1/models)")
    g.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / MIB,
                   help="largest request body read, MiB (413 past it; default %(default)g)")
    g.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars,
                   help="longest prompt / negative_prompt in characters, rejected (400) "
                        "before any tokenizing; tokens past the text encoder's window are "
                        "dropped as the stock pipeline does, with a warning (default "
                        "%(default)s)")
    g.add_argument("--max-side", type=int, default=d.max_side,
                   help="largest width or height in pixels (default %(default)s)")
    g.add_argument("--max-pixels", type=int, default=d.max_pixels,
                   help="largest width x height per frame (default %(default)s)")
    g.add_argument("--max-frames", type=int, default=d.max_frames,
                   help="most video frames (default %(default)s)")
    g.add_argument("--max-steps", type=int, default=d.max_steps,
                   help="most denoising steps (default %(default)s)")
    g.add_argument("--max-n", type=int, default=d.max_n,
                   help="most images per request (default %(default)s)")
    g.add_argument("--max-request-s", type=float, default=d.max_request_s,
                   help="reject (400, with the estimate) a request whose standalone time on "
                        "this device, by the cost model, is longer; 0: off (default "
                        "%(default)g)")
    g.add_argument("--video-store-mb", type=float, default=d.video_store_bytes / MIB,
                   help="byte budget of video results held for clients, MiB; running jobs "
                        "are never evicted (default %(default)g)")
    g.add_argument("--video-ttl-s", type=float, default=d.video_ttl_s,
                   help="how long a finished video is kept (default %(default)g)")


def limits_from_args(args) -> Limits:
    """:class:`Limits` from the flags of :func:`add_limit_arguments`."""
    return Limits(max_body_bytes=int(args.max_body_mb * MIB),
                  max_prompt_chars=args.max_prompt_chars, max_side=args.max_side,
                  max_pixels=args.max_pixels, max_frames=args.max_frames,
                  max_steps=args.max_steps, max_n=args.max_n,
                  max_request_s=args.max_request_s,
                  video_store_bytes=int(args.video_store_mb * MIB),
                  video_ttl_s=args.video_ttl_s)
