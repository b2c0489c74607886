"""A local Ray cluster running ditmem Serve applications (tests, benchmarks, one machine).

``local_apps({"/a": (engine_config, options), ...}, num_cpus=2)`` starts Ray in this
process (``ray.init(num_cpus=...)``), runs one application per route prefix, waits until
every replica posted its state, yields the HTTP base URL and shuts Serve and Ray down after.
"""

from __future__ import annotations

import contextlib
import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_apps(apps: dict, *, num_cpus: float = 2, server_config=None,
               timeout_s: float = 240.0):
    """``apps``: route prefix -> (``EngineConfig``, ``DeployOptions``). Yields
    ``http://127.0.0.1:PORT``; each application answers under its prefix."""
    import ray
    from ray import serve

    from ditmem.deploy.app import build_app
    from ditmem.server.app import ServerConfig

    port = free_port()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for prefix, (engine_config, options) in apps.items():
            config = server_config or ServerConfig(model_name=engine_config.model)
            name = prefix.strip("/") or "ditmem"
            serve.run(build_app(engine_config, config, options), name=name,
                      route_prefix=prefix)
        url = f"http://127.0.0.1:{port}"
        for prefix, (_, options) in apps.items():
            wait_up(url + prefix.rstrip("/"), options.replicas, timeout_s)
        yield url
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def wait_up(url: str, replicas: int, timeout_s: float) -> None:
    """Until ``url/health/replicas`` shows ``replicas`` replicas up; TimeoutError after
    ``timeout_s``."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            body = httpx.get(f"{url}/health/replicas", timeout=5).json()
            if body.get("up", 0) >= replicas:
                return
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: {replicas} replicas not up within {timeout_s:g} s")
        time.sleep(0.5)
