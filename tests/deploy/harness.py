"""A local Ray cluster running the ditmem Serve application, for the deploy tests and
benchmarks: started with ``ray.init(num_cpus=...)``, torn down on exit."""

from __future__ import annotations

import base64
import contextlib
import io
import re
import socket
import time

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_app(engine_config, options, *, num_cpus: float = 2, name: str = "ditmem",
            server_config=None, timeout_s: float = 240.0):
    """Yields the HTTP base URL of the application; shuts Serve and Ray down after."""
    import ray
    from ray import serve

    from ditmem.deploy.app import build_app
    from ditmem.server.app import ServerConfig

    server_config = server_config or ServerConfig(model_name=engine_config.model)
    port = free_port()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(engine_config, server_config, options)
        serve.run(app, name=name, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        wait_up(url, options.replicas, timeout_s)
        yield url
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def wait_up(url: str, replicas: int, timeout_s: float) -> None:
    """Until ``/health/replicas`` shows ``replicas`` replicas up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            body = httpx.get(f"{url}/health/replicas", timeout=5).json()
            if body.get("up", 0) >= replicas:
                return
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{replicas} replicas not up within {timeout_s:g} s")
        time.sleep(0.5)


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample of ``name`` with exactly these labels (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == {k: str(v) for k, v in labels.items()}:
            return float(m.group(3))
    return 0.0


def png(b64: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))
