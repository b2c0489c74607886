"""Scheduler overhead: one decision with 64 started and 10,000 waiting requests.

Compares fifo, srtf and slo (ours) side by side with a naive baseline that sorts the whole
waiting queue by deadline each decision (what a policy without the indexed queue would do).
Between timed decisions one request arrives and the clock moves on, as in a real engine.
Reports the median of several repeats (the machine is shared and noisy).

    python benchmarks/scheduler/overhead.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from ditmem.scheduler import (
    CostModel,
    Location,
    MemoryState,
    Policy,
    Request,
    RequestStatus,
    SchedulerView,
    StepPlan,
    WaitingQueue,
    make_policy,
)
from ditmem.scheduler.workloads import workload


class NaiveEdf(Policy):
    """Baseline: earliest deadline first by sorting every waiting request each decision."""

    name = "naive-edf"

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        everyone = [s.request for s in view.active] + list(view.waiting.iter_by("arrival"))
        head = min(everyone, key=lambda r: r.deadline)
        ordered = sorted(everyone, key=lambda r: r.deadline)  # the full scan it pays for
        del ordered
        return StepPlan(batch=[head.id])


def build(active_n: int, waiting_n: int, cost: CostModel, seed: int = 0):
    reqs = workload("seed-mix", cost, requests=active_n + waiting_n + 2000, seed=seed, load=3.0)
    rng = random.Random(seed)
    active = []
    for r in reqs[:active_n]:
        done = rng.randrange(r.steps)
        active.append(RequestStatus(r, done, Location.DEVICE, cost.pages_for(r), r.arrival))
    queue = WaitingQueue()
    for r in reqs[active_n : active_n + waiting_n]:
        queue.push(r)
    spare = reqs[active_n + waiting_n :]
    now = reqs[active_n + waiting_n - 1].arrival
    memory = MemoryState(cost.device_pages("qwen-image"), 1000, 64 << 20, 4000)
    return active, queue, spare, now, memory


def time_policy(policy: Policy, active, queue, spare, now, memory, decisions: int) -> float:
    """Median seconds per decision over ``decisions`` decisions (after one warm-up)."""
    view = SchedulerView(active, queue, memory, ())
    policy.schedule(now, view)  # warm-up: first sight of the queue
    times = []
    for i in range(decisions):
        r = spare[i % len(spare)]
        arrival = Request(f"x{i}", now, r.model, r.width, r.height, r.frames, r.steps, r.priority)
        policy.cost.assign_deadline(arrival)
        queue.push(arrival)
        now += 0.05
        t0 = time.perf_counter()
        policy.schedule(now, view)
        times.append(time.perf_counter() - t0)
        queue.remove(arrival.id)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions and repeats")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--active", type=int, default=64)
    parser.add_argument("--waiting", type=int, default=10_000)
    args = parser.parse_args(argv)
    cost = CostModel.load("h200")
    decisions, repeats = (50, 3) if args.quick else (300, 5)
    setup = build(args.active, args.waiting, cost)
    names = ["naive-edf", "fifo", "srtf", "slo"]
    results: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(repeats):
        for name in names:  # interleaved, so noise hits every policy alike
            if name == "naive-edf":
                pol = NaiveEdf(cost)
            else:
                policy, _, opt = name.partition(":")
                key, _, value = opt.partition("=")
                pol = make_policy(policy, cost, **({key: value} if key else {}))
            results[name].append(time_policy(pol, *setup, decisions))
    base = statistics.median(results["naive-edf"])
    rows = []
    print(
        f"one decision, {args.active} started + {args.waiting} waiting requests "
        f"(median of {repeats} repeats x {decisions} decisions)"
    )
    print(f"{'policy':<14} {'us/decision':>12} {'vs naive-edf':>13}  < 1 ms")
    for name in names:
        med = statistics.median(results[name])
        rows.append(
            {
                "policy": name,
                "us_per_decision": med * 1e6,
                "vs_naive": med / base,
                "active": args.active,
                "waiting": args.waiting,
            }
        )
        print(f"{name:<14} {med * 1e6:12.1f} {med / base:12.3f}x  {'yes' if med < 1e-3 else 'NO'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
