"""``ditmem bench``: an async HTTP load generator for a running ditmem (or vllm-omni) server.

Requests come from a named workload or a trace file; arrivals are Poisson or gamma
(``--arrival gamma:CV``) at ``--load`` ρ (rate = ρ / mean standalone time on ``--profile``)
or at a fixed ``--rate``. Each request carries ``priority`` and ``slo_ms``; the SLO rule is
the vllm-omni benchmark's: a request meets its SLO when it succeeded and its latency (as the
client saw it) is at most ``slo_ms``. Metrics have the same fields as ``ditmem sim --json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="seed-mix | omni-mix | omni-preempt | ...")
    src.add_argument("--trace", help="vllm-omni Request(...) lines or JSONL")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--load", type=float, default=None, help="target load rho (default 0.8)")
    rate.add_argument("--rate", type=float, default=None, help="arrivals per second")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--profile", default="cpu-tiny", help="cost model for rho and deadlines")
    p.add_argument("--divisor", type=int, default=2, help="pixel divisor of workload shapes")
    p.add_argument("--arrival", default="poisson", help="poisson | gamma:CV")
    p.add_argument("--slo-scale", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", choices=("images", "chat"), default="images")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    p.add_argument("--max-concurrency", type=int, default=1024)
    p.add_argument("--json", default=None)
    p.add_argument("--no-progress", action="store_true")


def build_requests(args, cost) -> list:
    """Scheduler ``Request``s with arrivals (s from start) and deadlines."""
    from ditmem.scheduler.traces import load_trace
    from ditmem.scheduler.workloads import arrival_times, parse_arrival, with_load, workload

    load = 0.8 if args.load is None and args.rate is None else args.load
    if args.workload:
        reqs = workload(args.workload, cost, load=load or 0.8, requests=args.requests,
                        seed=args.seed, arrival=args.arrival, scale="gpu")
        for r in reqs:
            r.width = max(16, r.width // args.divisor // 16 * 16)
            r.height = max(16, r.height // args.divisor // 16 * 16)
        stamped = False
    else:
        trace = load_trace(args.trace)
        reqs, stamped = trace.requests[: args.requests or None], trace.has_timestamps
    if args.rate is not None:
        rng = random.Random(args.seed)
        times = arrival_times(len(reqs), args.rate, parse_arrival(args.arrival), rng)
        for r, t in zip(reqs, times, strict=True):
            r.arrival = t
            cost.assign_deadline(r, args.slo_scale)
        return reqs
    if stamped and args.load is None:
        return [cost.assign_deadline(r, args.slo_scale) for r in reqs]
    return with_load(reqs, cost, load, seed=args.seed, arrival=args.arrival,
                     slo_scale=args.slo_scale)


def request_body(r, endpoint: str) -> tuple[str, dict]:
    """(path, JSON body) of one request for the chosen endpoint."""
    from ditmem.tools.replay import PROMPTS

    prompt = r.prompt or PROMPTS[(r.seed or 0) % len(PROMPTS)]
    fields = {"num_inference_steps": r.steps, "seed": r.seed or 0, "priority": r.priority,
              "slo_ms": 1000.0 * (r.deadline - r.arrival)}
    if endpoint == "chat":
        fields.update(width=r.width, height=r.height)
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                        "extra_body": fields}
    return "/v1/images/generations", dict(fields, prompt=prompt, size=f"{r.width}x{r.height}",
                                          response_format="b64_json")


async def run_load(args, requests, progress=None) -> list[dict]:
    """Send every request at its arrival time; one outcome dict per request."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency,
                          max_keepalive_connections=args.max_concurrency)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout, headers=headers,
                                 limits=limits) as client:
        t0 = time.perf_counter()

        async def one(r) -> dict:
            await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
            path, body = request_body(r, args.endpoint)
            start = time.perf_counter()
            try:
                resp = await client.post(path, json=body)
                ok, status = resp.status_code == 200, resp.status_code
                error = None if ok else resp.text[:200]
            except httpx.HTTPError as exc:
                ok, status, error = False, None, repr(exc)
            end = time.perf_counter()
            if progress is not None:
                progress.update(1)
            return {"request": r, "ok": ok, "status": status, "error": error,
                    "sent": start - t0, "finished": end - t0}

        return await asyncio.gather(*(one(r) for r in requests))


def to_records(outcomes: list[dict]):
    """Scheduler ``Record``s (latency from the scheduled arrival; failures finish at inf)."""
    from ditmem.scheduler.simulator import Record

    out = []
    for o in outcomes:
        fin = o["finished"] if o["ok"] else math.inf
        out.append(Record(request=o["request"], started=o["sent"], finished=fin,
                          preemptions=0, offloads=0))
    return out


def main(args) -> int:
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.metrics import summarize

    cost = CostModel.load(args.profile)
    requests = build_requests(args, cost)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc="bench", unit="req")
    started = time.perf_counter()
    outcomes = asyncio.run(run_load(args, requests, bar))
    if bar is not None:
        bar.close()
    summary = summarize(to_records(outcomes))
    summary["failed"] = sum(not o["ok"] for o in outcomes)
    summary["wall_s"] = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[str(o["status"])] = statuses.get(str(o["status"]), 0) + 1
    summary["http_status"] = statuses
    print(format_summary(args, summary))
    if args.json:
        out = {"command": "bench", "url": args.url, "workload": args.workload,
               "trace": args.trace, "load": args.load, "rate": args.rate,
               "arrival": args.arrival, "profile": args.profile, "seed": args.seed,
               "requests": len(requests), "summary": summary}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"json: {args.json}")
    return 0


def format_summary(args, s: dict) -> str:
    src = args.workload or args.trace
    lines = [f"bench {src} -> {args.url}: {s['requests']} requests, "
             f"{s['failed']} failed, wall {s['wall_s']:.1f} s",
             f"SLO attainment {100 * s['slo_attainment']:.1f}%   P50 {s['p50_s']:.3f} s   "
             f"P95 {s['p95_s']:.3f} s   P99 {s['p99_s']:.3f} s   mean {s['mean_s']:.3f} s"]
    for p, name in (("0", "high"), ("1", "normal"), ("2", "low")):
        c = s["per_priority"][p]
        if c["requests"]:
            lines.append(f"  {name:>6}: {c['requests']:4d} req, attainment "
                         f"{100 * c['slo_attainment']:.1f}%, P95 {c['p95_s']:.3f} s")
    return "\n".join(lines)
