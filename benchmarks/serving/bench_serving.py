"""Serving benchmark: a real ``ditmem serve`` process per policy, loaded over HTTP by
``ditmem bench`` with the same trace; fifo (the baseline) vs slo side by side.

    .venv/bin/python benchmarks/serving/bench_serving.py [--quick] [--json OUT]

Prints a table (attainment, P50/P95/P99, per priority) and the slo/fifo P95 ratio measured in
the same run. ``--quick``: 40 requests instead of 150.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILE = os.path.join(ROOT, "benchmarks/serving/cpu-tiny-measured.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(policy: str, port: int, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ditmem.cli", "serve", "--policy", policy, "--port", str(port),
           "--profile", args.profile, "--pool-mb", str(args.pool_mb), "--log-level", "warning",
           "--decode-workers", str(args.decode_workers)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server for {policy} did not start")


def run_policy(policy: str, args) -> dict:
    port = free_port()
    proc = start_server(policy, port, args)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [sys.executable, "-m", "ditmem.cli", "bench", "--url", f"http://127.0.0.1:{port}",
               "--workload", args.workload, "--load", str(args.load), "--requests",
               str(args.requests), "--divisor", str(args.divisor), "--profile", args.profile,
               "--seed", str(args.seed), "--json", out, "--no-progress"]
        subprocess.run(cmd, cwd=ROOT, check=True)
        with open(out) as f:
            data = json.load(f)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        data["summary"]["pages_used_after"] = next(
            float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("ditmem_pages_used "))
        return data
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workload", default="seed-mix")
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--divisor", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=PROFILE)
    p.add_argument("--pool-mb", type=float, default=64.0)
    p.add_argument("--decode-workers", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.requests = args.requests or (40 if args.quick else 150)
    results = {pol: run_policy(pol, args)["summary"] for pol in ("fifo", "slo")}
    rows = [("SLO attainment", "slo_attainment", True), ("P50 (s)", "p50_s", False),
            ("P95 (s)", "p95_s", False), ("P99 (s)", "p99_s", False),
            ("mean (s)", "mean_s", False), ("failed", "failed", False),
            ("pages used after", "pages_used_after", False)]
    print(f"{args.workload} /{args.divisor}, {args.requests} requests, load {args.load}, HTTP")
    print(f"{'':20}{'fifo':>12}{'slo':>12}")
    for label, key, pct in rows:
        vals = [results[p][key] for p in ("fifo", "slo")]
        print(f"{label:20}" + "".join(f"{100 * v:11.1f}%" if pct else f"{v:12.3f}"
                                      for v in vals))
    for prio, name in (("0", "high"), ("1", "normal"), ("2", "low")):
        vals = [results[p]["per_priority"][prio]["slo_attainment"] for p in ("fifo", "slo")]
        print(f"{'attainment ' + name:20}" + "".join(
            "           -" if v is None else f"{100 * v:11.1f}%" for v in vals))
    ratio = results["slo"]["p95_s"] / results["fifo"]["p95_s"]
    print(f"P95 slo / fifo = {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "p95_ratio": ratio}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
