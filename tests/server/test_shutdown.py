"""SIGTERM on a real server process: intake stops, the request in flight finishes (200),
the process exits 0 with no pages left in use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from harness import free_port

SERVER = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    from harness import toy_engine
    from ditmem.server.app import ServerConfig, create_app
    from ditmem.server.runner import serve
    engine = toy_engine(step_sleep_s=0.01).start()
    app = create_app(engine, ServerConfig(model_name="toy", default_size="64x64",
                                          default_steps=4))
    serve(app, "127.0.0.1", {port}, "warning")
    stats = engine.stats()
    print("DRAINED", stats.completed, stats.cancelled, engine.pool.num_used_pages, flush=True)
""")


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests(tmp_path):
    port = free_port()
    here = Path(__file__).parent
    script = tmp_path / "server.py"
    script.write_text(SERVER.format(paths=[str(here), str(here.parent / "engine")], port=port))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # a loaded 2-core machine starts it slowly
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        result = {}

        def long_request():
            result["r"] = httpx.post(f"{url}/v1/images/generations", timeout=60,
                                     json={"prompt": "x", "num_inference_steps": 60})

        t = threading.Thread(target=long_request)
        t.start()
        while True:  # wait until the request is inside the engine (60 steps x 10 ms)
            h = httpx.get(f"{url}/health").json()
            if h["queued"] + h["running"] + h["paused"] >= 1:
                break
            assert time.monotonic() < deadline + 60, "request never reached the engine"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        with pytest.raises(httpx.TransportError):  # intake stopped: socket closed
            httpx.post(f"{url}/v1/images/generations", json={"prompt": "y"}, timeout=5)
        t.join(60)
        assert result["r"].status_code == 200
        assert result["r"].json()["timing"]["requests"][0]["steps"] == 60
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        drained = [line for line in out.splitlines() if line.startswith("DRAINED")]
        assert drained == ["DRAINED 1 0 0"], out
    finally:
        if proc.poll() is None:
            proc.kill()
