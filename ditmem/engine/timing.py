"""Per-request timing: how long a request waited, ran, and sat paused.

A request's life is ``arrival -> started (first stage) -> finished``. While started it is
either inside a stage the engine is executing (running) or not (paused, including waiting
for a batch slot); ``preemptions`` counts the times it was left out of a step after having
run one. All times are seconds on the engine's clock (``time.perf_counter`` by default).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Timing:
    """Timing of one request; ``*_s`` fields are durations in seconds."""

    arrival: float
    started: float | None = None
    finished: float | None = None
    running_s: float = 0.0
    encode_s: float = 0.0
    decode_s: float = 0.0
    offload_s: float = 0.0
    steps_run: int = 0
    preemptions: int = 0
    offloads: int = 0

    @property
    def queued_s(self) -> float:
        """Arrival to first stage (or to now-less finish when it never started)."""
        end = self.started if self.started is not None else self.finished
        return 0.0 if end is None else max(0.0, end - self.arrival)

    @property
    def latency_s(self) -> float:
        """Arrival to finish (end to end inside the engine)."""
        return 0.0 if self.finished is None else self.finished - self.arrival

    @property
    def paused_s(self) -> float:
        """Time after the first stage spent not executing."""
        if self.started is None or self.finished is None:
            return 0.0
        return max(0.0, self.finished - self.started - self.running_s)

    def as_dict(self) -> dict:
        """JSON-friendly view (milliseconds), as carried by API responses."""
        ms = lambda s: round(1000.0 * s, 3)
        return {
            "queued_ms": ms(self.queued_s),
            "running_ms": ms(self.running_s),
            "paused_ms": ms(self.paused_s),
            "encode_ms": ms(self.encode_s),
            "decode_ms": ms(self.decode_s),
            "offload_ms": ms(self.offload_s),
            "latency_ms": ms(self.latency_s),
            "steps": self.steps_run,
            "preemptions": self.preemptions,
            "offloads": self.offloads,
        }


class StageTimer:
    """Times a stage on ``device``: CUDA/NPU events around the work on the current stream
    (the work is asynchronous: the wall clock would measure its launch), the wall clock
    ``clock`` on the CPU. ``time(fn)`` runs ``fn`` and returns ``(result, seconds)``; on an
    accelerator it waits for the end event (the engine needs the stage done anyway)."""

    def __init__(self, device, clock) -> None:
        import torch

        self.clock = clock
        device = torch.device(device)
        self._mod = (torch.get_device_module(device.type)
                     if device.type in ("cuda", "npu") else None)

    def time(self, fn):
        if self._mod is None:
            t0 = self.clock()
            out = fn()
            return out, self.clock() - t0
        begin, end = self._mod.Event(enable_timing=True), self._mod.Event(enable_timing=True)
        begin.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, begin.elapsed_time(end) / 1000.0
