"""Serving benchmark: a real ``ditmem serve`` process per policy, loaded over HTTP by
``ditmem bench`` with the same arrivals; fifo (the baseline) and slo one after the other.

    .venv/bin/python benchmarks/serving/bench_serving.py [--quick] [--json OUT]
    .venv/bin/python benchmarks/serving/bench_serving.py --mix omni-random [--quick] [--json OUT]
    .venv/bin/python benchmarks/serving/bench_serving.py --mix omni-random \
        --runs fifo,slo,slo:packing=0

``--mix workload`` (default): ``--workload`` (seed-mix) ÷ ``--divisor``, SLO = 3 × the
committed profile's standalone time, sent to the server as ``slo_ms``.

``--mix omni-random``: the vllm-omni benchmark's rules. Requests are square 128², 256² or
512² (uniform, seeded), ``--steps`` 28, priority 1, over ``/v1/chat/completions``; Poisson
arrivals at ``--load`` on the server's own start-up profile (the first server measures it,
``--profile measure``, into a temporary cache the second server loads, so both schedule
with one profile and get the same arrivals); the SLO is the client's: one warm-up request
(that client's default) of 2 steps (its default 1 is refused: Qwen-Image's schedule needs
>= 2) gives a unit time per 16×16 patch-step and a request's
SLO is 3 × unit × pixels/256 × steps; nothing is sent as ``slo_ms``. Each run warms up
on its own server (the rule); the table also scores both runs with one SLO (the two units'
mean), so a difference between warm-ups cannot decide the comparison. 200 requests (≈ 80 s
per policy at ρ 0.8 on the 2-core CPU) + one profile measurement (≈ 1 min): ≈ 5 minutes.
``--quick``: 40 requests (40 for ``--mix workload`` too, else 150).

Prints a table (attainment, P50/P95/P99/max, per priority, the warm-up unit) and the
slo/fifo P95 and P99 ratios measured in the same run; ``--json`` writes it all, with each
run's per-request latencies and SLOs.
"""

from __future__ import annotations

import argparse
import glob
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
OMNI_SIDES = "128,256,512"
#: the runs, one server each: a policy, optionally with options (``slo:packing=0``)
DEFAULT_RUNS = "fifo,slo"


def parse_run(label: str) -> tuple[str, list[str]]:
    """``"slo:packing=0;tail=\"fifo\""`` -> ("slo", ["slo.packing=0", 'slo.tail="fifo"'])."""
    policy, _, rest = label.partition(":")
    return policy, [f"{policy}.{kv}" for kv in rest.split(";") if kv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: str, port: int, profile: str, args, env: dict) -> subprocess.Popen:
    policy, opts = parse_run(run)
    cmd = [sys.executable, "-m", "ditmem.cli", "serve", "--policy", policy, "--port", str(port),
           "--profile", profile, "--pool-mb", str(args.pool_mb), "--log-level", "warning",
           "--decode-workers", str(args.decode_workers), "--slo-scale", str(args.slo_scale)]
    cmd += [a for opt in opts for a in ("--opt", opt)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {run} exited with {proc.returncode} at start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server for {run} did not start in {args.start_timeout:.0f} s")


def bench_command(url: str, profile: str, out: str, args) -> list[str]:
    cmd = [sys.executable, "-m", "ditmem.cli", "bench", "--url", url, "--load", str(args.load),
           "--requests", str(args.requests), "--profile", profile, "--seed", str(args.seed),
           "--json", out, "--no-progress"]
    if args.mix == "omni-random":
        return cmd + ["--random-sides", OMNI_SIDES, "--steps", str(args.steps),
                      "--endpoint", "chat", "--slo-rule", "warmup", "--warmup-requests", "1",
                      "--warmup-steps", "2"]
    return cmd + ["--workload", args.workload, "--divisor", str(args.divisor)]


def run_policy(policy: str, server_profile: str, client_profile: str | None, args,
               env: dict) -> tuple[dict, str]:
    """One server, one bench: the bench's JSON (with ``pages_used_after`` from /metrics) and
    the client profile used (the server's start-up measurement when ``client_profile`` is
    None)."""
    port = free_port()
    proc = start_server(policy, port, server_profile, args, env)
    try:
        if client_profile is None:
            found = sorted(glob.glob(os.path.join(env["DITMEM_CACHE"], "profiles", "*.json")))
            if not found:
                raise RuntimeError("the server kept no start-up profile")
            client_profile = found[0]
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        subprocess.run(bench_command(f"http://127.0.0.1:{port}", client_profile, out, args),
                       cwd=ROOT, check=True)
        with open(out) as f:
            data = json.load(f)
        os.unlink(out)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        data["summary"]["pages_used_after"] = next(
            float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("ditmem_pages_used "))
        return data, client_profile
    finally:
        proc.terminate()
        proc.wait(120)


def common_attainment(run: dict, unit_s: float) -> float:
    """Attainment of ``run`` if every SLO came from ``unit_s`` instead of its own warm-up."""
    own = run["warmup"]["unit_s"]
    met = sum(r["latency_s"] is not None and r["latency_s"] <= r["slo_s"] * unit_s / own
              for r in run["per_request"])
    return met / len(run["per_request"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mix", choices=("workload", "omni-random"), default="workload",
                   help="workload: --workload ÷ --divisor with profile SLOs; omni-random: "
                        "128²/256²/512² under the vllm-omni benchmark's rules")
    p.add_argument("--quick", action="store_true", help="40 requests")
    p.add_argument("--workload", default="seed-mix")
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--requests", type=int, default=None,
                   help="default 150 (workload) / 200 (omni-random); --quick 40")
    p.add_argument("--steps", type=int, default=28, help="omni-random: steps per request")
    p.add_argument("--divisor", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None,
                   help="servers' and client's profile (default: the committed "
                        "cpu-tiny-measured.json for workload; for omni-random a fresh "
                        "start-up measurement)")
    p.add_argument("--pool-mb", type=float, default=64.0)
    p.add_argument("--decode-workers", type=int, default=0)
    p.add_argument("--slo-scale", type=float, default=3.0,
                   help="every server's own deadlines: scale x its standalone estimate "
                        "(ditmem serve --slo-scale; the client's SLO is its own rule)")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds a server may take to start (a measurement included)")
    p.add_argument("--runs", default=DEFAULT_RUNS,
                   help="comma-separated runs, one server each, in this order: a policy, "
                        "optionally with its options as POLICY:KEY=VALUE;KEY=VALUE (e.g. "
                        "fifo,slo,slo:packing=0); fifo must be one (the ratios' baseline)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    runs_list = [r.strip() for r in args.runs.split(",") if r.strip()]
    if "fifo" not in runs_list or len(set(runs_list)) != len(runs_list):
        p.error(f"--runs: fifo must be one of the runs, each once; got {args.runs!r}")
    if args.requests is None:
        args.requests = 40 if args.quick else (200 if args.mix == "omni-random" else 150)
    started = time.monotonic()
    results, runs = {}, {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, DITMEM_CACHE=cache)
        if args.profile is not None:
            server_profile = client_profile = args.profile
        elif args.mix == "omni-random":
            server_profile, client_profile = "measure", None
        else:
            server_profile = client_profile = PROFILE
        for n, pol in enumerate(runs_list):
            runs[pol], client_profile = run_policy(pol, server_profile, client_profile, args,
                                                   env)
            results[pol] = runs[pol]["summary"]
            if n == 0 and server_profile == "measure":
                server_profile = client_profile  # the second server loads the same one
        with open(client_profile) as f:
            profile_data = json.load(f)  # kept: the temporary cache goes with the run
    wall = time.monotonic() - started
    print_table(args, runs_list, results, runs, client_profile, wall)
    ratios = {f"{q}_ratio": results["slo"][f"{q}_s"] / results["fifo"][f"{q}_s"]
              for q in ("p95", "p99") if "slo" in results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "profile": client_profile,
                       "profile_data": profile_data, "wall_s": wall,
                       "results": results, **ratios,
                       "runs": {pol: runs[pol] for pol in runs_list}}, f, indent=2)
        print(f"json: {args.json}")
    return 0


def print_table(args, runs_list: list[str], results: dict, runs: dict, profile: str,
                wall: float) -> None:
    src = (f"omni-random {OMNI_SIDES} x {args.steps} steps, client-side SLO (warm-up)"
           if args.mix == "omni-random" else f"{args.workload} /{args.divisor}")
    print(f"{src}, {args.requests} requests, Poisson load {args.load} on {profile}, HTTP, "
          f"seed {args.seed}, {wall:.0f} s in all")
    print(f"{'':26}" + "".join(f"{pol:>16}" for pol in runs_list))
    rows = [("SLO attainment", "slo_attainment", True), ("P50 (s)", "p50_s", False),
            ("P95 (s)", "p95_s", False), ("P99 (s)", "p99_s", False), ("max (s)", "max_s", False),
            ("mean (s)", "mean_s", False), ("failed", "failed", False),
            ("pages used after", "pages_used_after", False)]
    for label, key, pct in rows:
        vals = [results[pol][key] for pol in runs_list]
        print(f"{label:26}" + "".join(f"{100 * v:15.1f}%" if pct else f"{v:16.3f}"
                                      for v in vals))
    if args.mix == "omni-random":
        units = [runs[pol]["warmup"]["unit_s"] for pol in runs_list]
        print(f"{'warm-up unit (us)':26}" + "".join(f"{1e6 * u:16.2f}" for u in units))
        mean = sum(units) / len(units)
        for pol in runs_list:
            results[pol]["attainment_common_slo"] = common_attainment(runs[pol], mean)
        print(f"{'attainment, one SLO':26}" + "".join(
            f"{100 * results[pol]['attainment_common_slo']:15.1f}%" for pol in runs_list))
    else:
        for prio, name in (("0", "high"), ("1", "normal"), ("2", "low")):
            vals = [results[pol]["per_priority"][prio]["slo_attainment"] for pol in runs_list]
            print(f"{'attainment ' + name:26}" + "".join(
                "               -" if v is None else f"{100 * v:15.1f}%" for v in vals))
    for pol in runs_list:
        if pol == "fifo":
            continue
        for q in ("p95", "p99"):
            ratio = results[pol][f"{q}_s"] / results["fifo"][f"{q}_s"]
            print(f"{q.upper()} {pol} / fifo = {ratio:.3f} ({'<=' if ratio <= 1 else '>'} 1)")


if __name__ == "__main__":
    sys.exit(main())
