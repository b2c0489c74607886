"""Trace files: the vllm-omni ``Request(...)`` line format and JSONL.

One request per line. ``Request(request_id='r1', prompt='...', width=1024, height=1024,
num_inference_steps=28, timestamp=0.5, slo_ms=9000, num_frames=1, seed=0, priority=0)``, or
the same fields as a JSON object. Required: ``request_id``, ``width``, ``height``,
``num_inference_steps``; optional: ``prompt``, ``timestamp`` (arrival, s), ``slo_ms``,
``num_frames``, ``seed``, ``priority`` (ours, default 1), ``model`` (ours, default
``qwen-image``). Other fields (vllm-omni has more) are ignored. Blank lines and ``#``
comments are skipped. Timestamps must be on every line or on none.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from .request import Request

REQUIRED = ("request_id", "width", "height", "num_inference_steps")


class TraceError(ValueError):
    """A trace line could not be read; the message names the file and line."""


@dataclass(slots=True)
class Trace:
    """Parsed requests (arrival 0.0 when the trace has no timestamps)."""

    requests: list[Request]
    has_timestamps: bool


def _parse_call(line: str) -> dict:
    try:
        node = ast.parse(line, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a Request(...) expression ({exc.msg})") from None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError("expected Request(field=value, ...)")
    if node.func.id != "Request" or node.args:
        raise ValueError("expected Request(...) with keyword arguments only")
    fields = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs are not allowed")
        try:
            fields[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise ValueError(f"field {kw.arg!r} is not a literal value") from None
    return fields


def _parse_json(line: str) -> dict:
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg})") from None
    if not isinstance(fields, dict):
        raise ValueError("expected a JSON object")
    return fields


def _number(fields: dict, key: str, kind: type, default=None):
    value = fields.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return kind(value)


def _to_request(fields: dict) -> tuple[Request, bool]:
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    timestamp = _number(fields, "timestamp", float)
    if timestamp is not None and timestamp < 0:
        raise ValueError(f"timestamp must be >= 0, got {timestamp}")
    request = Request(
        id=str(fields["request_id"]),
        arrival=timestamp or 0.0,
        model=str(fields.get("model", "qwen-image")),
        width=_number(fields, "width", int),
        height=_number(fields, "height", int),
        frames=_number(fields, "num_frames", int, 1),
        steps=_number(fields, "num_inference_steps", int),
        priority=_number(fields, "priority", int, 1),
        slo_ms=_number(fields, "slo_ms", float),
        prompt=str(fields.get("prompt", "")),
        seed=_number(fields, "seed", int),
    )
    return request, timestamp is not None


def parse_trace(text: str, origin: str = "<trace>") -> Trace:
    """Parse trace text (each line ``Request(...)`` or a JSON object) into requests."""
    requests, stamped, seen = [], [], {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            fields = _parse_json(line) if line.startswith("{") else _parse_call(line)
            request, has_ts = _to_request(fields)
        except ValueError as exc:
            raise TraceError(f"{origin}:{lineno}: {exc}: {line[:80]}") from None
        if request.id in seen:
            raise TraceError(
                f"{origin}:{lineno}: duplicate request_id {request.id!r} (first on line "
                f"{seen[request.id]})"
            )
        seen[request.id] = lineno
        requests.append(request)
        stamped.append((lineno, has_ts))
    if not requests:
        raise TraceError(f"{origin}: no requests")
    if any(ts for _, ts in stamped) and not all(ts for _, ts in stamped):
        bad = next(n for n, ts in stamped if not ts)
        raise TraceError(f"{origin}:{bad}: timestamp missing (other lines have one)")
    return Trace(requests, stamped[0][1])


def load_trace(path: str | Path) -> Trace:
    """Read and parse a trace file."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {str(path)!r} does not exist")
    return parse_trace(path.read_text(), str(path))


def dump_jsonl(requests: list[Request]) -> str:
    """Requests as JSONL in the trace field names (arrival as ``timestamp``)."""
    lines = []
    for r in requests:
        obj = {
            "request_id": r.id,
            "prompt": r.prompt,
            "model": r.model,
            "width": r.width,
            "height": r.height,
            "num_frames": r.frames,
            "num_inference_steps": r.steps,
            "timestamp": r.arrival,
            "priority": r.priority,
        }
        if r.slo_ms is not None:
            obj["slo_ms"] = r.slo_ms
        if r.seed is not None:
            obj["seed"] = r.seed
        lines.append(json.dumps(obj))
    return "\n".join(lines) + "\n"
