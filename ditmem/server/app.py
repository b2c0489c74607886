"""The FastAPI application: errors, security, health, limits and metrics.

``create_app(engine, config)`` wires a running :class:`ditmem.engine.Engine` to HTTP; the
generation routes live in :mod:`ditmem.server.routes` and :mod:`ditmem.server.videos`. The
app never owns the engine's thread: whoever builds it (``ditmem serve``, tests) starts and
drains the engine. Every error is an OpenAI-style body
(``{"error": {"message", "type", "param", "code"}}``); no input gives a 5xx.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ditmem.engine.results import QueueFull, SubmitError
from ditmem.server.body import BodyLimitMiddleware
from ditmem.server.limits import Limits, ModelRules
from ditmem.server.metrics import ServerMetrics
from ditmem.server.requests import Defaults, InvalidField
from ditmem.server.security import ApiKeyMiddleware, add_host_check, check_api_key

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerConfig:
    """What the HTTP layer needs to know besides the engine. ``rules`` default to the
    engine's generator's (:meth:`ModelRules.of`)."""

    model_name: str
    api_key: str | None = None
    default_size: str = "256x256"
    default_steps: int = 28
    default_frames: int = 17
    default_fps: int = 16
    limits: Limits = field(default_factory=Limits)
    rules: ModelRules | None = None
    allowed_hosts: list[str] | None = None
    drain_timeout_s: float = 600.0
    disconnect_poll_s: float = 0.05

    @property
    def defaults(self) -> Defaults:
        return Defaults(self.default_size, self.default_steps, self.default_frames,
                        self.default_fps)


def error_response(status: int, message: str, param: str | None = None,
                   kind: str = "invalid_request_error", headers: dict | None = None):
    """OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def submit_error_response(exc: SubmitError) -> JSONResponse:
    headers = None
    if isinstance(exc, QueueFull):
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    kind = "rate_limit_error" if exc.status == 429 else "invalid_request_error"
    if exc.status == 503:
        kind = "service_unavailable"
    return error_response(exc.status, str(exc), exc.field, kind, headers)


def document_bodies(app: FastAPI, bodies: dict[str, tuple[type, tuple[str, ...]]]) -> None:
    """Put each route's request model in the OpenAPI schema (the routes read their bodies
    themselves, to check Content-Type and accept forms)."""

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path, (model, kinds) in bodies.items():
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            op = schema["paths"][path]["post"]
            op["requestBody"] = {"required": True,
                                 "content": {kind: {"schema": ref} for kind in kinds}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def create_app(engine, config: ServerConfig, *, drain_on_shutdown: bool = True) -> FastAPI:
    """Build the app. On lifespan shutdown the engine stops taking requests and finishes
    the ones it has (``drain``, at most ``config.drain_timeout_s``) when
    ``drain_on_shutdown``."""
    key = check_api_key(config.api_key)
    rules = config.rules or ModelRules.of(engine.gen)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if drain_on_shutdown:
            import asyncio

            await asyncio.to_thread(engine.drain, config.drain_timeout_s)
        app.state.videos.close()

    app = FastAPI(title="ditmem", lifespan=lifespan, redirect_slashes=False)
    app.state.engine = engine
    app.state.config = config
    app.state.rules = rules
    app.state.metrics = ServerMetrics(engine)

    app.add_middleware(BodyLimitMiddleware, limit=config.limits.max_body_bytes)
    if key:
        app.add_middleware(ApiKeyMiddleware, key=key)
    add_host_check(app, config.allowed_hosts)

    @app.exception_handler(InvalidField)
    async def on_invalid(request: Request, exc: InvalidField):
        kind = "not_found" if exc.status == 404 else "invalid_request_error"
        return error_response(exc.status, exc.message, exc.field, kind)

    @app.exception_handler(SubmitError)
    async def on_submit_error(request: Request, exc: SubmitError):
        return submit_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"] if errors else []
        param = ".".join(loc) or "body"
        msg = errors[0].get("msg", "invalid request") if errors else "invalid request"
        return error_response(400, f"{param}: {msg}", param)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), None, kind,
                              getattr(exc, "headers", None))

    @app.get("/health")
    async def health():
        s = engine.stats()
        body = {"status": "ok", "model": config.model_name,
                "queued": s.queued, "running": s.running, "paused": s.paused}
        devices = getattr(s, "devices", None)  # a node (ditmem serve --devices N)
        if devices is not None:
            body["devices"] = [{"device": d.device, "pages_used": d.pages_used,
                                "pages_total": d.pages_total,
                                "status": "ok" if d.lost is None else "lost",
                                **({"reason": d.lost} if d.lost is not None else {})}
                               for d in devices]
            if any(d.lost is not None for d in devices):
                body["status"] = "degraded"  # still serving on the other devices
        if s.dead is not None:
            body.update(status="dead", reason=s.dead)
        elif s.draining:
            body["status"] = "draining"
        ok = body["status"] in ("ok", "degraded")
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(app.state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def limits_body() -> dict:
        return {"limits": config.limits.as_dict(), "model_rules": rules.as_dict(),
                "defaults": {"size": config.default_size, "steps": config.default_steps,
                             "frames": config.default_frames, "fps": config.default_fps},
                "prompt_tokens": {"max": rules.text_tokens or None,
                                  "beyond": "truncated, as the stock pipeline does"}}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [dict({"id": config.model_name, "object": "model",
                                                 "owned_by": "ditmem"}, **limits_body())]}

    @app.get("/v1/limits")
    async def limits():
        return limits_body()

    from ditmem.server.requests import ChatRequest, ImageRequest, VideoRequest
    from ditmem.server.routes import add_generation_routes
    from ditmem.server.videos import VideoStore, add_video_routes

    app.state.videos = VideoStore(config.limits.video_store_bytes, config.limits.video_ttl_s)
    app.state.metrics.add_gauge("ditmem_video_store_bytes",
                                "bytes of video results held (budget: --video-store-mb)",
                                lambda: app.state.videos.bytes_held)
    add_generation_routes(app, engine, config)
    add_video_routes(app, engine, config)
    json_only = ("application/json",)
    document_bodies(app, {
        "/v1/images/generations": (ImageRequest, json_only),
        "/v1/chat/completions": (ChatRequest, json_only),
        "/v1/videos": (VideoRequest, json_only + ("multipart/form-data",
                                                  "application/x-www-form-urlencoded")),
    })
    return app
