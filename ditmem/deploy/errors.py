"""Engine errors across the Ray boundary: described as plain dicts, rebuilt as the same
classes on the other side (``QueueFull`` and ``TooSlow`` take more than a message, so they
do not survive pickling as exceptions)."""

from __future__ import annotations

from ditmem.engine import handoff, results

_KINDS = {cls.__name__: cls for cls in (
    results.SubmitError, results.RequestTooLarge, results.QueueFull, results.EngineStopped,
    results.InvalidRequest, results.TooSlow, results.RequestCancelled,
    results.RequestFailed, results.EngineFault, handoff.BadBlob, handoff.HandoffRefused)}


def describe_error(exc: BaseException) -> dict:
    """``{"kind", "message", "field", "retry_after_s", "estimate_s", "limit_s"}``."""
    return {"kind": type(exc).__name__, "message": str(exc),
            "field": getattr(exc, "field", None),
            "retry_after_s": getattr(exc, "retry_after_s", None),
            "estimate_s": getattr(exc, "estimate_s", None),
            "limit_s": getattr(exc, "limit_s", None)}


def rebuild_error(info: dict) -> Exception:
    """The exception :func:`describe_error` described; an unknown kind (a bug on the
    replica) becomes ``RequestFailed`` naming it."""
    cls = _KINDS.get(info.get("kind", ""))
    message = info.get("message", "")
    if cls is None:
        return results.RequestFailed(f"{info.get('kind')}: {message}")
    if cls is results.QueueFull:
        return cls(message, retry_after_s=info.get("retry_after_s") or 1.0)
    if cls is results.TooSlow:
        return cls(message, info.get("estimate_s") or 0.0, info.get("limit_s") or 0.0)
    if issubclass(cls, (results.SubmitError, handoff.BadBlob)):
        return cls(message, info.get("field"))
    return cls(message)
