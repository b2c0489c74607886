"""Generation endpoints: OpenAI images, vllm-omni chat completions, OpenAI-style videos.

Each handler validates the body (:mod:`ditmem.server.schemas`), submits engine requests,
and waits for them while watching the connection: a client that goes away cancels its
requests, which frees their pages.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ditmem.engine.results import RequestCancelled, RequestFailed, SubmitError
from ditmem.models.request import GenerationRequest
from ditmem.server import outputs
from ditmem.server.schemas import (
    GenerationSpec,
    InvalidField,
    chat_fields,
    chat_prompt,
    parse_generation,
)


async def read_json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidField("body", f"is not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise InvalidField("body", "must be a JSON object")
    return body


def submit_spec(engine, spec: GenerationSpec, prefix: str) -> tuple[list, int]:
    """Submit the ``n`` requests of ``spec`` (seeds ``seed, seed+1, ...``); on a rejected
    submission, cancel the ones already taken and re-raise."""
    base_seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2**31)
    tickets = []
    try:
        for i in range(spec.n):
            req = GenerationRequest(
                prompt=spec.prompt, width=spec.width, height=spec.height,
                num_inference_steps=spec.num_inference_steps, num_frames=spec.num_frames,
                negative_prompt=spec.negative_prompt, seed=base_seed + i,
                request_id=f"{prefix}-{uuid.uuid4().hex[:16]}",
            )
            if spec.guidance_scale is not None:
                req.guidance_scale = spec.guidance_scale
            tickets.append(engine.submit(req, priority=spec.priority, slo_ms=spec.slo_ms))
    except SubmitError:
        for t in tickets:
            engine.cancel(t.request_id)
        raise
    return tickets, base_seed


async def wait_or_cancel(request: Request, engine, tickets: list, poll_s: float):
    """Results of ``tickets`` in order, or None when the client disconnected first (its
    requests are then cancelled)."""
    waiting = asyncio.gather(*(asyncio.wrap_future(t.future) for t in tickets),
                             return_exceptions=True)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=poll_s)
        if done:
            return waiting.result()
        if await request.is_disconnected():
            for t in tickets:
                engine.cancel(t.request_id)
            return None


def failure_response(results: list) -> JSONResponse | None:
    for r in results:
        if isinstance(r, RequestCancelled):
            return JSONResponse({"error": {"message": f"cancelled: {r}", "type": "cancelled",
                                           "param": None, "code": 503}}, status_code=503)
        if isinstance(r, BaseException):
            kind = "generation_failed" if isinstance(r, RequestFailed) else "internal_error"
            return JSONResponse({"error": {"message": str(r), "type": kind, "param": None,
                                           "code": 500}}, status_code=500)
    return None


def timing_block(results: list) -> dict:
    items = [dict(r.timing.as_dict(), id=r.request_id, priority=r.priority,
                  slo_ms=r.slo_ms, slo_met=r.slo_met) for r in results]
    return {"requests": items, "latency_ms": max(i["latency_ms"] for i in items)}


def add_generation_routes(app: FastAPI, engine, config) -> None:
    limits, poll = config.limits, config.disconnect_poll_s

    def spec_of(body: dict, prompt=None, video=False) -> GenerationSpec:
        return parse_generation(body, limits, default_size=config.default_size,
                                default_steps=config.default_steps, prompt=prompt,
                                video=video)

    @app.post("/v1/images/generations")
    async def images(request: Request):
        spec = spec_of(await read_json(request))
        tickets, seed = submit_spec(engine, spec, "img")
        results = await wait_or_cancel(request, engine, tickets, poll)
        if results is None:
            return Response(status_code=499)
        failed = failure_response(results)
        if failed is not None:
            return failed
        data = [{"b64_json": outputs.b64(outputs.png_bytes(outputs.first_frame(r.output))),
                 "revised_prompt": spec.prompt, "seed": seed + i}
                for i, r in enumerate(results)]
        return {"created": int(time.time()), "data": data, "timing": timing_block(results)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await read_json(request)
        spec = spec_of(chat_fields(body), prompt=chat_prompt(body))
        tickets, _ = submit_spec(engine, spec, "chatcmpl")
        results = await wait_or_cancel(request, engine, tickets, poll)
        if results is None:
            return Response(status_code=499)
        failed = failure_response(results)
        if failed is not None:
            return failed
        content = [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,"
            + outputs.b64(outputs.png_bytes(outputs.first_frame(r.output)))}} for r in results]
        return {
            "id": tickets[0].request_id, "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or config.model_name,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "timing": timing_block(results),
        }

    @app.post("/v1/videos")
    async def create_video(request: Request):
        body = await read_json(request)
        if body.get("n", 1) != 1:
            raise InvalidField("n", "videos are generated one per request")
        spec = spec_of(body, video=True)
        (ticket,), _ = submit_spec(engine, spec, "video")
        job = app.state.videos.add(ticket, spec.prompt, spec.width, spec.height,
                                   spec.num_frames)
        return app.state.videos.describe(job, engine.progress(ticket.request_id))

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str):
        job = app.state.videos.get(video_id)
        if job is None:
            raise InvalidField("video_id", f"no video {video_id!r}") from None
        return app.state.videos.describe(job, engine.progress(video_id))

    @app.get("/v1/videos/{video_id}/content")
    async def video_content(video_id: str):
        job = app.state.videos.get(video_id)
        if job is None or not job.ticket.future.done() or job.ticket.future.exception():
            return JSONResponse({"error": {"message": f"video {video_id!r} is not completed",
                                           "type": "invalid_request_error",
                                           "param": "video_id", "code": 404}},
                                status_code=404)
        frames = job.ticket.future.result().output
        return Response(outputs.gif_bytes(frames), media_type="image/gif")

    @app.delete("/v1/videos/{video_id}")
    async def delete_video(video_id: str):
        job = app.state.videos.get(video_id)
        if job is None:
            raise InvalidField("video_id", f"no video {video_id!r}")
        engine.cancel(video_id)
        return {"id": video_id, "object": "video", "deleted": True}
