"""The demos' references at the speed a run measured, beside the start-up ones.

A demo plans its trace (arrivals, deadlines) and prints its references — the offline bound,
the clairvoyant schedule's attainment, the simulator's prediction — on the profile it
measured at start. When the run's ops ran slower or faster than that profile
(:mod:`ditmem.tools.profile_check`), those references describe another run: the same
deadlines on a machine of another speed. This module rebuilds them on the trace as it ran:

* :func:`speed_factors` — per kind of work, in-run seconds / the profile's (``steps``, or
  ``steps d1`` / ``steps d2`` on a node, ``encodes``, ``decodes``, ``moves``); a kind the
  run did not measure gets the run's overall ratio (:func:`~ditmem.tools.profile_check.
  work_ratio`);
* :func:`scale_profile` — a copy of a parsed profile (``CostModel.profile``) whose times
  are those factors × the profile's (step table or FLOPs model, encode, decode rate and
  tile, host link; on a node also the parallel speed-up per degree and the links);
* :func:`job_spans` / :func:`job_gap` — per job of a node run (``job_timings`` with the
  jobs' timestamps), the loop's span beside the stages the workers measured, and the median
  gap: the fixed cost per job no stage holds, which :func:`node_replay` can give the truth
  (``links.job_latency_s``);
* :func:`one_device_references` / :func:`node_references` — the bound, the clairvoyant
  reference and the simulator's prediction on the same trace (same arrivals and
  deadlines, set by the start-up profile) with the device's true times from the scaled
  profile. The policy in the simulation still plans with the start-up profile, as it did in
  the run, and learns the rest through its online correction.

The start-up references are never replaced: a demo prints both, labelled.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics

from ditmem.tools.profile_check import work_ratio

#: the kinds a one-device run reports; a node reports ``steps d<k>`` instead of ``steps``
KINDS = ("steps", "encodes", "decodes", "moves")


def speed_factors(summary: dict[str, dict], degrees=(1,)) -> dict[str, float]:
    """Per kind, the run's seconds / the profile's (``summary``: ``ProfileCheck.summary()``);
    kinds the run did not measure (or measured as nothing) get the overall ratio. With
    ``degrees`` other than ``(1,)`` (a node) the step kinds are ``steps d<k>`` for each k."""
    overall = work_ratio(summary)
    kinds = list(KINDS[1:]) + (["steps"] if tuple(degrees) == (1,)
                               else [f"steps d{d}" for d in degrees])
    out = {}
    for kind in kinds:
        v = summary.get(kind)
        ok = v is not None and v["predicted_s"] > 0 and math.isfinite(v["ratio"]) \
            and v["ratio"] > 0
        out[kind] = v["ratio"] if ok else overall
    return out


def scale_profile(profile: dict, factors: dict[str, float]) -> dict:
    """A deep copy of ``profile`` (parsed: ``CostModel(...).profile``, plain numbers) at the
    speed ``factors`` say (:func:`speed_factors`; a factor f means the run took f x the
    profile's seconds): step times x ``steps`` (``steps d1`` on a node), encode x
    ``encodes``, decode rate and tile x ``decodes``, host-link bandwidth / ``moves``; with a
    ``parallel`` section, the degree-d speed-up x ``steps d1`` / ``steps d<d>`` (capped at
    d, the most a profile may hold) and the node links' bandwidths / ``moves``, their
    latency x ``moves``. A kind missing from ``factors`` stays as it is. ValueError naming
    a factor that is not a finite number > 0."""
    for kind, f in factors.items():
        if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
            raise ValueError(f"factors[{kind!r}]: a finite number > 0, got {f!r}")
    out = copy.deepcopy(profile)
    step_f = factors.get("steps", factors.get("steps d1", 1.0))
    enc_f, dec_f, move_f = (factors.get(k, 1.0) for k in ("encodes", "decodes", "moves"))
    out["name"] = f"{profile.get('name', 'profile')} at run speed"
    for section in out["models"].values():
        step = section["step"]
        if step["kind"] == "table":
            step["points"] = [dict(p, seconds=p["seconds"] * step_f) for p in step["points"]]
        else:  # flops: every term of the step time scales with the floor and 1 / rate
            step["step_floor_s"] *= step_f
            step["effective_tflops"] /= step_f
        section["encode_s"] *= enc_f
        section["decode_s_per_megapixel"] *= dec_f
        if "decode_tile_s" in section:
            section["decode_tile_s"] *= dec_f
    out["host_link_bytes_per_s"] /= move_f
    for table in out.get("parallel", {}).values():
        for key, row in table["speedup"].items():
            d = int(key)
            if d > 1:
                r = step_f / factors.get(f"steps d{d}", step_f)
                table["speedup"][key] = [min(float(d), s * r) for s in row]
    links = out.get("links")
    if links is not None:
        for key in ("device_bytes_per_s", "host_bytes_per_s"):
            links[key] = links[key] / move_f
        if "move_latency_s" in links:
            links["move_latency_s"] = links["move_latency_s"] * move_f
    return out


def job_spans(run: dict) -> list[tuple[str, float, float]]:
    """Per job of one policy's node run row (its ``job_timings``, rows with the job's launch
    and last event, ``job_started_s`` / ``job_finished_s``): (kind, the loop's span, the
    sum of its stages as the workers measured them), seconds. ``kind``: its step stage and
    class (``"steps d1 256x256"``), ``" +dec"`` added for a last step with its decode; a
    job without steps: its stages joined by "+". ValueError when the rows have no
    timestamps."""
    rows = run["job_timings"]["rows"]
    if any(len(r) < 7 for r in rows):
        raise ValueError(f"policy {run.get('policy')!r}: its job_timings have no job "
                         "timestamps (a run before ddcd44d)")
    jobs: dict[tuple[float, float], list[list]] = {}
    for row in rows:
        jobs.setdefault((row[5], row[6]), []).append(row)
    out = []
    for (started, finished), stages in jobs.items():
        steps = [x for x in stages if x[0].startswith("steps")]
        kind = (f"{steps[0][0]} {steps[0][1]}" if steps
                else "+".join(sorted({x[0] for x in stages})))
        if steps and any(x[0] == "decodes" for x in stages):
            kind += " +dec"
        out.append((kind, finished - started, sum(x[3] for x in stages)))
    return out


#: the statistics :func:`job_gap` takes over a run's jobs
GAP_STATISTICS = ("median", "mean")


def job_gap(run: dict, statistic: str = "median") -> float:
    """The median (or mean: ``statistic``) over one policy's node run row's jobs
    (:func:`job_spans`) of the loop's span − the stages: what each job cost besides its
    stages in the run, seconds (0 for a run without jobs). The gaps' tail is long (session
    13's slo run: median 0.67 ms, mean 1.26 ms): the mean is what the run paid in all."""
    if statistic not in GAP_STATISTICS:
        raise ValueError(f"statistic: one of {', '.join(GAP_STATISTICS)}, got {statistic!r}")
    gaps = [span - stages for _, span, stages in job_spans(run)]
    if not gaps:
        return 0.0
    return statistics.median(gaps) if statistic == "median" else statistics.fmean(gaps)


def as_run(trace, run_cost) -> list:
    """Copies of ``trace`` with the arrivals and deadlines it ran with and ``standalone_s``
    from ``run_cost`` (what a request took alone at the run's speed)."""
    return [dataclasses.replace(r, standalone_s=run_cost.standalone_time(r)) for r in trace]


def one_device_references(trace, profile: dict, factors: dict[str, float], policy: str,
                          page_bytes: int, pool_pages: int, decode: str) -> dict:
    """The one-device demo's references at the run's speed, for policy ``policy`` (``profile``:
    the parsed start-up profile; ``factors``: :func:`speed_factors` of its run): the
    offline bound and the clairvoyant schedule on ``trace`` with the scaled profile's times,
    and ``ditmem sim``'s prediction with the device's truth drawn (3 % noise, seed 0) around
    the scaled profile while ``policy`` plans with ``profile`` (as the demo's own
    prediction, ``ditmem.tools.demo.predict``, does on the start-up profile). Keys:
    ``factors``, ``bound_attainment``, ``clairvoyant_attainment``, ``sim_slo_attainment``,
    ``sim_p50_s``, ``sim_p95_s``, ``sim_p99_s``."""
    from ditmem.engine.factory import make_policy_and_cost
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.bound import clairvoyant_misses, min_misses_packed
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.noise import TimingNoise
    from ditmem.scheduler.simulator import simulate

    run_cost = CostModel(scale_profile(profile, factors))
    n = len(trace)
    out = {"factors": dict(factors),
           "bound_attainment": 1 - min_misses_packed(as_run(trace, run_cost), run_cost) / n,
           "clairvoyant_attainment": 1 - clairvoyant_misses(as_run(trace, run_cost),
                                                            run_cost) / n}
    planner, _ = make_policy_and_cost(policy, CostModel(profile))
    sim = simulate([dataclasses.replace(r) for r in trace], planner, run_cost,
                   page_bytes=page_bytes, device_pages=pool_pages, decode=decode,
                   noise=TimingNoise(seed=0))
    s = summarize(sim.records)
    out.update({f"sim_{k}": s[k] for k in ("slo_attainment", "p50_s", "p95_s", "p99_s")})
    return out


def node_references(trace, profile: dict, factors: dict[str, float], policy: str,
                    devices: int, seed: int) -> dict:
    """The node demo's references at the run's speed, for ``policy`` (``profile``: the parsed
    start-up profile with its node sections; ``factors``: :func:`speed_factors` over the
    node's degrees): the offline bound, the
    clairvoyant reference (EDF with give-up on the D-times-faster machine), the P95 floor
    (95th percentile of each request's time alone at the highest degree) on ``trace`` with
    the scaled profile's times, and the node simulator's prediction with the truth drawn
    (3 % noise, ``seed``) around the scaled profile while ``policy`` plans with ``profile``.
    Keys: ``factors``, ``bound_attainment``, ``clairvoyant_attainment``, ``p95_floor_s``,
    ``sim_slo_attainment``, ``sim_p95_s``, ``sim_p99_s``."""
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.node.bound import clairvoyant_node_misses, min_node_misses
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.topology import Node

    run = NodeCost(CostModel(scale_profile(profile, factors)))
    topo = Node(devices, run.links)
    reqs = as_run(trace, run.cost)
    n = len(reqs)
    alone = sorted(run.standalone(r, max(topo.degrees)) for r in reqs)
    out = {"factors": dict(factors),
           "bound_attainment": 1 - min_node_misses(reqs, run, devices, topo.degrees) / n,
           "clairvoyant_attainment": 1 - clairvoyant_node_misses(reqs, run, devices) / n,
           "p95_floor_s": alone[min(n - 1, math.ceil(0.95 * n) - 1)]}
    s = summarize(node_replay(trace, profile, run, policy, devices, seed)[0].records)
    out.update({f"sim_{k}": s[k] for k in ("slo_attainment", "p95_s", "p99_s")})
    return out


def node_replay(trace, profile: dict, run, policy: str, devices: int, seed: int,
                wrap=None, residuals=None, job_latency_s: float | None = None):
    """The node simulator's replay of ``trace`` with the truth drawn (3 % noise, ``seed``)
    around ``run`` (a ``NodeCost`` of the run's speed) while ``policy`` plans with the
    parsed start-up ``profile``; ``wrap``: applied to the policy object first (e.g. a
    ``DecisionLog``); ``residuals``: measured log ratios by kind and class
    (``TimingNoise.residuals``) drawn instead of the 3 % where they have a pool;
    ``job_latency_s``: the truth's fixed seconds per job (``links.job_latency_s``, e.g. the
    run's :func:`job_gap`; None: ``run``'s own). (The ``NodeResult``, the policy object it
    ran.)"""
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import simulate_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.noise import TimingNoise

    if job_latency_s is not None:
        if not (math.isfinite(job_latency_s) and job_latency_s >= 0):
            raise ValueError(f"job_latency_s: a finite number >= 0, got {job_latency_s!r}")
        truth = copy.deepcopy(run.cost.profile)
        truth["links"]["job_latency_s"] = float(job_latency_s)
        run = NodeCost(CostModel(truth))
    start = NodeCost(CostModel(profile))
    policy_obj = make_node_policy(policy, start, Node(devices, start.links))
    if wrap is not None:
        policy_obj = wrap(policy_obj)
    result = simulate_node([dataclasses.replace(r) for r in trace], policy_obj,
                           Node(devices, run.links),
                           noise=TimingNoise(0.03, 0.0, seed, residuals=residuals or {}),
                           truth=run)
    return result, policy_obj


def describe(name: str, start: dict, at_run: dict, real: dict) -> list[str]:
    """Lines for policy ``name``: each reference at start-up and at the run's speed, beside
    the run's own attainment and P95 (``start``/``at_run``: dicts with ``bound_attainment``,
    ``clairvoyant_attainment`` and the ``sim_*`` keys; ``real``: the run's row)."""
    f = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(at_run["factors"].items()))
    lines = [f"  {name:<6} speed measured in the run: {f}"]
    pct = lambda v: f"{100 * v:5.1f} %"  # noqa: E731
    for label, key in (("offline bound", "bound_attainment"),
                       ("clairvoyant", "clairvoyant_attainment"),
                       ("sim attainment", "sim_slo_attainment")):
        if key in start and key in at_run:
            lines.append(f"  {name:<6} {label:<16} start-up profile {pct(start[key])}   at "
                         f"run speed {pct(at_run[key])}   (run: "
                         f"{pct(real['slo_attainment'])})")
    if "sim_p95_s" in start and "sim_p95_s" in at_run:
        lines.append(f"  {name:<6} {'sim P95':<16} start-up profile {start['sim_p95_s']:5.2f} s"
                     f"   at run speed {at_run['sim_p95_s']:5.2f} s   (run: "
                     f"{real['p95_s']:.2f} s)")
    return lines
