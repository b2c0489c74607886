"""Shutdown and a dead engine on real server processes (``runner.serve``):

* SIGTERM stops intake, lets a request in flight finish (200) and exits 0, no pages used;
* SIGTERM during a long step (tiny Wan, block preemption, 0.5 s blocks, whole-step chunks)
  with ``--drain-timeout 1``: the waiting client gets 503 and the process exits within the
  drain timeout plus one block, plus slack for a loaded machine (before: no drain timeout,
  it never exited);
* a second signal exits at once;
* an engine that dies: /health answers 503 and says why, waiting clients get 503, and
  ``serve`` returns non-zero.
"""

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
from harness import free_port, running_server, toy_engine

from ditmem.engine.results import EngineFault
from ditmem.models.common.request import GenerationRequest
from ditmem.server.app import ServerConfig, create_app
from ditmem.server.runner import ENGINE_DEAD, FORCED, serve

HERE = Path(__file__).parent
PATHS = [str(HERE), str(HERE.parent / "engine")]

TOY = """
    from harness import toy_engine
    engine = toy_engine(step_sleep_s={sleep}).start()
"""
SLOW_WAN = """
    import time
    from test_engine_wan import wan_profile
    from ditmem.engine.factory import EngineConfig, build_engine
    engine = build_engine(EngineConfig(model="tiny-wan", pool_mb=16, page_kb=16,
                                       preemption="block"), cost=wan_profile())
    engine.policy.fixed_chunk = 1000
    advance = engine.gen.advance
    def slow_advance(step, stop):
        time.sleep({block_s} * (stop - step.block))
        return advance(step, stop)
    engine.gen.advance = slow_advance
    engine.start()
"""
SERVER = """
    from ditmem.server.app import ServerConfig, create_app
    from ditmem.server.runner import exit_now, serve
    app = create_app(engine, ServerConfig(model_name="m", default_size="32x32",
                                          default_steps=4, drain_timeout_s={drain}))
    status = serve(app, "127.0.0.1", {port}, "warning", drain_timeout_s={drain})
    stats = engine.stats()
    print("EXIT", status, stats.completed, stats.cancelled, engine.pool.num_used_pages,
          flush=True)
    exit_now(status)
"""


def start_server(tmp_path, engine_code: str, drain: float, **fmt):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(f"import sys\nsys.path[:0] = {PATHS!r}\n"
                      + textwrap.dedent(engine_code).format(**fmt)
                      + textwrap.dedent(SERVER).format(port=port, drain=drain))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a loaded 2-core machine starts it slowly
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not come up: {proc.communicate()[0]}")
        time.sleep(0.1)


def post_in_background(url, body, timeout=120):
    result = {}

    def run():
        try:
            result["r"] = httpx.post(f"{url}/v1/images/generations", json=body,
                                     timeout=timeout)
        except httpx.HTTPError as exc:
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, result


def wait_running(url, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(f"{url}/health").json()
        if h["running"] >= 1:
            return
        assert time.monotonic() < deadline, "request never ran"
        time.sleep(0.01)


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests(tmp_path):
    proc, url = start_server(tmp_path, TOY, drain=60, sleep=0.01)
    try:
        t, result = post_in_background(url, {"prompt": "x", "num_inference_steps": 60})
        wait_running(url)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.TransportError):  # intake stopped: socket closed
            httpx.post(f"{url}/v1/images/generations", json={"prompt": "y"}, timeout=5)
        t.join(60)
        assert result["r"].status_code == 200
        assert result["r"].json()["timing"]["requests"][0]["steps"] == 60
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert [x for x in out.splitlines() if x.startswith("EXIT")] == ["EXIT 0 1 0 0"], out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_sigterm_during_a_long_step_exits_within_drain_plus_one_block(tmp_path):
    block_s, drain = 0.5, 1.0
    proc, url = start_server(tmp_path, SLOW_WAN, drain=drain, block_s=block_s)
    try:
        t, result = post_in_background(url, {"prompt": "x", "num_inference_steps": 50})
        wait_running(url)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        t.join(30)
        assert proc.returncode == 1, out  # drain timed out: the rest was cancelled
        assert took < drain + block_s + 3.0, (took, out)
        assert result["r"].status_code == 503, result
        assert "stopped" in result["r"].json()["error"]["message"]
        assert [x for x in out.splitlines() if x.startswith("EXIT")] == ["EXIT 1 0 1 0"], out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_second_signal_exits_at_once(tmp_path):
    proc, url = start_server(tmp_path, TOY, drain=600, sleep=0.1)
    try:
        t, _ = post_in_background(url, {"prompt": "x", "num_inference_steps": 190})
        wait_running(url)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert proc.poll() is None  # draining, for up to 600 s
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == FORCED and time.monotonic() - t0 < 5
        t.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()


def break_policy(engine):
    schedule = engine.policy.schedule
    broken = [False]

    def schedule_or_raise(now, view):
        if broken[0]:
            raise RuntimeError("scheduler state corrupted")
        return schedule(now, view)

    engine.policy.schedule = schedule_or_raise
    return broken


def test_a_dead_engine_answers_503_everywhere():
    engine = toy_engine(step_sleep_s=0.05)
    broken = break_policy(engine)
    with running_server(engine) as url:
        t, result = post_in_background(url, {"prompt": "x", "num_inference_steps": 190})
        wait_running(url)
        broken[0] = True
        t.join(30)
        r = result["r"]
        assert r.status_code == 503 and "engine died" in r.json()["error"]["message"]
        h = httpx.get(f"{url}/health")
        assert h.status_code == 503 and h.json()["status"] == "dead"
        assert "scheduler state corrupted" in h.json()["reason"]
        assert "ditmem_engine_dead 1.0" in httpx.get(f"{url}/metrics").text
        r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "y"})
        assert r.status_code == 503 and "dead" in r.json()["error"]["message"]
        assert engine.pool.num_used_pages == 0


def test_serve_returns_non_zero_when_the_engine_dies():
    engine = toy_engine(step_sleep_s=0.05).start()
    broken = break_policy(engine)
    app = create_app(engine, ServerConfig(model_name="toy", default_size="32x32",
                                          default_steps=4))
    port, status = free_port(), []
    t = threading.Thread(target=lambda: status.append(
        serve(app, "127.0.0.1", port, "warning", drain_timeout_s=5)))
    t.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    ticket = engine.submit(GenerationRequest(prompt="x", width=32, height=32,
                                             num_inference_steps=190, request_id="a"))
    time.sleep(0.1)
    broken[0] = True
    t.join(30)
    assert status == [ENGINE_DEAD]
    with pytest.raises(EngineFault):
        ticket.future.result(0)
