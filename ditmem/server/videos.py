"""Asynchronous video jobs: ``POST /v1/videos``, ``GET /v1/videos/{id}``,
``GET /v1/videos/{id}/content``, ``DELETE /v1/videos/{id}``.

``POST`` takes JSON or form fields (urlencoded, or multipart with an optional
``input_reference`` image, as the vllm-omni client sends). A job's result is encoded once,
when it completes, on a worker thread (MP4/H.264 at the requested ``fps``, or GIF), and the
raw frames are dropped; ``/content`` serves those bytes. The store keeps its results within
a byte budget: a job reserves its raw frame bytes when created (they exist between decode
and encoding), then holds its encoded size. Finished results live ``ttl_s`` seconds; to make
room, the oldest finished results go first; a job still running is never evicted, and when
running jobs alone fill the budget a new job is refused (429 with Retry-After).
``DELETE`` cancels a running job, removes it and frees its result; a deleted or unknown id
is 404 everywhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ditmem.engine.results import EngineFault, QueueFull, RequestCancelled
from ditmem.server import outputs
from ditmem.server.body import json_or_form
from ditmem.server.requests import InvalidField, VideoRequest, build_spec, validate
from ditmem.server.routes import stage_durations, submit

log = logging.getLogger(__name__)
MIB = 2**20
MEDIA = {"mp4": "video/mp4", "gif": "image/gif"}


class StoreFull(QueueFull):
    """The store's byte budget is held by running jobs."""


@dataclass(slots=True)
class VideoJob:
    """One job. ``ticket`` is dropped once the result is encoded (with it the frames);
    ``bytes_held`` is what the job counts against the budget."""

    id: str
    ticket: object
    prompt: str
    width: int
    height: int
    num_frames: int
    fps: int
    output_format: str
    priority: int
    slo_ms: float
    created_at: int
    bytes_held: int
    warnings: list[str] = field(default_factory=list)
    content: bytes | None = None
    finished_at: float | None = None
    result: dict | None = None
    error: dict | None = None


class VideoStore:
    """Thread-safe id -> job map within ``budget_bytes``; finished jobs expire after
    ``ttl_s`` (``clock``: seconds, ``time.monotonic`` by default)."""

    def __init__(self, budget_bytes: int, ttl_s: float, clock=time.monotonic):
        self.budget, self.ttl_s, self.clock = budget_bytes, ttl_s, clock
        self._jobs: OrderedDict[str, VideoJob] = OrderedDict()
        self._lock = threading.Lock()
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="ditmem-video-encode")
        self.bytes_held = 0

    # ------------------------------------------------------------------ budget
    def _expire(self) -> None:
        now = self.clock()
        for job in [j for j in self._jobs.values() if j.finished_at is not None
                    and now - j.finished_at > self.ttl_s]:
            self._drop(job)

    def _drop(self, job: VideoJob) -> None:
        self._jobs.pop(job.id, None)
        self.bytes_held -= job.bytes_held
        job.bytes_held, job.content, job.ticket = 0, None, None

    def reserve(self, nbytes: int, retry_after_s: float) -> None:
        """Make room for a new job of ``nbytes`` (oldest finished results evicted first);
        :class:`StoreFull` when running jobs hold the budget."""
        with self._lock:
            self._expire()
            if nbytes > self.budget:
                raise InvalidField("size", f"a result of {nbytes} bytes is over the video "
                                           f"store's budget of {self.budget} (--video-store-mb)")
            for job in [j for j in self._jobs.values() if j.finished_at is not None]:
                if self.bytes_held + nbytes <= self.budget:
                    break
                log.info("video %s evicted (store budget)", job.id)
                self._drop(job)
            if self.bytes_held + nbytes > self.budget:
                raise StoreFull(f"the video store is full of running jobs ({self.bytes_held} "
                                f"of {self.budget} bytes); retry later", retry_after_s)
            self.bytes_held += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_held -= nbytes

    # ------------------------------------------------------------------ jobs
    def add(self, job: VideoJob) -> None:
        """Take a job whose bytes were reserved; its result is encoded when it finishes."""
        with self._lock:
            self._jobs[job.id] = job
        job.ticket.future.add_done_callback(lambda fut: self._encode_later(job))

    def _encode_later(self, job: VideoJob) -> None:
        try:
            self._encoder.submit(self._finish, job)
        except RuntimeError:  # the store closed (shutdown): nobody will fetch it
            log.info("video %s finished after the store closed", job.id)

    def get(self, video_id: str) -> VideoJob | None:
        with self._lock:
            self._expire()
            return self._jobs.get(video_id)

    def delete(self, video_id: str) -> VideoJob | None:
        with self._lock:
            job = self._jobs.get(video_id)
            if job is not None:
                self._drop(job)
            return job

    def _finish(self, job: VideoJob) -> None:
        """Encoder thread: encode the frames once, drop them, hold the encoded bytes."""
        with self._lock:
            ticket = job.ticket
            if ticket is None or job.id not in self._jobs:
                return  # deleted meanwhile
        content, error, result = None, None, None
        exc = ticket.future.exception()
        if exc is None:
            r = ticket.future.result()
            try:
                if job.output_format == "gif":
                    content = outputs.gif_bytes(r.output, job.fps)
                else:
                    content = outputs.mp4_bytes(r.output, job.fps)
            except Exception as e:  # noqa: BLE001 - the job fails, the server goes on
                log.exception("video %s: encoding failed", job.id)
                error = {"code": "encode_failed", "message": f"encoding failed: {e!r}"}
            result = {"timing": r.timing.as_dict(), "slo_met": r.slo_met,
                      "stage_durations": stage_durations(r),
                      "peak_memory_mb": round(r.peak_bytes / MIB, 3)}
        else:
            code = ("cancelled" if isinstance(exc, RequestCancelled)
                    else "engine_error" if isinstance(exc, EngineFault) else "failed")
            error = {"code": code, "message": str(exc)}
        with self._lock:
            if job.id not in self._jobs:
                return
            size = len(content) if content is not None else 0
            self.bytes_held += size - job.bytes_held
            job.bytes_held, job.content, job.ticket = size, content, None
            job.result, job.error = result, error
            job.finished_at = self.clock()

    def close(self) -> None:
        self._encoder.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ views
    def describe(self, job: VideoJob, engine) -> dict:
        """The OpenAI-style video object (status queued / in_progress / completed /
        failed, progress 0-100), with ``stage_durations`` and ``peak_memory_mb`` when
        completed."""
        body = {"id": job.id, "object": "video", "created_at": job.created_at,
                "size": f"{job.width}x{job.height}", "num_frames": job.num_frames,
                "fps": job.fps, "seconds": round(job.num_frames / job.fps, 3),
                "output_format": job.output_format, "priority": job.priority,
                "slo_ms": job.slo_ms, "warnings": job.warnings}
        if job.finished_at is None:
            status = engine.status(job.id)
            progress = engine.progress(job.id)
            body["status"] = status or "in_progress"  # None: done, being encoded
            body["progress"] = round(100.0 * (progress if status else 1.0) * 0.99, 1)
        elif job.error is not None:
            body.update(status="failed", error=job.error)
        else:
            body.update(status="completed", progress=100.0, **job.result)
        return body


def add_video_routes(app: FastAPI, engine, config) -> None:
    store: VideoStore = app.state.videos
    limits, rules = config.limits, app.state.rules

    def not_found(video_id: str):
        raise InvalidField("video_id", f"no video {video_id[:80]!r}").with_status(404)

    @app.post("/v1/videos")
    async def create_video(request: Request):
        fields, files = await json_or_form(request, ("input_reference",))
        body = validate(VideoRequest, fields)
        if files:
            raise InvalidField("input_reference", f"{config.model_name} generates from text "
                                                  "only; image-to-video is not supported")
        spec = build_spec(body, body.prompt, limits, rules, config.defaults, video=True,
                          ignored=list(body.model_extra or {}))
        raw = spec.num_frames * spec.width * spec.height * 3
        store.reserve(raw, retry_after_s=max(1.0, engine.backlog_s()))
        try:
            (ticket,) = await submit(engine, spec, "video", config, rules)
        except BaseException:
            store.release(raw)
            raise
        job = VideoJob(ticket.request_id, ticket, spec.prompt, spec.width, spec.height,
                       spec.num_frames, spec.fps, body.output_format, ticket.priority,
                       ticket.slo_ms, int(time.time()), raw, spec.warnings)
        store.add(job)
        return store.describe(job, engine)

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str):
        job = store.get(video_id)
        if job is None:
            not_found(video_id)
        return store.describe(job, engine)

    @app.get("/v1/videos/{video_id}/content")
    async def video_content(video_id: str):
        job = store.get(video_id)
        if job is None:
            not_found(video_id)
        content = job.content
        if content is None:
            state = "failed" if job.error is not None else "not completed yet"
            raise InvalidField("video_id", f"video {video_id!r} is {state}").with_status(409)
        return Response(content, media_type=MEDIA[job.output_format])

    @app.delete("/v1/videos/{video_id}")
    async def delete_video(video_id: str):
        job = store.delete(video_id)
        if job is None:
            not_found(video_id)
        engine.cancel(video_id, "deleted by the client")
        return {"id": video_id, "object": "video.deleted", "deleted": True}
