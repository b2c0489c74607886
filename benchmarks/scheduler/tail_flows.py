"""Which requests set slo's P99 on the saved one-device demo traces (issue 13): the largest
flows under slo beside the same request's flow under fifo, with what slo did to it.

    python benchmarks/scheduler/tail_flows.py --demo RUN.json ... [--bias 0 --bias 0.1]
        [--noise-seed 0] [--top 4] [--setting LABEL=KEY:VALUE,...] [--json OUT]

Each ``--demo`` (a ``ditmem demo --json`` file with ``RUN_profile.json`` beside it) gives its
saved trace (``replay_bench.demo_trace``), run at each ``--bias`` (true times (1 + B) × the
profile's, σ 3 %) under fifo (its decode mode in the run, inline) and slo (tiled, with the
options of ``--setting``, default none) through ``DecisionLog``. Per trace: both P99s (with
150 requests the P99 is 0.49 × the 148th flow + 0.51 × the 149th) and the misses; per
request among slo's ``--top`` largest flows: shape, priority, SLO window, flow under slo
and fifo, preemptions, when slo gave it up (s after arrival; the first decision that holds
it late) with its steps left then, when its last step ended (s after arrival) and the
wait from there to its finish (its decode: a tiled decode of a late request waits on the
``late_share`` credit and on-time work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_bench import demo_trace, parse_setting, saved_demo  # noqa: E402

from ditmem.scheduler.metrics import percentile  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.policies.recorder import DecisionLog  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402


def what_slo_did(log, rid: str) -> tuple[float | None, int, float | None]:
    """From a decision log: (when ``rid`` was first held late, None if never; its steps run
    before that; when its last step ended, None if it never ran)."""
    late_at, steps, last_end = None, 0, None
    for d in log:
        if late_at is None and rid in d.late:
            late_at = d.now
        if d.ran and rid in d.ran:
            if late_at is None:
                steps += 1
            last_end = d.now + (d.step_s or 0.0)
    return late_at, steps, last_end


def rows_for(path: str, options: dict, bias: float, noise_seed: int, top: int,
             sigma: float) -> dict:
    """One trace's P99s and its ``top`` largest slo flows (module docstring)."""
    runs, cost = saved_demo(path)
    first = next(iter(runs.values()))
    reqs = demo_trace(first, cost)
    fifo = simulate([dataclasses.replace(r) for r in reqs], make_policy("fifo", cost.fresh()),
                    decode=first["decode"].get("fifo", "inline"),
                    noise=TimingNoise(sigma=sigma, seed=noise_seed, bias=bias))
    pol = DecisionLog(make_policy("slo", cost.fresh(), **options))
    slo = simulate([dataclasses.replace(r) for r in reqs], pol,
                   decode=first["decode"].get("slo", "inline"),
                   noise=TimingNoise(sigma=sigma, seed=noise_seed, bias=bias))
    fifo_flow = {rec.request.id: rec.latency for rec in fifo.records}
    out = []
    for rec in sorted(slo.records, key=lambda r: r.latency)[-top:]:
        q = rec.request
        late_at, steps, last_end = what_slo_did(pol.log, q.id)
        out.append(dict(
            id=q.id, side=q.width, priority=q.priority, window_s=q.deadline - q.arrival,
            flow_s=rec.latency, fifo_flow_s=fifo_flow[q.id], preemptions=rec.preemptions,
            met=rec.met, given_up_after_s=None if late_at is None else late_at - q.arrival,
            steps_left_then=None if late_at is None else q.steps - steps, steps=q.steps,
            steps_end_after_s=None if last_end is None else last_end - q.arrival,
            decode_wait_s=None if last_end is None else rec.finished - last_end))
    return dict(trace=path.rsplit("/", 1)[-1].removesuffix(".json"), bias=bias,
                noise_seed=noise_seed, options=options,
                slo_p99_s=percentile([r.latency for r in slo.records], 99),
                fifo_p99_s=percentile(list(fifo_flow.values()), 99),
                misses=sum(not r.met for r in slo.records), top=out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", action="append", required=True)
    ap.add_argument("--bias", type=float, action="append")
    ap.add_argument("--noise-seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--setting", default="slo=", help="slo's options, LABEL=KEY:VALUE,...")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.top < 1:
        ap.error(f"--top must be >= 1, got {args.top}")
    _, _, options = parse_setting(args.setting)
    rows = []
    for bias in args.bias or [0.0]:
        for path in args.demo:
            t = rows_for(path, options, bias, args.noise_seed, args.top, args.noise)
            rows.append(t)
            print(f"{t['trace']} x{1 + bias:.2f}: slo P99 {t['slo_p99_s']:.2f} s, fifo "
                  f"{t['fifo_p99_s']:.2f} s ({t['slo_p99_s'] / t['fifo_p99_s']:.2f} x), "
                  f"{t['misses']} missed")
            for r in t["top"]:
                gave = ("on time throughout" if r["given_up_after_s"] is None else
                        f"given up at +{r['given_up_after_s']:.2f} s with "
                        f"{r['steps_left_then']}/{r['steps']} steps left")
                end = r["steps_end_after_s"]
                print(f"  {r['id']} {r['side']}² p{r['priority']} window {r['window_s']:.2f}: "
                      f"flow {r['flow_s']:.2f} (fifo {r['fifo_flow_s']:.2f}) "
                      f"{'met' if r['met'] else 'missed'}, {r['preemptions']} preemptions, "
                      f"{gave}; steps end +{end:.2f}, then {r['decode_wait_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
