"""Why ``slo`` loses attainment under class drift (``class_drift.py``): learning or rule?

    python benchmarks/scheduler/class_drift_why.py [--part demo,seed-mix] [--noise-seeds 3]
        [--seeds 0-2] [--requests 2000] [--json OUT]

The same traces, settings and noise as ``class_drift.py``'s one-device parts. Two questions:

1. **Does the online correction learn the drift?** slo as it runs (its cost model learns
   per shape class of a step's total tokens) beside slo given a cost model that *knows* the
   drift's mean factors by the truth's own classes and learns nothing (``KnownDrift``). If
   the second does no better, what is lost is the policy's rule, not its learning.
2. **When does slo give the lost requests up?** For each request slo met at ``uniform`` and
   misses under the drift (same trace and noise seed), from slo's decision log
   (``policies.recorder.DecisionLog``): whether it was set aside as late before it
   finished, the share of its SLO window gone and the steps it had done at that decision,
   its slack had it run alone from then at the drift's true times, and how late it
   finished. Beside: per tier, slo's misses and those of the clairvoyant batch-1 schedule
   re-priced at the drift (``bound.clairvoyant_flows``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import class_drift as cd  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_flows  # noqa: E402
from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise, shape_class  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.policies.recorder import DecisionLog  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402

SETTINGS = ("largest x1.20", "smallest x1.20", "all x1.20")
log = logging.getLogger("class_drift_why")


class KnownDrift(CostModel):
    """A cost model that knows ``noise``'s mean factors by the truth's classes (a step: its
    largest member's shape, from ``classes``: tokens → shape) and learns nothing."""

    def __init__(self, profile: dict, noise: TimingNoise, classes: dict[int, str]):
        super().__init__(profile)
        self.noise, self.classes = noise, classes

    def fresh(self) -> KnownDrift:
        return KnownDrift(self.profile, self.noise, self.classes)

    def step_correction(self, model, tokens) -> float:
        return self.noise.factor("step", self.classes[max(tokens)])

    def encode_time(self, request) -> float:
        return super().encode_time(request) * self.noise.factor("encode", shape_class(request))

    def decode_tiles(self, request) -> list[float]:
        f = self.noise.factor("decode", shape_class(request))
        return [t * f for t in super().decode_tiles(request)]

    def observe(self, report) -> None:
        """Learns nothing: it knows."""


def run_slo(reqs, cost, decode, noise, logged: bool = False):
    pol = make_policy("slo", cost)
    if logged:
        pol = DecisionLog(pol)
    res = simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode.get("slo", "inline"),
                   noise=noise)
    return res.records, (pol.log if logged else None)


def give_up(rec, base_met: bool, decisions, cost, noise) -> dict | None:
    """What slo's log says about a request met at uniform and missed now (None otherwise)."""
    q = rec.request
    if not base_met or rec.met:
        return None
    cls = shape_class(q)
    steps, late_at = 0, None
    for d in decisions:
        if q.id in d.late:
            late_at = d.now
            break
        if d.ran and q.id in d.ran:
            steps += 1
    out = {"tier": cls, "priority": q.priority, "late_s": rec.finished - q.deadline,
           "given_up": late_at is not None}
    if late_at is not None:
        step = cost.step_time(q.model, [cost.tokens(q)]) * noise.factor("step", cls)
        left = ((q.steps - steps) * step + cost.decode_time(q) * noise.factor("decode", cls)
                + (0.0 if steps else cost.encode_time(q) * noise.factor("encode", cls)))
        window = q.deadline - q.arrival
        out.update(steps=steps, of=q.steps, window_s=window,
                   window_gone=(late_at - q.arrival) / window,
                   slack_alone_s=q.deadline - late_at - left)
    return out


def analyse(part: str, args) -> dict:
    learn: dict[str, list] = {}
    known: dict[str, list] = {}
    lost: dict[str, list] = {}
    miss: dict[str, dict] = {}
    for name, reqs, cost, decode, seed in cd.one_device_traces(part, args):
        settings = dict(cd.one_device_settings(reqs))
        classes = {cost.tokens(r): shape_class(r) for r in reqs}
        base, _ = run_slo(reqs, cost.fresh(), decode, TimingNoise(args.sigma, 0.0, seed))
        met = {r.request.id: r.met for r in base}
        for label in SETTINGS:
            by = settings[label]
            mean = TimingNoise(0.0, 0.0, 0, by)
            noise = TimingNoise(args.sigma, 0.0, seed, by)
            recs, decisions = run_slo(reqs, cost.fresh(), decode, noise, logged=True)
            learn.setdefault(label, []).append(summarize(recs)["slo_attainment"])
            oracle, _ = run_slo(reqs, KnownDrift(cost.profile, mean, classes), decode,
                                TimingNoise(args.sigma, 0.0, seed, by))
            known.setdefault(label, []).append(summarize(oracle)["slo_attainment"])
            lost.setdefault(label, []).extend(
                x for r in recs if (x := give_up(r, met[r.request.id], decisions, cost, mean)))
            run = cd.at_drift(reqs, cost, mean)
            flows = clairvoyant_flows(run, cost)
            tiers = miss.setdefault(label, {})
            for r, f in zip(run, flows, strict=True):
                t = tiers.setdefault(shape_class(r), {"requests": 0, "clairvoyant": 0, "slo": 0})
                t["requests"] += 1
                t["clairvoyant"] += f > r.deadline - r.arrival + 1e-9
            for r in recs:
                tiers[shape_class(r.request)]["slo"] += not r.met
        log.info("%s noise %d done", name, seed)
    return {"part": part, "learn": learn, "known": known, "lost": lost, "misses": miss}


def show(out: dict) -> None:
    print(f"\n{out['part']}: slo attainment, learning vs told the drift (mean over runs)")
    for label in SETTINGS:
        a, b = out["learn"][label], out["known"][label]
        print(f"  {label:<15} learning {100 * statistics.mean(a):6.2f} %   told "
              f"{100 * statistics.mean(b):6.2f} %")
    for label in SETTINGS:
        print(f"\n  {label}: misses per tier (slo / clairvoyant at the drift / requests)")
        for tier, t in sorted(out["misses"][label].items()):
            print(f"    {tier:<10} {t['slo']:5d} / {t['clairvoyant']:5d} / {t['requests']:6d}")
        rows = out["lost"][label]
        for tier in sorted({x["tier"] for x in rows}):
            sel = [x for x in rows if x["tier"] == tier]
            g = [x for x in sel if x["given_up"]]
            line = f"    lost {tier}: {len(sel)} (p0 {sum(x['priority'] == 0 for x in sel)})"
            if g:
                med = {k: statistics.median(x[k] for x in g)
                       for k in ("window_gone", "steps", "slack_alone_s", "window_s")}
                line += (
                    f", {len(g)} set aside as late: median {med['window_gone']:.2f} of the "
                    f"window gone, {med['steps']:.0f}/{g[0]['of']} steps done, slack alone "
                    f"{med['slack_alone_s']:+.2f} s ({sum(x['slack_alone_s'] > 0 for x in g)} "
                    f"feasible alone), finished {statistics.median(x['late_s'] for x in sel):.1f}"
                    f" s late (window {med['window_s']:.1f} s)")
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="demo,seed-mix")
    ap.add_argument("--noise-seeds", type=int, default=3)
    ap.add_argument("--seeds", type=cd.seeds_arg, default=[0, 1, 2])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--noise", dest="sigma", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    bad = [p for p in parts if p not in ("demo", "seed-mix")]
    if bad:
        ap.error(f"--part: unknown {bad}; choose from demo, seed-mix")
    results = []
    for part in parts:
        out = analyse(part, args)
        show(out)
        results.append(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": " ".join(sys.argv), "parts": results}, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
