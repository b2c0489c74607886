"""The asynchronous video jobs of ``POST /v1/videos`` / ``GET /v1/videos/{id}``.

A job is a submitted engine ticket plus what the client asked for; finished jobs are kept
(up to ``keep`` of them, oldest dropped first) so clients can poll and fetch the content.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ditmem.engine.results import RequestCancelled, Ticket


@dataclass(slots=True)
class VideoJob:
    ticket: Ticket
    prompt: str
    width: int
    height: int
    num_frames: int
    created_at: int


class VideoJobs:
    """Thread-safe id -> job map with bounded memory."""

    def __init__(self, keep: int = 256):
        self.keep = keep
        self._jobs: OrderedDict[str, VideoJob] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, ticket: Ticket, prompt: str, width: int, height: int, frames: int) -> VideoJob:
        job = VideoJob(ticket, prompt, width, height, frames, int(time.time()))
        with self._lock:
            self._jobs[ticket.request_id] = job
            while len(self._jobs) > self.keep:
                self._jobs.popitem(last=False)
        return job

    def get(self, video_id: str) -> VideoJob | None:
        with self._lock:
            return self._jobs.get(video_id)

    def describe(self, job: VideoJob, progress: float | None) -> dict:
        """The OpenAI-style video object: id, status, progress (0-100), size, timing."""
        fut = job.ticket.future
        body = {
            "id": job.ticket.request_id,
            "object": "video",
            "created_at": job.created_at,
            "size": f"{job.width}x{job.height}",
            "num_frames": job.num_frames,
            "priority": job.ticket.priority,
            "slo_ms": job.ticket.slo_ms,
        }
        if not fut.done():
            body["status"] = "in_progress" if progress else "queued"
            body["progress"] = round(100.0 * (progress or 0.0), 1)
            return body
        exc = fut.exception()
        if exc is None:
            result = fut.result()
            body.update(status="completed", progress=100.0, timing=result.timing.as_dict(),
                        slo_met=result.slo_met)
        else:
            kind = "cancelled" if isinstance(exc, RequestCancelled) else "failed"
            body.update(status="failed", error={"code": kind, "message": str(exc)})
        return body
