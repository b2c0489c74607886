"""The ditmem request router vs Ray Serve's default, side by side on one local Ray cluster.

Two applications run at once on the same cluster, each 2 replicas of tiny-qwen-image
(``--cpus-per-replica`` CPUs each): ``/ditmem`` routed by :class:`DitmemRequestRouter`,
``/ray`` by Ray Serve's default (power of two choices on queue length). The same replay
(``ditmem bench``'s workloads: shapes, priorities, SLOs, Poisson or gamma arrivals) goes
to both at the same moments, so both see the same background load; one run per seed, the
table shows each and the median. Then the router's decision time: the function
``choose_replicas`` calls (:func:`ditmem.deploy.router.rank_candidates`) timed on fake
replicas with reported stats and a routing book, for 2 to 32 replicas.

    python benchmarks/deploy/bench_router.py [--requests 80] [--seeds 0 1] [--json OUT]

``--arms`` picks the applications compared: ``ditmem`` (the ditmem router, its replicas'
rebalancer migrating late parked requests), ``ditmem-static`` (the same router, no
migration: ``--move-period 0``) and ``ray`` (Ray's default router; moves only on order).
``--arms ditmem ditmem-static`` measures migration against none, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import statistics
import time
from types import SimpleNamespace

ROUTERS = ("ditmem", "ray")
ARMS = ("ditmem", "ditmem-static", "ray")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="seed-mix")
    p.add_argument("--divisor", type=int, default=4, help="pixel divisor of the shapes")
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--load", type=float, default=0.8,
                   help="rho of the whole cluster of one router's replicas")
    p.add_argument("--arrival", default="gamma:2", help="poisson | gamma:CV")
    p.add_argument("--profile", default="benchmarks/serving/cpu-tiny-measured.json")
    p.add_argument("--slo-scale", type=float, default=3.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--cpus-per-replica", type=float, default=0.5)
    p.add_argument("--speed", type=float, default=None,
                   help="capacity of one replica relative to the profile (default: "
                        "measured in the warm-up: 1 / the replicas' median correction)")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ROUTERS),
                   help="applications run side by side (module docstring)")
    p.add_argument("--decision-only", action="store_true", help="skip the Ray runs")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


# --------------------------------------------------------------------- decision time
def time_decisions(replicas: int, repeats: int = 2000, seed: int = 0) -> dict:
    """Median and P99 seconds of one routing decision over ``replicas`` replicas with
    random reports and 3 routed-since-report entries each: wall time, and this thread's
    CPU time (what the decision costs when the OS does not take the core away)."""
    from ditmem.deploy.router import rank_candidates
    from ditmem.scheduler.routing import ReplicaLoad, RouteRequest, RoutingBook

    rng = random.Random(seed)
    now = time.time()
    fakes, book = [], RoutingBook()
    for i in range(replicas):
        load = ReplicaLoad(f"r{i}", tuple(rng.uniform(0, 20) for _ in range(3)),
                           tuple(rng.uniform(-5, 30) for _ in range(3)), rng.randrange(500),
                           500, rng.randrange(40), now - rng.uniform(0, 1),
                           rng.uniform(0.8, 1.5))
        fakes.append(SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}"),
                                     routing_stats=load.as_dict()))
        for _ in range(3):
            book.record(f"r{i}", RouteRequest("x", rng.uniform(0.1, 5), 4, 1, now + 10),
                        now - rng.uniform(0, 0.5))
    wall, cpu = [], []
    for k in range(repeats):
        route = RouteRequest(f"q{k}", rng.uniform(0.1, 5), rng.randrange(1, 40),
                             rng.randrange(3), now + rng.uniform(1, 30))
        t, c = time.perf_counter(), time.thread_time()
        rank_candidates(route, fakes, book, now)
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    wall.sort()
    cpu.sort()
    p99 = int(0.99 * (len(wall) - 1))
    return {"replicas": replicas, "median_s": statistics.median(wall), "p99_s": wall[p99],
            "cpu_median_s": statistics.median(cpu), "cpu_p99_s": cpu[p99]}


# --------------------------------------------------------------------- replay
def build_trace(args, seed: int, cost, speed: float):
    """The replay at ``args.load`` for 2 replicas running ``speed`` x the profile."""
    from ditmem.tools.bench import build_requests

    ns = SimpleNamespace(workload=args.workload, trace=None, rate=None,
                         load=args.load * 2 * speed, requests=args.requests,
                         seed=seed, arrival=args.arrival, divisor=args.divisor,
                         slo_scale=args.slo_scale)
    requests = build_requests(ns, cost)
    for r in requests:  # deadlines as the replicas will run them (speed x slower)
        r.deadline = r.arrival + (r.deadline - r.arrival) / speed
    return requests


async def replay_both(base: str, requests, arms=ROUTERS) -> dict:
    from ditmem.tools.bench import run_load

    runs = {}
    for name in arms:
        ns = SimpleNamespace(url=f"{base}/{name}", api_key=None, max_concurrency=512,
                             timeout=900.0, endpoint="images")
        runs[name] = run_load(ns, copy.deepcopy(requests))
    outcomes = await asyncio.gather(*runs.values())
    return dict(zip(runs, outcomes, strict=True))


def replica_rows(url: str) -> list[dict]:
    import httpx

    return httpx.get(f"{url}/health/replicas", timeout=10).json()["replicas"]


def routed_counts(url: str) -> dict[str, int]:
    return {r["replica"]: r["routed"] for r in replica_rows(url)}


def moved_count(url: str) -> float:
    """``ditmem_moved_total`` of an application's ingress."""
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ditmem_moved_total "):
            return float(line.split()[1])
    return 0.0


def arm_options(name: str, args):
    from ditmem.deploy.app import DeployOptions
    from ditmem.deploy.replica import MoveOptions

    router = "ray" if name == "ray" else "ditmem"
    moves = (MoveOptions(period_s=0.0) if name == "ditmem-static"
             else MoveOptions(rule=router == "ditmem"))
    return DeployOptions(replicas=2, router=router, moves=moves,
                         devices_per_replica=args.cpus_per_replica)


def run_ray(args, cost) -> list[dict]:
    from ditmem.deploy.local import local_apps
    from ditmem.engine.factory import EngineConfig
    from ditmem.scheduler.metrics import summarize
    from ditmem.tools.bench import to_records

    config = EngineConfig(model="tiny-qwen-image", pool_mb=16, max_active=32,
                          max_queued=256, profile=os.path.abspath(args.profile),
                          slo_scale=args.slo_scale)
    arms = tuple(args.arms)
    apps = {f"/{name}": (config, arm_options(name, args)) for name in arms}
    rows = []
    with local_apps(apps, num_cpus=4 * args.cpus_per_replica) as base:
        warm = build_trace(args, 999, cost, 1.0)[:8]
        for r in warm:
            r.arrival = 0.0
        asyncio.run(replay_both(base, warm, arms))
        time.sleep(1.0)
        speed = args.speed
        if speed is None:
            corrections = [r["speed"] for n in arms for r in replica_rows(f"{base}/{n}")]
            speed = 1.0 / statistics.median(corrections)
        print(f"replica speed vs the profile: {speed:.3f}")
        for seed in args.seeds:
            before = {n: routed_counts(f"{base}/{n}") for n in arms}
            moved_before = {n: moved_count(f"{base}/{n}") for n in arms}
            requests = build_trace(args, seed, cost, speed)
            started = time.perf_counter()
            outcomes = asyncio.run(replay_both(base, requests, arms))
            wall = time.perf_counter() - started
            for name in arms:
                s = summarize(to_records(outcomes[name]))
                after = routed_counts(f"{base}/{name}")
                rows.append({"seed": seed, "router": name, "requests": len(requests),
                             "failed": sum(not o["ok"] for o in outcomes[name]),
                             "attainment": s["slo_attainment"], "p50_s": s["p50_s"],
                             "p95_s": s["p95_s"], "p99_s": s["p99_s"],
                             "routed": sorted((n - before[name].get(k, 0)
                                               for k, n in after.items()), reverse=True),
                             "moved": moved_count(f"{base}/{name}") - moved_before[name],
                             "wall_s": wall, "speed": speed})
    return rows


def print_rows(rows: list[dict], arms=ROUTERS) -> None:
    print(f"{'seed':>4} {'arm':>13} {'attain':>7} {'P50 s':>7} {'P95 s':>7} {'P99 s':>7} "
          f"{'failed':>6} {'moved':>5}  split")
    for r in rows:
        print(f"{r['seed']:>4} {r['router']:>13} {100 * r['attainment']:6.1f}% "
              f"{r['p50_s']:7.2f} {r['p95_s']:7.2f} {r['p99_s']:7.2f} {r['failed']:>6} "
              f"{r.get('moved', 0):>5.0f}  {r['routed']}")
    for name in arms:
        mine = [r for r in rows if r["router"] == name]
        if mine:
            print(f"{'med':>4} {name:>13} "
                  f"{100 * statistics.median(r['attainment'] for r in mine):6.1f}% "
                  f"{statistics.median(r['p50_s'] for r in mine):7.2f} "
                  f"{statistics.median(r['p95_s'] for r in mine):7.2f} "
                  f"{statistics.median(r['p99_s'] for r in mine):7.2f}")


def main(argv=None) -> int:
    from ditmem.scheduler import CostModel

    args = parse_args(argv)
    decisions = [time_decisions(n) for n in (2, 4, 8, 32)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("router decision (rank_candidates, what choose_replicas runs):")
    for d in decisions:
        print(f"  {d['replicas']:>3} replicas: wall median {1e6 * d['median_s']:7.1f} us, "
              f"P99 {1e6 * d['p99_s']:7.1f} us; CPU median {1e6 * d['cpu_median_s']:7.1f} us, "
              f"P99 {1e6 * d['cpu_p99_s']:7.1f} us")
    rows = [] if args.decision_only else run_ray(args, CostModel.load(args.profile))
    if rows:
        print(f"\n{args.workload} / {args.divisor}, {args.requests} requests, rho "
              f"{args.load} per router, {args.arrival}, 2 replicas x "
              f"{args.cpus_per_replica} CPU per application, all at once:")
        print_rows(rows, args.arms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": platform.platform(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "decisions": decisions, "runs": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
