"""Who may talk to the server: the API key on ``/v1`` and, optionally, the Host names.

``ApiKeyMiddleware`` compares in constant time; a plain ASGI middleware, because
Starlette's ``BaseHTTPMiddleware`` would hide client disconnects from the routes (they
cancel requests on disconnect). ``--allowed-hosts`` uses Starlette's ``TrustedHostMiddleware``
without its www-redirect, so no response is ever built from the Host header (DNS
rebinding: a page on another name cannot reach a loopback server).
"""

from __future__ import annotations

import hmac

KEY_ENV = "DITMEM_API_KEY"


def check_api_key(key: str | None) -> str | None:
    """The key to require, None for none; ValueError for an empty or blank key (which
    would otherwise silently turn authentication off)."""
    if key is None:
        return None
    if not key.strip():
        raise ValueError(f"--api-key / {KEY_ENV}: empty; give a key or leave both unset "
                         "to serve without one")
    return key


class ApiKeyMiddleware:
    """Rejects ``/v1`` requests without ``Authorization: Bearer KEY`` (or ``X-API-Key``)."""

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
                from ditmem.server.app import error_response

                response = error_response(401, "missing or wrong API key "
                                          "(Authorization: Bearer KEY)", "authorization",
                                          "authentication_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def add_host_check(app, allowed_hosts: list[str] | None) -> None:
    """Answer 400 to a Host outside ``allowed_hosts`` (None or empty: any host)."""
    if not allowed_hosts:
        return
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts),
                       www_redirect=False)
