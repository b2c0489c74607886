"""Run a real ditmem server (uvicorn on 127.0.0.1, a free port) around an engine in a thread."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))

from toy import ToyGenerator, table_profile  # noqa: E402

from ditmem.engine.accounting import ExactPagesCost  # noqa: E402
from ditmem.engine.loop import Engine  # noqa: E402
from ditmem.memory import HostPool, PagePool  # noqa: E402
from ditmem.scheduler import CostModel, make_policy  # noqa: E402
from ditmem.server.app import ServerConfig, create_app  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toy_engine(policy="slo", pages=256, page_bytes=1024, step_sleep_s=0.0, **kw) -> Engine:
    cost = ExactPagesCost(CostModel.from_dict(table_profile()))  # as build_engine does
    return Engine(ToyGenerator(step_sleep_s), make_policy(policy, cost), cost,
                  PagePool(pages, page_bytes), HostPool(4 * pages, page_bytes), **kw)


@contextlib.contextmanager
def running_server(engine: Engine, *, start_engine=True, **config):
    """Yield the base URL of a live server; stop it and the engine afterwards."""
    with running_app(engine, start_engine=start_engine, **config) as (url, _app):
        yield url


@contextlib.contextmanager
def running_app(engine: Engine, *, start_engine=True, **config):
    """Yield (base URL, app) of a live server; stop it and the engine afterwards."""
    config.setdefault("model_name", "toy")
    config.setdefault("default_size", "64x64")
    config.setdefault("default_steps", 4)
    app = create_app(engine, ServerConfig(**config), drain_on_shutdown=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    if start_engine:
        engine.start()
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)
        engine.stop()


def metric(text: str, name: str, labels: str = "") -> float:
    """Value of one sample in a Prometheus exposition (``name{labels} value``)."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == want:
            return float(value)
    raise KeyError(f"no sample {want!r}")


def generate_alone(generator, request, page_bytes: int, pages: int = 512):
    """``request`` through ``generator`` alone (encode, every step, decode) on one torch
    thread, as a node's worker computes: the single-device reference of node tests."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state = generator.encode(request, PagePool(pages, page_bytes))
        while not generator.is_done(state):
            generator.step([state])
        out = generator.decode(state)
        generator.release(state)
        return out
    finally:
        torch.set_num_threads(threads)
