"""Request bodies of the HTTP API as pydantic models, and their conversion to a
:class:`GenerationSpec` under the server's limits and the model's rules.

The models check types and formats (they are what the OpenAPI schema shows); the limits
of this server and the model's shape rules are applied afterwards by :func:`build_spec`.
Every failure is an :class:`InvalidField` naming the field (400 with an OpenAI-style body);
sides that are not multiples of the model's are rounded down with a warning, as diffusers
does, and fields the server ignores are named in the warnings too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from ditmem.server.limits import Limits, ModelRules

PRIORITY_NAMES = {"high": 0, "normal": 1, "low": 2}
SIZE_RE = re.compile(r"^\s*([0-9]{1,6})\s*[xX×]\s*([0-9]{1,6})\s*$")
MAX_SEED = 2**63 - 1
MAX_WARNED_FIELDS = 8


class InvalidField(ValueError):
    """A request field is missing or out of range; ``field`` names it, ``status`` is the
    HTTP status (400 unless :meth:`with_status` says otherwise, e.g. 404 for an id)."""

    status = 400

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = f"{field}: {message}"

    def with_status(self, status: int) -> InvalidField:
        self.status = status
        return self


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (a lone surrogate)") from None
    return text


def _priority(value: Any) -> int:
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
    raise ValueError("must be 0/1/2 or high/normal/low")


Int = Annotated[int, BeforeValidator(_no_bool)]
Number = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
Text = Annotated[str, AfterValidator(_encodable)]
Priority = Annotated[int, BeforeValidator(_priority),
                     Field(json_schema_extra={"description": "0/1/2 or high/normal/low"})]


class GenerationOptions(BaseModel):
    """Generation fields every endpoint shares (all optional). Unknown fields are ignored
    and named in the response's ``warnings``."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(max_length=256)] | None = None
    negative_prompt: Text | None = None
    size: Annotated[str, Field(max_length=32, description='"WIDTHxHEIGHT"')] | None = None
    width: Int | None = None
    height: Int | None = None
    num_inference_steps: Int | None = None
    n: Int | None = None
    seed: Annotated[Int, Field(ge=0, le=MAX_SEED)] | None = None
    priority: Priority | None = None
    slo_ms: Annotated[Number, Field(gt=0, le=1e9)] | None = None
    guidance_scale: Annotated[Number, Field(ge=0, le=100)] | None = None
    true_cfg_scale: Annotated[Number, Field(ge=0, le=100)] | None = None
    num_frames: Int | None = None
    fps: Int | None = None
    response_format: Literal["b64_json"] | None = None


class ImageRequest(GenerationOptions):
    """``POST /v1/images/generations`` (OpenAI images API plus generation fields)."""

    prompt: Text


class VideoRequest(GenerationOptions):
    """``POST /v1/videos``: JSON, or form fields (urlencoded / multipart, values as text).
    ``output_format``: "mp4" (H.264, default) or "gif"."""

    prompt: Text
    output_format: Literal["mp4", "gif"] = "mp4"


class ImageURL(BaseModel):
    url: Annotated[str, Field(max_length=64 * 2**20)]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Annotated[str, Field(max_length=64)]
    text: Text | None = None
    image_url: ImageURL | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Annotated[str, Field(max_length=64)]
    content: Text | list[ContentPart] | None = None


class ChatRequest(GenerationOptions):
    """``POST /v1/chat/completions`` (vllm-omni style): the prompt is the last user
    message; generation fields at the top level (the OpenAI SDK merges ``extra_body``
    there) or in a literal ``extra_body`` object (raw JSON clients), which wins."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    extra_body: GenerationOptions | None = None


def _loc(loc: tuple) -> str:
    """A readable field path: pydantic's union/function tags (``str``, ``list[...]``,
    ``function-after[...]``) dropped."""
    keep = []
    for part in loc:
        if isinstance(part, int):
            keep.append(str(part))
        elif "[" in part or part in ("str", "int", "float", "bool", "dict", "list", "none",
                                      "constrained-str", "literal"):
            continue
        else:
            keep.append(part)
    return ".".join(keep) or "body"


def invalid_from(exc: ValidationError) -> InvalidField:
    """The first error of a pydantic ``ValidationError`` as an :class:`InvalidField` (the
    deepest location when a union reports one per member)."""
    errors = exc.errors(include_url=False, include_input=False)
    first = max(errors, key=lambda e: len(_loc(e["loc"]).split(".")))
    msg = first["msg"]
    if first["type"] == "int_parsing_size":
        msg = "is too large"
    return InvalidField(_loc(first["loc"]), msg[:300])


def validate(model: type[BaseModel], data: Any) -> BaseModel:
    """``model.model_validate(data)``, with failures as :class:`InvalidField`."""
    if not isinstance(data, dict):
        raise InvalidField("body", "must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_from(exc) from None
    except RecursionError:
        raise InvalidField("body", "is nested too deeply") from None


@dataclass(slots=True)
class GenerationSpec:
    """A validated generation request, before it becomes engine requests (``n`` of them);
    ``warnings`` say what was changed or ignored."""

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
    fps: int = 16
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class Defaults:
    size: str = "256x256"
    steps: int = 28
    frames: int = 17
    fps: int = 16


def chat_prompt(req: ChatRequest) -> str:
    """The text of the last user message (text parts joined by spaces)."""
    for i in range(len(req.messages) - 1, -1, -1):
        message = req.messages[i]
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, list):
            if any(p.image_url is not None or p.type == "image_url" for p in content):
                raise InvalidField(f"messages.{i}.content",
                                   "input images are not supported by this model")
            content = " ".join(p.text for p in content if p.text)
        if isinstance(content, str) and content.strip():
            return content
        raise InvalidField(f"messages.{i}.content", "the last user message has no text")
    raise InvalidField("messages", "no message with role 'user'")


def chat_options(req: ChatRequest) -> tuple[GenerationOptions, list[str]]:
    """Top-level generation fields overlaid by those set in ``extra_body``; the ignored
    field names."""
    merged = {k: getattr(req, k) for k in GenerationOptions.model_fields
              if k in req.model_fields_set}
    ignored = list(req.model_extra or {})
    if req.extra_body is not None:
        merged.update({k: getattr(req.extra_body, k) for k in req.extra_body.model_fields_set
                       if k in GenerationOptions.model_fields})
        ignored += list(req.extra_body.model_extra or {})
    return GenerationOptions.model_construct(**merged), ignored


def _sides(opts: GenerationOptions, default: str) -> tuple[int, int, str, str]:
    """(width, height, and the field each came from)."""
    dw, dh = _parse_size(default, "default_size")
    if opts.width is not None or opts.height is not None:
        w = opts.width if opts.width is not None else dw
        h = opts.height if opts.height is not None else dh
        return (w, h, "width" if opts.width is not None else "size",
                "height" if opts.height is not None else "size")
    if opts.size is not None:
        w, h = _parse_size(opts.size, "size")
        return w, h, "size", "size"
    return dw, dh, "size", "size"


def _parse_size(value: str, name: str) -> tuple[int, int]:
    match = SIZE_RE.match(value)
    if match is None:
        raise InvalidField(name, f'must be "WIDTHxHEIGHT" like "256x256", got {value[:40]!r}')
    return int(match.group(1)), int(match.group(2))


def _in(name: str, value: int | None, lo: int, hi: int, why: str = "") -> int:
    if not lo <= value <= hi:
        raise InvalidField(name, f"must be in [{lo}, {hi}]{why}, got {value}")
    return value


def build_spec(opts: GenerationOptions, prompt: str, limits: Limits, rules: ModelRules,
               defaults: Defaults, *, video: bool = False,
               ignored: list[str] | None = None) -> GenerationSpec:
    """Apply the server's limits and the model's rules to validated fields."""
    warnings = []
    if not prompt.strip():
        raise InvalidField("prompt", "must be a non-empty string")
    for name, text in (("prompt", prompt), ("negative_prompt", opts.negative_prompt)):
        if text is not None and len(text) > limits.max_prompt_chars:
            raise InvalidField(name, f"is longer than {limits.max_prompt_chars} characters "
                                     "(--max-prompt-chars)")
    width, height, w_field, h_field = _sides(opts, defaults.size)
    size_field = w_field if w_field == h_field else "size"
    m = rules.size_multiple
    _in(w_field, width, limits.min_side, limits.max_side, " pixels")
    _in(h_field, height, limits.min_side, limits.max_side, " pixels")
    rw, rh = width // m * m, height // m * m
    if (rw, rh) != (width, height):
        if min(rw, rh) < limits.min_side:
            raise InvalidField(size_field, f"{width}x{height} rounds down to {rw}x{rh} "
                                           f"(multiples of {m}), under {limits.min_side}")
        warnings.append(f"{size_field}: {width}x{height} is not a multiple of {m}; "
                        f"rounded down to {rw}x{rh}")
    if rw * rh > limits.max_pixels:
        raise InvalidField(size_field, f"{rw}x{rh} is {rw * rh} pixels, over the server's "
                                       f"{limits.max_pixels} (--max-pixels)")
    steps = opts.num_inference_steps if opts.num_inference_steps is not None else defaults.steps
    why = f" ({rules.min_steps_reason})" if steps < rules.min_steps else ""
    _in("num_inference_steps", steps, rules.min_steps, limits.max_steps, why)
    n = opts.n if opts.n is not None else 1
    if video and n != 1:
        raise InvalidField("n", "videos are generated one per request")
    _in("n", n, 1, limits.max_n)
    if opts.seed is not None and opts.seed + n - 1 > 2**63 - 1:
        raise InvalidField("seed", f"seed + n - 1 must be at most {2**63 - 1}")
    frames, fps = 1, defaults.fps
    if video:
        frames = opts.num_frames
        if frames is None:
            frames = 1 if rules.frame_step == 0 else defaults.frames
        _in("num_frames", frames, 1, limits.max_frames)
        if rules.frame_step == 0 and frames != 1:
            raise InvalidField("num_frames", "this model generates images: num_frames must "
                                             f"be 1, got {frames}")
        run = rules.round_frames(frames)
        if run != frames:
            warnings.append(f"num_frames: {frames} is not {rules.frame_step}k+1; the model "
                            f"runs {run}")
            frames = _in("num_frames", run, 1, limits.max_frames)
        if opts.fps is not None:
            fps = _in("fps", opts.fps, 1, limits.max_fps)
    elif opts.num_frames not in (None, 1):
        raise InvalidField("num_frames", "videos are generated through POST /v1/videos")
    guidance = opts.true_cfg_scale if opts.true_cfg_scale is not None else opts.guidance_scale
    if ignored:
        names = ", ".join(repr(k[:40]) for k in ignored[:MAX_WARNED_FIELDS])
        more = f" and {len(ignored) - MAX_WARNED_FIELDS} more" if len(
            ignored) > MAX_WARNED_FIELDS else ""
        warnings.append(f"ignored unknown fields: {names}{more}")
    return GenerationSpec(
        prompt=prompt, width=rw, height=rh, num_inference_steps=steps, n=n, seed=opts.seed,
        priority=opts.priority if opts.priority is not None else 1, slo_ms=opts.slo_ms,
        negative_prompt=opts.negative_prompt, guidance_scale=guidance, num_frames=frames,
        fps=fps, warnings=warnings)
