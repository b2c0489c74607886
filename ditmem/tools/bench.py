"""``ditmem bench``: an async HTTP load generator for a running ditmem (or vllm-omni) server.

Requests come from a named workload, a trace file, or a random mix of square sides
(``--random-sides 128,256,512``: each request one side, uniformly, ``--steps`` steps,
priority 1); arrivals are Poisson or gamma (``--arrival gamma:CV``) at ``--load`` ρ (rate =
ρ / mean standalone time on ``--profile``) or at a fixed ``--rate``; the same seed gives the
same arrivals. A request meets its SLO when it succeeded and its latency as the client saw
it (send to response) is at most its SLO (the vllm-omni benchmark's rule). Where the SLO
comes from (``--slo-rule``):

* ``profile`` (default): ``--slo-scale`` × the request's standalone time on ``--profile``
  (or the trace's ``slo_ms``), sent to the server as ``slo_ms``;
* ``warmup`` — the vllm-omni benchmark's client-side SLO: before the load, the first
  ``--warmup-requests`` requests of the list are sent one at a time with ``--warmup-steps``
  steps; a unit time is the median of their latency ÷ (pixels/256 × frames × steps), and a
  request's SLO is ``--slo-scale`` × unit × its pixels/256 × frames × steps. Nothing is sent
  as ``slo_ms``: the server schedules by its own profile, the client judges by its own
  estimate (as with that client).

Metrics have the same fields as ``ditmem sim --json``; ``--json`` adds every request's
latency and SLO (``per_request``) so runs can be rescored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="seed-mix | omni-mix | omni-preempt | ...")
    src.add_argument("--trace", help="vllm-omni Request(...) lines or JSONL")
    src.add_argument("--random-sides", default=None,
                     help="comma-separated square sides in pixels, drawn uniformly per "
                          "request (e.g. 128,256,512)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--load", type=float, default=None, help="target load rho (default 0.8)")
    rate.add_argument("--rate", type=float, default=None, help="arrivals per second")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--profile", default="cpu-tiny", help="cost model for rho and deadlines")
    p.add_argument("--divisor", type=int, default=2, help="pixel divisor of workload shapes")
    p.add_argument("--arrival", default="poisson", help="poisson | gamma:CV")
    p.add_argument("--steps", type=int, default=28,
                   help="denoising steps of --random-sides requests")
    p.add_argument("--slo-scale", type=float, default=3.0)
    p.add_argument("--slo-rule", choices=SLO_RULES, default="profile",
                   help="profile: SLO from --profile, sent as slo_ms; warmup: the vllm-omni "
                        "benchmark's client-side SLO from warm-up requests (module docstring)")
    p.add_argument("--warmup-requests", type=int, default=1,
                   help="--slo-rule warmup: warm-up requests (the vllm-omni client's default 1)")
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="--slo-rule warmup: steps of each warm-up request (default 2: the "
                        "vllm-omni client's 1 is refused by Qwen-Image, whose schedule "
                        "needs >= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", choices=("images", "chat"), default="images")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    p.add_argument("--max-concurrency", type=int, default=1024)
    p.add_argument("--json", default=None)
    p.add_argument("--no-progress", action="store_true")


SLO_RULES = ("profile", "warmup")


def parse_sides(spec: str) -> tuple[int, ...]:
    """``"128,256,512"`` → (128, 256, 512); ValueError naming ``--random-sides`` otherwise."""
    try:
        sides = tuple(int(x) for x in spec.split(","))
    except ValueError:
        sides = ()
    if not sides or any(s < 16 or s % 16 for s in sides):
        raise ValueError(f"--random-sides: comma-separated multiples of 16 (>= 16), "
                         f"got {spec!r}")
    return sides


def random_mix(sides: tuple[int, ...], n: int, steps: int, seed: int) -> list:
    """``n`` priority-1 requests, each of one of ``sides`` (uniform, seeded), arrival 0."""
    from ditmem.scheduler.request import Request

    rng = random.Random(seed)
    out = []
    for i in range(n):
        side = rng.choice(sides)
        out.append(Request(f"r{i:05d}", 0.0, "qwen-image", side, side, 1, steps, 1, seed=i))
    return out


def check_arguments(args) -> None:
    """ValueError naming the bad option (the CLI turns it into a clear exit)."""
    if getattr(args, "random_sides", None):
        parse_sides(args.random_sides)
    if getattr(args, "steps", 1) < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if getattr(args, "slo_rule", "profile") == "warmup":
        if args.warmup_requests < 1:
            raise ValueError(f"--warmup-requests must be >= 1 with --slo-rule warmup, "
                             f"got {args.warmup_requests}")
        if args.warmup_steps < 1:
            raise ValueError(f"--warmup-steps must be >= 1, got {args.warmup_steps}")
    if args.slo_scale <= 0:
        raise ValueError(f"--slo-scale must be > 0, got {args.slo_scale}")


def build_requests(args, cost) -> list:
    """Scheduler ``Request``s with arrivals (s from start) and deadlines."""
    from ditmem.scheduler.traces import load_trace
    from ditmem.scheduler.workloads import arrival_times, parse_arrival, with_load, workload

    load = 0.8 if args.load is None and args.rate is None else args.load
    sides = getattr(args, "random_sides", None)
    if sides:
        reqs = random_mix(parse_sides(sides), args.requests or 200, args.steps, args.seed)
        stamped = False
    elif args.workload:
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


def slo_units(r, steps: int | None = None) -> float:
    """The vllm-omni client's size of a request: pixels/256 (at least 1) × frames × steps."""
    return max(r.width * r.height / 256.0, 1.0) * max(r.frames, 1) * (steps or r.steps)


def warmup_unit(latencies_s: list[float], warm: list, steps: int) -> float:
    """Median seconds per unit (``slo_units``) over the warm-up requests that succeeded
    (``latencies_s`` None for a failure); ValueError when none did."""
    per = sorted(t / slo_units(r, steps) for t, r in zip(latencies_s, warm, strict=True)
                 if t is not None and t > 0)
    if not per:
        raise ValueError("every warm-up request failed: no client-side SLO can be set")
    mid = len(per) // 2
    return per[mid] if len(per) % 2 else 0.5 * (per[mid - 1] + per[mid])


def apply_warmup_slo(requests: list, unit_s: float, scale: float) -> None:
    """Each request's deadline = arrival + ``scale`` × ``unit_s`` × its ``slo_units``."""
    for r in requests:
        r.deadline = r.arrival + scale * unit_s * slo_units(r)


def request_body(r, endpoint: str, send_slo: bool = True) -> tuple[str, dict]:
    """(path, JSON body) of one request for the chosen endpoint (``slo_ms`` only when
    ``send_slo``)."""
    from ditmem.tools.replay import PROMPTS

    prompt = r.prompt or PROMPTS[(r.seed or 0) % len(PROMPTS)]
    fields = {"num_inference_steps": r.steps, "seed": r.seed or 0, "priority": r.priority}
    if send_slo:
        fields["slo_ms"] = 1000.0 * (r.deadline - r.arrival)
    if endpoint == "chat":
        fields.update(width=r.width, height=r.height)
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                        "extra_body": fields}
    return "/v1/images/generations", dict(fields, prompt=prompt, size=f"{r.width}x{r.height}",
                                          response_format="b64_json")


async def run_load(args, requests, progress=None) -> list[dict]:
    """Send every request at its arrival time; one outcome dict per request."""
    import httpx

    send_slo = getattr(args, "slo_rule", "profile") != "warmup"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency,
                          max_keepalive_connections=args.max_concurrency)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout, headers=headers,
                                 limits=limits) as client:
        t0 = time.perf_counter()

        async def one(r) -> dict:
            await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
            path, body = request_body(r, args.endpoint, send_slo)
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


async def run_warmup(args, requests) -> tuple[list, list[float | None], list[str]]:
    """Send the first ``--warmup-requests`` of ``requests`` (cycled) one at a time with
    ``--warmup-steps`` steps: the warm-up requests, each one's latency (s; None when it
    failed) and the errors of those that failed."""
    import copy

    warm = [copy.copy(requests[i % len(requests)]) for i in range(args.warmup_requests)]
    for n, r in enumerate(warm):
        r.id, r.arrival, r.steps = f"warmup-{n}", 0.0, args.warmup_steps
        r.deadline = None
    out, errors = [], []
    for r in warm:
        ns = argparse.Namespace(**{**vars(args), "slo_rule": "warmup"})
        (o,) = await run_load(ns, [r])
        out.append(o["finished"] - o["sent"] if o["ok"] else None)
        if not o["ok"]:
            errors.append(f"{r.width}x{r.height}: HTTP {o['status']} {o['error']}")
    return warm, out, errors


def main(args) -> int:
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.metrics import summarize

    try:
        check_arguments(args)
        cost = CostModel.load(args.profile)
        requests = build_requests(args, cost)
    except (ValueError, OSError) as exc:
        print(f"ditmem bench: {exc}", file=sys.stderr)
        return 2
    warmup = None
    if args.slo_rule == "warmup":
        warm, latencies, errors = asyncio.run(run_warmup(args, requests))
        try:
            unit = warmup_unit(latencies, warm, args.warmup_steps)
        except ValueError as exc:
            print(f"ditmem bench: {exc} ({'; '.join(errors)})", file=sys.stderr)
            return 1
        apply_warmup_slo(requests, unit, args.slo_scale)
        warmup = {"requests": args.warmup_requests, "steps": args.warmup_steps,
                  "latencies_s": latencies, "unit_s": unit}
        print(f"warm-up: {args.warmup_requests} request(s) x {args.warmup_steps} step(s), "
              f"unit {1e6 * unit:.2f} us per 16x16 patch-step; SLO = {args.slo_scale} x unit "
              "x pixels/256 x steps (client side)")
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
               "trace": args.trace, "random_sides": args.random_sides, "load": args.load,
               "rate": args.rate, "arrival": args.arrival, "profile": args.profile,
               "seed": args.seed, "slo_rule": args.slo_rule, "slo_scale": args.slo_scale,
               "warmup": warmup, "requests": len(requests), "summary": summary,
               "per_request": [per_request(o) for o in outcomes]}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"json: {args.json}")
    return 0


def per_request(o: dict) -> dict:
    """One outcome as JSON: id, shape, steps, priority, arrival, latency (s; None when it
    failed), SLO (s) and whether it was met."""
    r = o["request"]
    latency = o["finished"] - r.arrival if o["ok"] else None
    slo = r.deadline - r.arrival
    return {"id": r.id, "width": r.width, "height": r.height, "frames": r.frames,
            "steps": r.steps, "priority": r.priority, "arrival_s": r.arrival,
            "latency_s": latency, "slo_s": slo, "met": latency is not None and latency <= slo,
            "status": o["status"]}


def format_summary(args, s: dict) -> str:
    src = args.workload or args.trace or f"random {args.random_sides}"
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
