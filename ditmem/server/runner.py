"""Run the app under uvicorn until SIGTERM/SIGINT, then return normally (exit status 0).

uvicorn's own handlers re-raise the signal once the server has stopped, which kills the
process before the caller can drain and report; here the signal only asks the server to
exit: it stops accepting connections, lets the requests in flight finish, runs the app's
lifespan shutdown (which drains the engine), and ``serve`` returns.
"""

from __future__ import annotations

import contextlib
import signal


def serve(app, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=None))

    def request_exit(signum, frame):
        server.should_exit = True

    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    previous = {s: signal.signal(s, request_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
