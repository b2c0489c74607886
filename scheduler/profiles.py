"""Device profiles: JSON files of sourced numbers the cost model is built from.

Format (version 1). Every number is an object ``{"value": ..., "source": "where it comes
from"}`` — the loader rejects a bare number or an empty source::

    {
      "format": 1,
      "name": "h200",
      "description": "...",
      "device_bytes":          {"value": 141e9, "source": "..."},   # device memory
      "host_bytes":            {"value": 256e9, "source": "..."},   # host pool for offload
      "host_link_bytes_per_s": {"value": 50e9,  "source": "..."},   # device<->host copies
      "models": {
        "<model>": {                                  # a key of ditmem.scheduler.models
          "weights_bytes":   {...},   # resident weights (DiT + text encoder)
          "workspace_bytes": {...},   # activations/temporaries reserved for a step
          "state_bytes_per_token":   {...},  # latents + solver state kept between steps
          "state_bytes_per_request": {...},  # text embeddings, cross-attention K/V cache
          "encode_s":                {...},  # text encoding, once per request
          "decode_s_per_megapixel":  {...},  # VAE decode, per 10^6 output pixels×frames
          "max_batch":               {...},  # most requests one packed step may hold
          "step": {"kind": "flops", ...} | {"kind": "table", ...}
        }
      }
    }

Optional numbers (block-level preemption, ``ditmem sim --preemption block``):
top-level ``chunk_overhead_s`` — fixed cost of one preemption point between transformer
blocks (the engine's sync + policy decision); per model ``blocks`` (transformer blocks per
forward), ``activation_bytes_per_token`` and ``activation_bytes_per_request`` (block-boundary
activations of a step paused between blocks, CFG branches included). Absent model numbers
come from the model geometry (``ditmem.scheduler.models``).

Optional node sections (``ditmem sim --devices D``; format and checks in
``ditmem.scheduler.node.speedup``): ``"parallel"`` — per model ``{"tokens": [ascending],
"speedup": {"1": [...], "2": [...], ...}, "source": "..."}`` (step time at degree 1 / at
degree d, per token count) — and ``"links"`` — ``{"device_bytes_per_s", "host_bytes_per_s",
"source"}``.

``step`` of kind ``"flops"`` (analytic, from public numbers): ``flops_points`` — a list of
``[tokens, TFLOP per forward per CFG branch, attention share]``; ``cfg_passes``;
``effective_tflops`` (sustained TFLOP/s on large shapes); ``step_floor_s`` (fixed per-step
cost); ``batching`` — ``{"tokens": n, "batch": b, "throughput_gain": g}``: b requests of n
tokens in one step give (1 + g)× the throughput of one at a time. Step time of a batch with
token counts n_i is ``floor + cfg · Σ F(n_i) / (R · u(Σ n_i))`` where ``F(n) = c + a·n + b·n²``
is fitted to the points and ``u(N) = N / (N + N0)`` is the utilisation, with N0 solved from
the batching anchor.

``step`` of kind ``"table"`` (measured, e.g. by ``ditmem profile``): ``points`` — a list of
``{"tokens": n, "batch": b, "seconds": s}``, where b requests of n tokens each took s seconds
for one step (CFG included). Lookup interpolates log-log in tokens among points of the same
batch size; a batch size without points is costed as b × the batch-1 time (no gain assumed).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .models import known_models

PROFILE_NAMES = ("h200", "h100", "a100", "ascend-910b", "cpu-tiny")
TOP_NUMBERS = ("device_bytes", "host_bytes", "host_link_bytes_per_s")
MODEL_NUMBERS = (
    "weights_bytes",
    "workspace_bytes",
    "state_bytes_per_token",
    "state_bytes_per_request",
    "encode_s",
    "decode_s_per_megapixel",
    "max_batch",
)
OPTIONAL_TOP = ("chunk_overhead_s", "page_bytes")
#: Sections kept as given (validated by ``ditmem.scheduler.node.speedup``): the parallel
#: speed-up table per model and the device-to-device / host link bandwidths of a node.
NODE_SECTIONS = ("parallel", "links")
OPTIONAL_MODEL = (
    "blocks",
    "activation_bytes_per_token",
    "activation_bytes_per_request",
    "decode_tile_px",
    "decode_stride_px",
    "decode_tile_s",
)
STEP_NUMBERS = {
    "flops": ("flops_points", "cfg_passes", "effective_tflops", "step_floor_s", "batching"),
    "table": ("points",),
}


class ProfileError(ValueError):
    """A profile file is missing, malformed, or has a number without a source."""


def _sourced(section: dict, key: str, where: str):
    entry = section.get(key)
    if not isinstance(entry, dict) or "value" not in entry:
        raise ProfileError(f"{where}.{key}: expected {{'value': ..., 'source': ...}}")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ProfileError(f"{where}.{key}: every number needs a non-empty 'source'")
    return entry["value"]


def parse_profile(data: dict, origin: str = "<profile>") -> dict:
    """Validate a profile dict and return it flattened to plain values.

    Returns ``{"name", "description", <top numbers>, "models": {model: {<numbers>,
    "step": {"kind", <step numbers>}}}}``; raises ProfileError naming the bad field.
    """
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ProfileError(f"{origin}: not a version-1 profile (missing 'format': 1)")
    out = {"name": data.get("name", origin), "description": data.get("description", "")}
    for key in TOP_NUMBERS:
        out[key] = float(_sourced(data, key, origin))
    for key in OPTIONAL_TOP:
        if key in data:
            out[key] = float(_sourced(data, key, origin))
    for key in NODE_SECTIONS:
        if key in data:
            out[key] = data[key]
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ProfileError(f"{origin}.models: at least one model is required")
    out["models"] = {}
    for model, section in models.items():
        where = f"{origin}.models.{model}"
        if model not in known_models():
            raise ProfileError(f"{where}: unknown model; known: {', '.join(known_models())}")
        flat = {key: _sourced(section, key, where) for key in MODEL_NUMBERS}
        for key in OPTIONAL_MODEL:
            if key in section:
                flat[key] = _sourced(section, key, where)
        tiling = [k for k in ("decode_tile_px", "decode_stride_px", "decode_tile_s") if k in flat]
        if tiling and len(tiling) != 3:
            raise ProfileError(
                f"{where}: decode_tile_px, decode_stride_px and decode_tile_s go together "
                f"(got only {', '.join(tiling)})"
            )
        step = section.get("step")
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind not in STEP_NUMBERS:
            raise ProfileError(f"{where}.step.kind: must be 'flops' or 'table', got {kind!r}")
        flat["step"] = {"kind": kind}
        for key in STEP_NUMBERS[kind]:
            flat["step"][key] = _sourced(step, key, f"{where}.step")
        out["models"][model] = flat
    return out


def load_profile(name_or_path: str | Path) -> dict:
    """Load a shipped profile by name (``h200``, ``cpu-tiny``, ...) or a JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {str(path)!r} does not exist")
        text, origin = path.read_text(), str(path)
    else:
        resource = resources.files(__package__).joinpath("profiles", f"{name_or_path}.json")
        if not resource.is_file():
            raise ProfileError(
                f"unknown device profile {str(name_or_path)!r}; shipped: {', '.join(PROFILE_NAMES)}"
                " (or give a path to a profile .json)"
            )
        text, origin = resource.read_text(), str(name_or_path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{origin}: invalid JSON ({exc})") from exc
    return parse_profile(data, origin)
