"""The FastAPI application: error handling, API key, health and metrics.

``create_app(engine, config)`` wires a running :class:`ditmem.engine.Engine` to HTTP; the
generation routes live in :mod:`ditmem.server.routes`. The app never owns the engine's
thread: whoever builds it (``ditmem serve``, tests) starts and drains the engine.
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from ditmem.engine.results import QueueFull, SubmitError
from ditmem.server.metrics import ServerMetrics
from ditmem.server.schemas import InvalidField, Limits
from ditmem.server.videos import VideoJobs


@dataclass(slots=True)
class ServerConfig:
    """What the HTTP layer needs to know besides the engine."""

    model_name: str
    api_key: str | None = None
    default_size: str = "256x256"
    default_steps: int = 28
    limits: Limits = field(default_factory=Limits)
    drain_timeout_s: float = 600.0
    disconnect_poll_s: float = 0.05


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


class ApiKeyMiddleware:
    """Rejects ``/v1`` requests without ``Authorization: Bearer KEY`` (or ``X-API-Key``).

    A plain ASGI middleware: Starlette's ``BaseHTTPMiddleware`` would hide client
    disconnects from the routes, which need them to cancel requests."""

    def __init__(self, app, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            given = given[7:] if given.lower().startswith(b"bearer ") else given
            given = given or headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(given, self.key):
                response = error_response(401, "missing or wrong API key "
                                          "(Authorization: Bearer KEY)", "authorization",
                                          "authentication_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine, config: ServerConfig, *, drain_on_shutdown: bool = True) -> FastAPI:
    """Build the app. On lifespan shutdown (SIGTERM under uvicorn) the engine stops taking
    requests and finishes the ones it has (``drain``) when ``drain_on_shutdown``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if drain_on_shutdown:
            import asyncio

            await asyncio.to_thread(engine.drain, config.drain_timeout_s)

    app = FastAPI(title="ditmem", lifespan=lifespan)
    app.state.engine = engine
    app.state.config = config
    app.state.metrics = ServerMetrics(engine)
    app.state.videos = VideoJobs()

    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, key=config.api_key)

    @app.exception_handler(InvalidField)
    async def on_invalid(request: Request, exc: InvalidField):
        return error_response(400, exc.message, exc.field)

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

    @app.get("/health")
    async def health():
        s = engine.stats()
        status = 503 if s.draining else 200
        body = {"status": "draining" if s.draining else "ok", "model": config.model_name,
                "queued": s.queued, "running": s.running, "paused": s.paused}
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics():
        return Response(app.state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model",
                                            "owned_by": "ditmem"}]}

    from ditmem.server.routes import add_generation_routes

    add_generation_routes(app, engine, config)
    return app
