"""Reading request bodies safely: a byte cap for every request, JSON only with a JSON
Content-Type, forms only where a route takes them.

A browser page can send ``text/plain``, urlencoded and multipart bodies to any origin
without a CORS preflight; JSON routes refuse them (415), so a page cannot drive a server
that has no API key. ``BodyLimitMiddleware`` stops reading past ``max_body_bytes`` (413),
whether or not the client sent a Content-Length.
"""

from __future__ import annotations

import asyncio
import json
from email.message import Message

from ditmem.server.requests import InvalidField

#: JSON bodies above this size are parsed in a worker thread
THREAD_PARSE_BYTES = 256 * 1024
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


class BodyError(InvalidField):
    """A body the server will not read: ``status`` 413 (too large) or 415 (media type)."""

    def __init__(self, status: int, message: str):
        super().__init__("body", message)
        self.with_status(status)


class BodyLimitMiddleware:
    """ASGI middleware: 413 for a Content-Length over ``limit``; a body that grows past it
    while streaming raises :class:`BodyError` inside the route that reads it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.limit
            except ValueError:
                too_big = False  # the server answers the malformed header itself
            if too_big:
                from ditmem.server.app import error_response

                response = error_response(413, f"body: larger than {self.limit} bytes "
                                               "(--max-body-mb)", "body")
                await response(scope, receive, send)
                return
        seen = 0

        async def capped():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyError(413, f"larger than {self.limit} bytes (--max-body-mb)")
            return message

        await self.app(scope, capped, send)


def media_type(request) -> str:
    value = request.headers.get("content-type")
    if not value:
        return ""
    msg = Message()
    msg["content-type"] = value
    return msg.get_content_type().lower()


def is_json(kind: str) -> bool:
    return kind == "application/json" or (kind.startswith("application/")
                                           and kind.endswith("+json"))


def parse_json(raw: bytes):
    """JSON text -> Python value; InvalidField("body") for anything that is not JSON."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise InvalidField("body", "is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, a 5,000-digit number
        raise InvalidField("body", f"is not valid JSON ({str(exc)[:200]})") from None


async def json_body(request) -> dict:
    """The JSON object of a JSON route's body (415 for another Content-Type)."""
    kind = media_type(request)
    if not is_json(kind):
        raise BodyError(415, f"Content-Type must be application/json, got {kind or 'none'!r}")
    raw = await request.body()
    if len(raw) > THREAD_PARSE_BYTES:
        data = await asyncio.to_thread(parse_json, raw)
    else:
        data = parse_json(raw)
    if not isinstance(data, dict):
        raise InvalidField("body", "must be a JSON object")
    return data


async def json_or_form(request, file_fields: tuple[str, ...]) -> tuple[dict, dict]:
    """(fields, files) of a body that may be JSON, urlencoded or multipart. Form values
    are text (the models parse numbers from them); files come back as (name, bytes)."""
    kind = media_type(request)
    if is_json(kind):
        return await json_body(request), {}
    if kind not in FORM_TYPES:
        raise BodyError(415, "Content-Type must be application/json, multipart/form-data or "
                             f"application/x-www-form-urlencoded, got {kind or 'none'!r}")
    try:
        form = await request.form(max_files=len(file_fields), max_fields=256)
    except BodyError:
        raise
    except Exception as exc:  # noqa: BLE001 - the multipart parser's errors are the client's
        raise InvalidField("body", f"is not a valid form ({str(exc)[:200]})") from None
    fields, files = {}, {}
    for key, value in form.multi_items():
        if hasattr(value, "read"):
            if key not in file_fields:
                raise InvalidField(key, "is a file; only "
                                        f"{', '.join(file_fields) or 'no field'} may be")
            files[key] = (value.filename, await value.read())
        elif key in fields:
            raise InvalidField(key, "is given more than once")
        else:
            fields[key] = value
    await form.close()
    return fields, files
