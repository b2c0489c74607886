"""Image endpoints: OpenAI images and vllm-omni chat completions, plus what every
generation route shares (submitting off the event loop, waiting while watching the
connection, failure responses, timing fields).

A client that goes away cancels its requests, which frees their pages. Submitting (the
page estimate tokenizes the prompt) and PNG encoding run in worker threads, never on the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ditmem.engine.results import EngineFault, RequestCancelled, RequestFailed, SubmitError
from ditmem.models.common.request import GenerationRequest
from ditmem.server import outputs
from ditmem.server.body import json_body
from ditmem.server.limits import count_tokens
from ditmem.server.requests import (
    ChatRequest,
    GenerationSpec,
    ImageRequest,
    build_spec,
    chat_options,
    chat_prompt,
    validate,
)

log = logging.getLogger(__name__)
MIB = 2**20


def token_warnings(engine, spec: GenerationSpec, window: int) -> list[str]:
    """Warnings for prompts longer than the text encoder reads (tokenizes: worker thread)."""
    if not window:
        return []
    out = []
    for name, text in (("prompt", spec.prompt), ("negative_prompt", spec.negative_prompt)):
        n = count_tokens(engine.gen, text) if text else None
        if n is not None and n > window:
            out.append(f"{name}: {n} tokens; the text encoder reads the first {window} "
                       "(the rest is dropped, as the stock pipeline does)")
    return out


def submit_spec(engine, spec: GenerationSpec, prefix: str, config, text_tokens: int = 0) -> list:
    """Submit the ``n`` requests of ``spec`` (seeds ``seed, seed+1, ...``); on a rejected
    submission, cancel the ones already taken and re-raise; then warn about prompts longer
    than ``text_tokens`` (the model's text window). Blocking: run it in a thread."""
    base_seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2**31)
    spec.seed = base_seed
    limit = config.limits.max_request_s or None
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
            tickets.append(engine.submit(req, priority=spec.priority, slo_ms=spec.slo_ms,
                                         max_standalone_s=limit))
    except SubmitError:
        for t in tickets:
            engine.cancel(t.request_id)
        raise
    spec.warnings += token_warnings(engine, spec, text_tokens)
    return tickets


async def submit(engine, spec: GenerationSpec, prefix: str, config, rules) -> list:
    return await asyncio.to_thread(submit_spec, engine, spec, prefix, config, rules.text_tokens)


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
    """503 for a cancelled request or an engine fault (not the request's doing), 500 when
    one of its own stages failed; None when all succeeded."""
    for r in results:
        if isinstance(r, RequestCancelled | EngineFault):
            kind = "cancelled" if isinstance(r, RequestCancelled) else "engine_error"
            return JSONResponse({"error": {"message": str(r), "type": kind,
                                           "param": None, "code": 503}}, status_code=503)
        if isinstance(r, BaseException):
            kind = "generation_failed" if isinstance(r, RequestFailed) else "internal_error"
            return JSONResponse({"error": {"message": str(r), "type": kind, "param": None,
                                           "code": 500}}, status_code=500)
    return None


def stage_durations(result) -> dict:
    """Seconds per stage of one result (what the vllm-omni client reads)."""
    t = result.timing
    return {"queue": round(t.queued_s, 6), "encode": round(t.encode_s, 6),
            "denoise": round(t.running_s, 6), "decode": round(t.decode_s, 6),
            "paused": round(t.paused_s, 6), "offload": round(t.offload_s, 6),
            "total": round(t.latency_s, 6)}


def peak_memory_mb(results: list) -> float:
    """The largest device-pool share (MiB) one of the results' states held."""
    return round(max(r.peak_bytes for r in results) / MIB, 3)


def timing_block(results: list) -> dict:
    items = [dict(r.timing.as_dict(), id=r.request_id, priority=r.priority,
                  slo_ms=r.slo_ms, slo_met=r.slo_met) for r in results]
    return {"requests": items, "latency_ms": max(i["latency_ms"] for i in items)}


def png_b64s(results: list) -> list[str]:
    return [outputs.b64(outputs.png_bytes(outputs.first_frame(r.output))) for r in results]


def add_generation_routes(app: FastAPI, engine, config) -> None:
    limits, poll, rules = config.limits, config.disconnect_poll_s, app.state.rules

    async def generate_pngs(request: Request, spec: GenerationSpec, prefix: str):
        """Submit ``spec`` and wait for it (cancelled if the client goes away): the tickets,
        the results and their base64 PNGs, or the Response to send instead (499, a failure)."""
        tickets = await submit(engine, spec, prefix, config, rules)
        results = await wait_or_cancel(request, engine, tickets, poll)
        if results is None:
            return Response(status_code=499)
        failed = failure_response(results)
        if failed is not None:
            return failed
        return tickets, results, await asyncio.to_thread(png_b64s, results)

    @app.post("/v1/images/generations")
    async def images(request: Request):
        body = validate(ImageRequest, await json_body(request))
        spec = build_spec(body, body.prompt, limits, rules, config.defaults,
                          ignored=list(body.model_extra or {}))
        out = await generate_pngs(request, spec, "img")
        if isinstance(out, Response):
            return out
        _, results, images = out
        data = [{"b64_json": b, "revised_prompt": spec.prompt, "seed": spec.seed + i}
                for i, b in enumerate(images)]
        return {"created": int(time.time()), "data": data, "warnings": spec.warnings,
                "usage": {"peak_memory_mb": peak_memory_mb(results),
                          "stage_durations": stage_durations(results[0])},
                "timing": timing_block(results)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = validate(ChatRequest, await json_body(request))
        opts, ignored = chat_options(body)
        spec = build_spec(opts, chat_prompt(body), limits, rules, config.defaults,
                          ignored=ignored)
        out = await generate_pngs(request, spec, "chatcmpl")
        if isinstance(out, Response):
            return out
        tickets, results, images = out
        metrics = {"peak_memory_mb": peak_memory_mb(results),
                   "stage_durations": stage_durations(results[0])}
        content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b},
                    "peak_memory_mb": round(r.peak_bytes / MIB, 3),
                    "stage_durations": stage_durations(r)}
                   for b, r in zip(images, results, strict=True)]
        return {
            "id": tickets[0].request_id, "object": "chat.completion",
            "created": int(time.time()), "model": config.model_name,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "metrics": metrics, "warnings": spec.warnings, "timing": timing_block(results),
        }
