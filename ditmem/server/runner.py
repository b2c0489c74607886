"""Run the app under uvicorn until a signal or a dead engine; return the exit status.

The first SIGTERM/SIGINT stops intake (uvicorn closes the listening socket; new
submissions on open connections get 503) and drains the engine for at most
``drain_timeout_s`` seconds; what is left then is cancelled (503 to those clients, their
pages freed, a step in progress stops at its next block boundary under block preemption)
and the process exits. A second signal exits at once. When the engine dies the server
stops the same way and the status is non-zero.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

#: exit statuses of :func:`serve`
DRAINED, DRAIN_TIMED_OUT, ENGINE_DEAD, FORCED = 0, 1, 3, 130


def serve(app, host: str, port: int, log_level: str = "info", *, engine=None,
          drain_timeout_s: float = 600.0, watch_s: float = 0.2) -> int:
    """Serve until stopped; returns :data:`DRAINED`, :data:`DRAIN_TIMED_OUT` or
    :data:`ENGINE_DEAD` (a second signal ends the process with :data:`FORCED`)."""
    import uvicorn

    engine = engine if engine is not None else app.state.engine
    # uvicorn waits for open connections to close; the drain below ends them in time
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=drain_timeout_s + 5))
    outcome = {"signals": 0, "drained": None}
    stopped = threading.Event()

    def drain():
        outcome["drained"] = engine.drain(drain_timeout_s)

    drainer = threading.Thread(target=drain, name="ditmem-drain", daemon=True)

    def begin_stop(why: str) -> None:
        if not drainer.is_alive() and outcome["drained"] is None:
            log.warning("%s: intake stopped, draining for at most %g s", why, drain_timeout_s)
            drainer.start()
        server.should_exit = True

    def on_signal(signum, frame):
        outcome["signals"] += 1
        if outcome["signals"] > 1:
            log.error("second signal: exiting now")
            os._exit(FORCED)
        begin_stop(signal.Signals(signum).name)

    def watch():
        while not stopped.wait(watch_s):
            if engine.stats().dead is not None:
                log.critical("engine dead (%s): stopping the server", engine.stats().dead)
                begin_stop("engine dead")
                return

    server.capture_signals = _no_capture  # type: ignore[method-assign]
    in_main = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
                if in_main else {})
    watcher = threading.Thread(target=watch, name="ditmem-watch", daemon=True)
    watcher.start()
    try:
        server.run()
    finally:
        stopped.set()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if drainer.is_alive() or outcome["drained"] is not None:
        drainer.join()
    else:
        drain()
    if engine.stats().dead is not None:
        return ENGINE_DEAD
    return DRAINED if outcome["drained"] else DRAIN_TIMED_OUT


def _no_capture():
    import contextlib

    return contextlib.nullcontext()


def exit_now(status: int) -> None:
    """End the process with ``status`` once the engine has stopped, skipping the
    interpreter's teardown of native libraries (seconds with torch loaded: the drain
    timeout would otherwise not bound how long SIGTERM takes)."""
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
