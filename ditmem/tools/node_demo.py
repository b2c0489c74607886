"""``ditmem demo --devices D``: the seed-mix replay on a node of D device workers.

One trace (seed-mix with GPU shapes divided by ``--divisor``, Poisson arrivals at load ρ
per device, computed with the profile measured at start) is replayed in real time twice,
one policy after the other, on the same node engine: ``fifo`` on D static single-device
replicas, then ``slo`` with elastic sequence-parallel degree and migration. Both run the
scheduler's own node loop (``run_node``) over :class:`~ditmem.parallel.devices.
EngineDevices`, fed through the live intake ``ditmem serve --devices`` uses (a thread
pushes each request at its arrival time): every step runs on the workers. Beside the
measured numbers: what the node simulator predicts for the same trace (timing noise on),
the trace's offline attainment bound, and a P95 floor (95th percentile of each
request's time alone at the highest degree). The targets of the two-device main job are
checked and printed. The JSON keeps, per run and for its prediction, one row per request
(``per_request`` / ``sim_per_request``) and the decisions counted as the loop made them
(``decisions`` / ``sim_decisions``: take-backs, split decodes, migrations), so that a gap
between a run and its prediction can be traced to requests (``missed_apart``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time


def _profile(args, node, log) -> dict:
    """The single-device profile (measured here now, or the ``--profile`` JSON) with the
    node's ``parallel`` and ``links`` sections measured on the workers (kept as they are
    when the given JSON has them: a saved demo profile replays the same run)."""
    from ditmem import models
    from ditmem.parallel.node_profile import measure_node_sections, measure_on_workers
    from ditmem.scheduler.workloads import MIXES
    from ditmem.tools.profile import measure_profile

    sides = sorted({max(16, s.width // args.divisor // 16 * 16)
                    for s in MIXES[args.workload].shapes})
    encodes = getattr(args, "profile_encodes", "back-to-back")
    if args.profile == "measure":
        import torch

        torch.set_num_threads(1)  # as a worker computes
        gen = models.load(args.model, dtype=args.dtype)
        log(f"measuring the device profile for sides {sides} (one thread, as a worker) ...")
        # batches 1 and 2, 3 repeats: what the node's packed steps need, in ~2 minutes here
        profile = measure_profile(gen, args.model, sides, [1, 2], 3, pool_mb=args.pool_mb,
                                  page_kb=args.page_kb, tool="ditmem demo --devices",
                                  log=lambda *_: None, decode_tile=args.decode_tile,
                                  encode_order=encodes)
        del gen
    else:
        with open(args.profile) as f:  # a profile JSON (checked in main)
            profile = json.load(f)
        if "parallel" in profile and "links" in profile:
            log(f"profile: {args.profile} (its parallel table and links; nothing measured"
                + ("" if "move_latency_s" in profile["links"] else
                   "; its links have no move_latency_s: moves priced by their bytes only")
                + ("" if "job_latency_s" in profile["links"] else
                   "; its links have no job_latency_s: measuring it")
                + ")")
            if "job_latency_s" not in profile["links"]:
                from ditmem.parallel.job_latency import add_job_latency

                add_job_latency(node, profile["links"], log)
            return profile
    key = next(iter(profile["models"]))
    rows = measure_node_sections(node, profile, key, sides, log, tool="ditmem demo --devices",
                                 rounds=CALIBRATION_ROUNDS,
                                 clock=getattr(args, "parallel_clock", "wall"))
    if args.profile == "measure":
        from ditmem.scheduler.models import tokens_for

        log("measuring steps, encodes and decodes again on the workers, as the replays "
            "run them ...")
        changed = measure_on_workers(node, profile, key, sides, log,
                                     tokens_for=lambda s: tokens_for(key, s, s, 1),
                                     tile=args.decode_tile, encode_order=encodes)
        for line in describe_remeasure(changed):
            log(line)
    check_against_profile(rows, profile, key, log)
    with open(args.profile_out, "w") as f:
        json.dump(profile, f, indent=2)
    log(f"profile: {args.profile_out} (speed-up at degree 2: "
        f"{profile['parallel'][key]['speedup'].get('2')})")
    return profile


def describe_remeasure(changed: dict) -> list[str]:
    """Lines: each number the engine process measured beside the workers' (and ratio)."""
    b, a = changed["before"], changed["after"]
    lines = ["  the engine process's measurement vs the workers' (ms):"]
    for point, s in sorted(a["steps"].items()):
        old = b["steps"].get(point)
        if old:
            lines.append(f"    step {point[0]} tokens batch {point[1]}: {1e3 * old:.1f} -> "
                         f"{1e3 * s:.1f} (x{s / old:.2f})")
    for k in ("encode_s", "decode_tile_s"):
        if a[k] and b[k]:
            lines.append(f"    {k[:-2].replace('_', ' ')}: {1e3 * b[k]:.1f} -> {1e3 * a[k]:.1f} "
                         f"(x{a[k] / b[k]:.2f})")
    return lines


#: rounds of the start-up speed-up measurement (more while they spread; see speedup.py)
CALIBRATION_ROUNDS = 5
#: a replay stage (or the workers' degree-1 step) off the profile by more than this
#: factor either way is called out: the simulator's prediction assumes the profile
TRACK_LIMIT = 1.25


def check_against_profile(rows: list[dict], profile: dict, key: str, log) -> list[str]:
    """The workers' degree-1 step (wall, from the speed-up rows) against the profile's
    single-device step for the same tokens (measured before, in the engine process):
    one line per size, logged; the lines off by more than ``TRACK_LIMIT`` are returned."""
    from ditmem.scheduler import CostModel

    cost = CostModel.from_dict(profile)  # single-device: no parallel section needed yet
    off = []
    for r in rows:
        if r["degree"] != 1:
            continue
        predicted = 1000 * cost.step_time(key, [r["tokens"]])
        ratio = r["step_ms"] / predicted
        line = (f"  degree-1 step on the workers at {r['tokens']} tokens: {r['step_ms']:.1f} "
                f"ms vs the profile's {predicted:.1f} ms (x{ratio:.2f})")
        if not 1 / TRACK_LIMIT <= ratio <= TRACK_LIMIT:
            line += " -- the machine changed between the two measurements"
            off.append(line)
        log(line)
    return off


class TrackedDevices:
    """``NodeDevices`` that pass through to ``devices`` (an ``EngineDevices``) and keep, for
    every completed job, each stage's measured seconds beside what the profile's cost
    model (``truth``, a ``NodeCost``: what the simulator replays) predicts for it.

    A job is recorded once, at its last event: the partial events before it (devices and
    decodes handed back as their work ends) carry the same ``Timings`` while the job is
    still filling them in (its ``decode_s`` is written after the last decode)."""

    def __init__(self, devices, truth) -> None:
        from ditmem.tools.profile_check import ProfileCheck

        self.devices = devices
        self.truth = truth
        self.check = ProfileCheck()
        #: one row per stage of every completed job, in completion order: ``JOB_COLUMNS``
        self.jobs: list[list] = []

    def launch(self, job, now: float) -> None:
        self.devices.launch(job, now)

    def reclaim(self, job, device: int, now: float) -> None:
        """``NodeDevices.reclaim`` (a split decode's spare taken back: ``slo``'s default)."""
        self.devices.reclaim(job, device, now)

    def wait(self, until):
        done = self.devices.wait(until)
        for c in done:
            if c.last:
                self.record(c)
        return done

    def record(self, c) -> None:
        """Add a job's last ``Completion`` ``c``: each stage's measured seconds (its
        ``Timings``), the profile's for the job, and the job's launch and end."""
        from ditmem.scheduler.node.device import spread
        from ditmem.scheduler.noise import step_class

        job, t = c.job, c.timings
        truth, cost, degree = self.truth, self.truth.cost, job.group.degree

        def add(stage: str, measured: float, predicted: float, cls: str, count: int) -> None:
            self.check.add(stage, measured, predicted)
            self.jobs.append([stage, cls, count, measured, predicted, c.started, c.finished])

        if job.moves:
            add("moves", t.transfer_s, sum(
                truth.offload_time(m.request, m.src) if m.dst is None
                else truth.move_time(m.request, m.src, m.dst)[0] for m in job.moves),
                ",".join(sorted({m.kind for m in job.moves})), len(job.moves))
        if job.encodes:
            add("encodes", t.encode_s, spread([cost.encode_time(r) for r in job.encodes], degree),
                step_class(job.encodes), len(job.encodes))
        if job.batch and job.steps:
            tokens = [cost.tokens(r) for r in job.batch]
            add(f"steps d{degree}", t.step_s,
                job.steps * truth.step_time(job.batch[0].model, tokens, degree),
                step_class(job.batch), job.steps)
        if job.decodes:
            add("decodes", t.decode_s, spread([cost.decode_time(r) for r in job.decodes], degree),
                step_class(job.decodes), len(job.decodes))

    def summary(self) -> dict[str, dict]:
        """Per stage: ``{"measured_s", "predicted_s", "ratio", "jobs"}`` (sums over jobs)."""
        return self.check.summary()

    def job_timings(self) -> dict:
        """Every job's stages as measured: ``{"columns": JOB_COLUMNS, "rows": [...]}`` (seconds;
        ``class``: the stage's shape class, its largest member's, or the moves' kinds;
        ``count``: steps, requests or moves the stage held; ``job_started_s`` /
        ``job_finished_s``: the whole job's launch and last event on the loop's clock)."""
        return {"columns": list(JOB_COLUMNS), "rows": self.jobs}


#: the columns of ``TrackedDevices.job_timings``' rows
JOB_COLUMNS = ("stage", "class", "count", "measured_s", "predicted_s", "job_started_s",
               "job_finished_s")


class CountingDevices:
    """``NodeDevices`` that pass through to ``devices`` (real or virtual) and count the
    loop's decisions as they reach them, where the loop makes them (nothing added to a
    device's work): ``take_backs``, spares of split decodes the policy took back
    (``NodePolicy.take_back`` granted: one ``reclaim`` each, whether or not the spare had
    tiles left to hand over) and ``split_decodes``, decodes launched over two or more
    devices with two or more tiles as ``truth`` (a ``NodeCost``: the profile) cuts them
    (one tile runs whole on its lane: not counted)."""

    def __init__(self, devices, truth) -> None:
        self.devices = devices
        self.truth = truth
        self.take_backs = 0
        self.split_decodes = 0

    def launch(self, job, now: float) -> None:
        from ditmem.scheduler.node.device import decode_devices

        if job.split_decodes and 0 < len(job.decodes) < job.group.degree:
            sets = decode_devices(job.group, len(job.decodes), True)
            self.split_decodes += sum(
                len(ds) > 1 and len(self.truth.decode_tile_parts(r, len(ds))[0]) > 1
                for r, ds in zip(job.decodes, sets, strict=True))
        self.devices.launch(job, now)

    def reclaim(self, job, device: int, now: float) -> None:
        self.take_backs += 1
        self.devices.reclaim(job, device, now)

    def wait(self, until):
        return self.devices.wait(until)

    @property
    def link_busy_s(self) -> float:
        return getattr(self.devices, "link_busy_s", 0.0)


def run_rows(records, counting: CountingDevices) -> dict:
    """What a run (real or simulated) adds to its summary to be diagnosed after the fact:
    ``per_request`` rows (``ditmem.tools.report.request_rows``, arrival order) and
    ``decisions``: ``take_backs``, ``split_decodes`` (``counting``'s) and ``migrations``
    (moves of a paused request to another group, summed over ``records``)."""
    from ditmem.tools.report import request_rows

    return {"per_request": request_rows(records),
            "decisions": {"take_backs": counting.take_backs,
                          "split_decodes": counting.split_decodes,
                          "migrations": sum(r.migrations for r in records)}}


def missed_apart(real: list[dict], sim: list[dict]) -> dict[str, list[str]]:
    """Request ids (arrival order) the run missed that the simulator's prediction met
    (``"run_only"``), and the other way round (``"sim_only"``), from two ``per_request``
    row lists of the same trace."""
    met = {q["id"]: q["met"] for q in sim}
    return {"run_only": [q["id"] for q in real if not q["met"] and met.get(q["id"])],
            "sim_only": [q["id"] for q in real if q["met"] and met.get(q["id"]) is False]}


def build_trace(args, cost, devices: int, exact_load: bool = True):
    """The requests: the workload at ρ × D, shapes divided by ``--divisor``; with
    ``exact_load`` the trace's own load is ρ per device (``demo.build_trace``)."""
    from ditmem.tools.demo import build_trace as demo_trace

    return demo_trace(args, cost, exact_load, devices)


def rebuild_trace(meta: dict, cost):
    """A saved run's trace (``meta``: its JSON's first row: workload, load, requests, seed,
    divisor, devices; ``cost``: the ``CostModel`` of the profile it measured at start), its
    deadlines assigned as the run did (3 × standalone)."""
    import types

    args = types.SimpleNamespace(workload=meta["workload"], load=meta["load"],
                                 requests=meta["requests"], seed=meta["seed"],
                                 arrival="poisson", divisor=meta["divisor"])
    trace = build_trace(args, cost, meta["devices"], meta.get("exact_load", False))
    for r in trace:
        cost.assign_deadline(r, 3.0)
    return trace


class _Progress:
    """One progress line for the whole run (rewritten in place)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.label = ""
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            total = total or self.total  # a live intake does not know its total
            sys.stdout.write(f"\r{self.label}: {done}/{total} requests done   ")
            sys.stdout.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stdout.write("\n")


def logged(policy, trace, log: bool):
    """``policy`` in a ``DecisionLog`` (large: the trace's largest tier) when ``log``."""
    if not log:
        return policy
    from ditmem.scheduler.node.policies.recorder import DecisionLog

    top = max(r.width * r.height for r in trace)
    return DecisionLog(policy, lambda r: r.width * r.height >= top)


def run_policy(node, name: str, trace, cost, topo_devices: int, progress,
               decode_tile=None, log: bool = False) -> dict:
    """Replay ``trace`` under ``name`` on the node's real devices; with ``log``, the
    row's ``decision_log`` holds its ``DecisionLog.rows()``."""
    from ditmem.parallel.devices import EngineDevices
    from ditmem.parallel.intake import LiveIntake, feed_trace
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.simulator import Record
    from ditmem.tools.replay import to_generation

    truth = NodeCost(cost)
    topo = Node(topo_devices, truth.links)
    policy = logged(make_node_policy(name, NodeCost(cost), topo), trace, log)
    def let_go(rid: str, exc: BaseException) -> None:
        """A failed request leaves the loop (as ``serve`` does): it holds no device time and
        no pages; it is counted as a miss below."""
        intake.cancel(rid)

    devices = EngineDevices(node, to_generation, decode_tile=decode_tile, on_failed=let_go)
    counting = CountingDevices(devices, truth)
    tracked = TrackedDevices(counting, truth)
    progress.label, progress.total = name, len(trace)
    requests = [dataclasses.replace(r) for r in trace]
    for r in requests:  # as a server does at submission
        if r.deadline is None or r.standalone_s is None:
            cost.assign_deadline(r, 3.0)
    intake = LiveIntake(requests[0].model, devices.now, devices.notify)
    t0, cpu0 = time.perf_counter(), time.process_time()
    feeder = feed_trace(intake, requests)
    result = run_node(intake, policy, tracked, topo, truth, progress=progress)
    feeder.join()
    wall = time.perf_counter() - t0
    engine_cpu = time.process_time() - cpu0
    progress.end()
    for r in trace:  # nothing of this run stays on the node for the next policy
        node.release(r.id)
    for rec in result.records:  # a request whose job failed is a miss
        if rec.request.id in devices.failed:
            rec.finished = math.inf
    kept = {rec.request.id for rec in result.records}
    result.records.extend(Record(r, r.arrival, math.inf, 0, 0) for r in requests
                          if r.id in devices.failed and r.id not in kept)
    result.records.sort(key=lambda rec: (rec.request.arrival, rec.request.id))
    out = summarize(result.records)
    steps: dict[str, int] = {}
    for rec in result.records:
        for d, k in rec.degrees.items():
            steps[str(d)] = steps.get(str(d), 0) + k
    from ditmem.parallel.move_latency import breakdown

    out.update(policy=name, wall_s=wall, engine_cpu_s=engine_cpu, errors=devices.errors,
               steps_by_degree=steps,
               migrations=sum(r.migrations for r in result.records),
               parks=sum(r.offloads for r in result.records), vs_profile=tracked.summary(),
               job_timings=tracked.job_timings(),
               moves_breakdown=breakdown(devices.moves), **run_rows(result.records, counting))
    if log:
        out["decision_log"] = policy.rows()
    return out


def predict(name: str, trace, cost, devices: int, seed: int, log: bool = False) -> dict:
    """The node simulator on the same trace, timing noise on (3 %, seeded):
    ``summarize`` of its records and :func:`run_rows` (``per_request``, ``decisions``).
    ``simulate_node``'s run, its devices counted (:class:`CountingDevices`)."""
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.device import VirtualDevices
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.noise import TimingNoise

    topo = Node(devices, NodeCost(cost).links)
    policy = logged(make_node_policy(name, NodeCost(cost), topo), trace, log)
    truth = NodeCost(policy.ncost.cost, policy.ncost.parallel)  # as simulate_node's
    counting = CountingDevices(VirtualDevices(truth, TimingNoise(0.03, 0.0, seed), devices),
                               truth)
    result = run_node([dataclasses.replace(r) for r in trace], policy, counting, topo, truth)
    out = {**summarize(result.records), **run_rows(result.records, counting)}
    if log:
        out["decision_log"] = policy.rows()
    return out


def limits(trace, cost, devices: int) -> dict:
    """The trace's limits: the offline attainment bound on the node, the clairvoyant
    reference (EDF with give-up on the D-times-faster machine), the P95 floor as the
    issue defines the bar (95th percentile of each request's time alone at the highest
    degree, its decode split over the group's devices as `slo` runs a lone request's) and
    the proven least P95 / P99 of any schedule (``latency_bound``: the node's capacity and
    the least step of any batch; ``p95_bound_s`` > 1.2 x the floor would forbid that
    bar)."""
    from ditmem.scheduler.node.bound import (
        clairvoyant_node_misses,
        latency_bound,
        min_node_misses,
    )
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.topology import Node

    ncost = NodeCost(cost)
    topo = Node(devices, ncost.links)
    reqs = [dataclasses.replace(r) for r in trace]
    bound = 1 - min_node_misses(reqs, ncost, devices, topo.degrees) / len(reqs)
    clairvoyant = 1 - clairvoyant_node_misses(reqs, ncost, devices) / len(reqs)
    proven = {f"p{q}_bound_s": latency_bound([reqs], ncost, devices, topo.degrees, q)
              for q in (95, 99)}
    return {"bound_attainment": bound, "clairvoyant_attainment": clairvoyant,
            "p95_floor_s": p95_floor(reqs, ncost, max(topo.degrees)), **proven}


def p95_floor(trace, ncost, top: int) -> float:
    """The P95 floor of the issue's bar: the 95th percentile (nearest rank) of each
    request's time alone at degree ``top``, its decode split over the group's devices as
    `slo` runs a lone request's (s)."""
    from ditmem.scheduler.node.bound import least_decode

    alone = sorted(ncost.standalone(r, top) - ncost.decode_time(r)
                   + least_decode(r, ncost, top)[0] for r in trace)
    return alone[min(len(alone) - 1, math.ceil(0.95 * len(alone)) - 1)]


def node_degrees(cost, devices: int) -> tuple[int, ...]:
    """The degrees a node of ``devices`` devices runs (``Node.degrees``)."""
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.topology import Node

    return tuple(Node(devices, NodeCost(cost).links).degrees)


def bars(rows: dict, lim: dict) -> tuple[float, float]:
    """The main job's attainment bar (fraction) and P95 bar (s)."""
    return (min(0.99, lim["bound_attainment"] - 0.005),
            max(0.5 * rows["fifo"]["p95_s"], 1.2 * lim["p95_floor_s"]))


def targets(rows: dict, lim: dict) -> list[tuple[str, bool, str]]:
    """The main job's targets, checked on the measured rows."""
    slo, fifo = rows["slo"], rows["fifo"]
    att_bar, p95_bar = bars(rows, lim)
    return [
        ("slo attainment >= 99 % (or bound - 0.5 pt)", slo["slo_attainment"] >= att_bar,
         f"{100 * slo['slo_attainment']:.1f} % vs bar {100 * att_bar:.1f} %"),
        ("slo P95 <= 0.5 x fifo's (or 1.2 x floor)", slo["p95_s"] <= p95_bar,
         f"{slo['p95_s']:.2f} s vs bar {p95_bar:.2f} s"),
        ("slo P99 <= fifo's", slo["p99_s"] <= fifo["p99_s"],
         f"{slo['p99_s']:.2f} s vs {fifo['p99_s']:.2f} s"),
    ]


def p95_verdict(trace, cost, devices: int, rows: dict, lim: dict) -> dict | None:
    """``tail_verdict.p95_node_verdict`` at the run's own bars (None, said on stderr,
    without scipy)."""
    from ditmem.tools.tail_verdict import p95_node_verdict

    att_bar, p95_bar = bars(rows, lim)
    try:
        return p95_node_verdict(trace, cost, devices, p95_bar, att_bar)
    except ImportError as e:
        print(f"P95 target not checked: {e}", file=sys.stderr)
        return None


def main(args) -> int:
    import os

    from ditmem.parallel.node import NodeEngine
    from ditmem.parallel.speedup import CalibrationError
    from ditmem.scheduler import CostModel
    from ditmem.tools.profile_check import report, work_ratio
    from ditmem.tools.run_speed import describe, node_references, speed_factors
    from ditmem.tools.tail_verdict import describe_node_verdict

    if args.devices > (os.cpu_count() or 1):
        print(f"ditmem demo: --devices {args.devices} exceeds the {os.cpu_count()} cores",
              file=sys.stderr)
        return 2
    if "wan" in args.model.lower():
        print("ditmem demo: --devices > 1 replays an image workload (seed-mix): Qwen-Image "
              "models only", file=sys.stderr)
        return 2
    if args.profile != "measure" and not os.path.isfile(args.profile):
        print(f"ditmem demo --devices: --profile {args.profile}: expected 'measure' or a "
              "profile JSON file", file=sys.stderr)
        return 2
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if sorted(names) != ["fifo", "slo"]:
        print("ditmem demo --devices: --policies must be fifo,slo", file=sys.stderr)
        return 2
    log = print
    started = time.perf_counter()
    page = args.page_kb * 1024
    pages = max(64, int(args.pool_mb * 2**20) // page)
    with NodeEngine(args.model, args.devices, pool_pages=pages, page_bytes=page,
                    host_pages=4 * pages, model_kwargs={"dtype": args.dtype}) as node:
        try:
            profile = _profile(args, node, log)
        except CalibrationError as exc:
            print(f"ditmem demo --devices: {exc}.\nNot replaying with a table that cannot be "
                  "trusted: rerun on a quieter machine, or pass --profile with a saved demo "
                  "profile (benchmarks/parallel/results/*_profile.json)", file=sys.stderr)
            return 1
        cost = CostModel.from_dict(profile)
        trace = build_trace(args, cost, args.devices)
        lim = limits(trace, cost, args.devices)
        log(f"trace: {len(trace)} requests, rho {args.load} per device on {args.devices} "
            f"devices, spans {trace[-1].arrival:.0f} s")
        progress = _Progress(not args.no_progress)
        rows, logs = {}, {}
        load_avg = {"start": os.getloadavg()[0]}
        for name in ("fifo", "slo"):
            rows[name] = run_policy(node, name, trace, cost, args.devices, progress,
                                    args.decode_tile, log=bool(args.decisions))
            sim = predict(name, trace, cost, args.devices, args.seed, log=bool(args.decisions))
            if args.decisions:
                logs[name] = {"run": rows[name].pop("decision_log"),
                              "sim": sim["decision_log"]}
            rows[name].update(sim_slo_attainment=sim["slo_attainment"], sim_p95_s=sim["p95_s"],
                              sim_p99_s=sim["p99_s"], sim_per_request=sim["per_request"],
                              sim_decisions=sim["decisions"],
                              missed_apart=missed_apart(rows[name]["per_request"],
                                                        sim["per_request"]))
            load_avg[f"after {name}"] = os.getloadavg()[0]
    for name, r in rows.items():
        r["work_load"] = args.load * work_ratio(r["vs_profile"])
        r["at_run_speed"] = node_references(
            trace, cost.profile, speed_factors(r["vs_profile"], node_degrees(cost, args.devices)),
            name, args.devices, args.seed)
    total = time.perf_counter() - started
    print(f"\n{'policy':<6} {'att %':>6} {'P50 s':>7} {'P95 s':>7} {'P99 s':>7} "
          f"{'sim att %':>9} {'sim P95':>8} {'steps d1/d2':>11} {'moves':>6} {'wall s':>7}")
    for name, r in rows.items():
        steps = r["steps_by_degree"]
        print(f"{name:<6} {100 * r['slo_attainment']:6.1f} {r['p50_s']:7.2f} {r['p95_s']:7.2f} "
              f"{r['p99_s']:7.2f} {100 * r['sim_slo_attainment']:9.1f} {r['sim_p95_s']:8.2f} "
              f"{steps.get('1', 0):>5}/{steps.get('2', 0):<5} {r['migrations']:6d} "
              f"{r['wall_s']:7.0f}")
    print("decisions, run (simulator's prediction): take-backs, split decodes, migrations; "
          "requests the run missed that the simulator met (and the other way round):")
    for name, r in rows.items():
        d, sd, apart = r["decisions"], r["sim_decisions"], r["missed_apart"]
        print(f"  {name:<6} take-backs {d['take_backs']} ({sd['take_backs']}), split decodes "
              f"{d['split_decodes']} ({sd['split_decodes']}), migrations {d['migrations']} "
              f"({sd['migrations']}); missed in the run only: "
              f"{' '.join([str(len(apart['run_only'])), *apart['run_only'][:8]])}"
              f"{' ...' if len(apart['run_only']) > 8 else ''}; in the simulator only: "
              f"{len(apart['sim_only'])}")
    print("the run vs its start-up profile (in-run seconds / the profile's, summed per kind; "
          "the load the run's work implies beside the requested one; the simulator's columns "
          "and the limits below assume x1.00):")
    for name, r in rows.items():
        print("\n".join(report(name, r["vs_profile"], args.load)))
    print("where the moves' time went (median ms per move command: wall = wait for busy "
          "devices + copy + control path; sums in s):")
    for name, r in rows.items():
        for kind, b in r["moves_breakdown"].items():
            ms = {k: 1e3 * b[f"{k}_median_s"] for k in ("wall", "wait", "copy", "control")}
            print(f"  {name:<6} {kind:<12} {b['moves']:4d} moves: wall {ms['wall']:7.1f} = "
                  f"wait {ms['wait']:7.1f} + copy {ms['copy']:6.1f} + control "
                  f"{ms['control']:5.1f}  (sums: wall {b['wall_sum_s']:.2f}, wait "
                  f"{b['wait_sum_s']:.2f}, copy {b['copy_sum_s']:.2f} s)")
    print("machine load average (1 min; other jobs share the cores): "
          + ", ".join(f"{k} {v:.1f}" for k, v in load_avg.items()))
    print("the engine process's own CPU during each replay (policy, control path, intake; "
          "it shares the cores the workers are pinned to): "
          + ", ".join(f"{name} {r['engine_cpu_s']:.1f} s = "
                      f"{100 * r['engine_cpu_s'] / r['wall_s']:.0f} % of a core"
                      for name, r in rows.items()))
    print(f"trace limits: offline bound {100 * lim['bound_attainment']:.1f} % attainment; "
          f"P95 floor {lim['p95_floor_s']:.2f} s (alone at degree {args.devices}); no "
          f"schedule's P95 / P99 below {lim['p95_bound_s']:.2f} / {lim['p99_bound_s']:.2f} s "
          "(proven: the node's capacity, the least step of any batch)")
    print(f"  clairvoyant reference (EDF with give-up, D x faster machine): "
          f"{100 * lim['clairvoyant_attainment']:.1f} %  (all on the start-up profile's times)")
    for what, ok, detail in targets(rows, lim):
        print(f"  [{'met' if ok else 'MISSED'}] {what}: {detail}")
    verdict = p95_verdict(trace, cost, args.devices, rows, lim)
    if verdict is not None:
        print(describe_node_verdict(verdict))
    print("the references at the speed each run measured (same arrivals and deadlines; the "
          "workers' times x the run's own per kind; JSON: at_run_speed):")
    for name, r in rows.items():
        print("\n".join(describe(name, dict(lim, **r), r["at_run_speed"], r)))
        run = r["at_run_speed"]
        print(f"  {name:<6} {'P95 floor':<16} start-up profile {lim['p95_floor_s']:5.2f} s   "
              f"at run speed {run['p95_floor_s']:5.2f} s")
    at_slo = dict(lim, **{k: rows["slo"]["at_run_speed"][k]
                          for k in ("bound_attainment", "p95_floor_s")})
    print("  the targets against the limits at slo's run speed (beside the start-up ones "
          "above, not instead):")
    for what, ok, detail in targets(rows, at_slo):
        print(f"  [{'met' if ok else 'MISSED'}] {what}: {detail}")
    for name, r in rows.items():
        for e in r["errors"]:
            print(f"  {name} error: {e}")
    print(f"total {total:.0f} s")
    if args.json:
        meta = {"command": "demo --devices", "devices": args.devices, "model": args.model,
                "workload": args.workload, "load": args.load, "requests": len(trace),
                "seed": args.seed, "divisor": args.divisor, "exact_load": True,
                "total_wall_s": total,
                "load_average": load_avg, "p95_criterion": verdict, **lim}
        with open(args.json, "w") as f:
            json.dump([dict(meta, **r) for r in rows.values()], f, indent=2)
        print(f"json: {args.json}")
    if args.decisions:
        with open(args.decisions, "w") as f:
            json.dump(logs, f)
        print(f"decisions: {args.decisions}")
    return 0
