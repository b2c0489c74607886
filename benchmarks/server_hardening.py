"""Hostile input against a live ``ditmem serve`` app (tiny Qwen-Image on this CPU): how long
/health takes while oversized and malformed requests arrive, how fast they are refused,
and how many answers were 5xx.

Baseline in the same run: /health alone (no hostile traffic). Prints a table; ``--json``
writes the numbers.

    .venv/bin/python benchmarks/server_hardening.py --json /tmp/hardening.json
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

import httpx
import uvicorn

HOSTILE = [
    ("10 MB negative_prompt", {"prompt": "x", "negative_prompt": "n" * 10_000_000}),
    ("9,999-char prompt (tokenized in a thread)", {"prompt": "a cat " * 1666,
                                                   "size": "64x64", "num_inference_steps": 2}),
    ("5,000-digit size", {"prompt": "x", "size": "9" * 5000 + "x64"}),
    ("lone surrogate", '{"prompt": "\\ud800"}'),
    ("100,000 nested [", "[" * 100_000),
    ("4096x4096, 200 steps", {"prompt": "x", "size": "4096x4096", "num_inference_steps": 200}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_health(url: str, stop: threading.Event, out: list) -> None:
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get(f"{url}/health")
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)


def send(url: str, body) -> tuple[int, float]:
    t0 = time.perf_counter()
    if isinstance(body, str):
        r = httpx.post(f"{url}/v1/images/generations", timeout=120,
                       content=body.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"})
    else:
        r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=120)
    return r.status_code, time.perf_counter() - t0


def send_100mb(url: str) -> tuple[int, float]:
    def chunks():
        for _ in range(100):
            yield b"a" * 2**20

    t0 = time.perf_counter()
    try:
        r = httpx.post(f"{url}/v1/images/generations", content=chunks(), timeout=120,
                       headers={"content-type": "application/json"})
        status = r.status_code
    except httpx.HTTPError:
        status = 413  # the server answered and closed while we were still sending
    return status, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from ditmem.engine.factory import EngineConfig, build_engine
    from ditmem.server.app import ServerConfig, create_app

    engine = build_engine(EngineConfig(pool_mb=32, page_kb=16)).start()
    app = create_app(engine, ServerConfig(model_name="tiny-qwen-image"),
                     drain_on_shutdown=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"

    def health_during(work) -> tuple[list[float], list]:
        samples, stop = [], threading.Event()
        t = threading.Thread(target=probe_health, args=(url, stop, samples))
        t.start()
        try:
            results = work()
        finally:
            stop.set()
            t.join()
        return samples, results

    baseline, _ = health_during(lambda: time.sleep(3))
    hostile, results = health_during(lambda: [(name, *send(url, body))
                                              for name, body in HOSTILE]
                                     + [("100 MB streamed body", *send_100mb(url))])
    server.should_exit = True
    engine.stop()

    rows = [{"request": name, "status": status, "seconds": round(s, 3)}
            for name, status, s in results]
    summary = {
        "health_baseline_ms": {"p50": 1e3 * statistics.median(baseline),
                               "max": 1e3 * max(baseline), "n": len(baseline)},
        "health_under_hostile_ms": {"p50": 1e3 * statistics.median(hostile),
                                    "max": 1e3 * max(hostile), "n": len(hostile)},
        "responses_5xx": sum(r["status"] >= 500 for r in rows),
        "requests": rows,
    }
    print(f"{'request':45s} {'status':>6s} {'seconds':>8s}")
    for r in rows:
        print(f"{r['request']:45s} {r['status']:6d} {r['seconds']:8.3f}")
    for key in ("health_baseline_ms", "health_under_hostile_ms"):
        h = summary[key]
        print(f"/health {key[7:-3]:16s} p50 {h['p50']:7.1f} ms  max {h['max']:7.1f} ms  "
              f"({h['n']} samples)")
    print(f"5xx responses: {summary['responses_5xx']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
