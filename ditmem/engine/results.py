"""What the engine hands back, and the errors a submission can raise."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ditmem.engine.timing import Timing


class SubmitError(Exception):
    """A request the engine will not take; ``status`` is the HTTP status that fits."""

    status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class RequestTooLarge(SubmitError):
    """The request cannot fit in the device page pool even when it runs alone."""

    status = 413


class QueueFull(SubmitError):
    """Too many requests are waiting; retry after ``retry_after_s`` seconds."""

    status = 429

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineStopped(SubmitError):
    """The engine is draining, stopped or dead and takes no new work."""

    status = 503


class InvalidRequest(SubmitError):
    """The model cannot run the request as asked (a shape rule of the model, e.g. Wan's
    ``num_frames`` of 4k+1); ``field`` names the offending field."""

    status = 400


class TooSlow(SubmitError):
    """The request's standalone time on this device is over the server's limit."""

    status = 400

    def __init__(self, message: str, estimate_s: float, limit_s: float):
        super().__init__(message, "request")
        self.estimate_s, self.limit_s = estimate_s, limit_s


class RequestCancelled(Exception):
    """Set on a request's future when it was cancelled (client gone, shutdown)."""


class RequestFailed(Exception):
    """Set on a request's future when one of its stages raised; other requests go on."""


class EngineFault(RequestFailed):
    """Set on the futures of the requests an engine iteration held when the iteration
    itself raised (not one request's stage), and on every live request when the engine
    died. The engine, not the request, is at fault: clients get 503 with the reason."""


@dataclass(slots=True)
class GenerationResult:
    """A finished request: the decoded output (uint8 ``[H, W, 3]`` image or
    ``[F, H, W, 3]`` video) and its timing. ``slo_ms`` is the deadline it was held to."""

    request_id: str
    priority: int
    slo_ms: float
    timing: Timing
    output: np.ndarray
    peak_bytes: int = 0

    @property
    def slo_met(self) -> bool:
        return 1000.0 * self.timing.latency_s <= self.slo_ms


@dataclass(slots=True)
class Ticket:
    """A submitted request: its id and a future resolving to a :class:`GenerationResult`
    (or raising :class:`RequestCancelled` / :class:`RequestFailed`)."""

    request_id: str
    priority: int
    slo_ms: float
    future: Future = field(default_factory=Future)
