"""slo's give-up and late-join options under class drift, side by side with the default.

Session 11 (issue 13): under class drift slo loses 1.6–2.0 points where the clairvoyant
loses 0.1–1.0 (``class_drift.py``), and it is the rule, not the learning
(``class_drift_why.py``). Two causes were traced on the runs: on the demo traces a request
given up joins the step of an on-time request of its shape while that request keeps slack
>= 0 after each step, until the on-time one has none left and is given up too
(``late_joins_free`` kept a late joiner out unless it took no on-time slack); on seed-mix
the lost 2048²s were all given up for an overrun within the forecast's expected arrivals
(``give_up_forecast`` chose which requests may be set aside for that). Neither was adopted
and both were removed in session 17 (the last commit with them: 97f9a1a); the script still
runs any other ``slo`` option as a variant.

For each variant (``--variant NAME=OPT:JSON,...``; the default always runs first) and the
settings uniform, largest tier ×1.20 and smallest ×1.20 (steps and decodes of that class,
``class_drift.one_device_settings``): the 12 saved demo traces × ``--noise-seeds`` (means
over runs of attainment, p0, P95, P99) and seed-mix/h200 ρ 0.8 (``--seeds`` × 2,000, pooled).
Noise σ 3 %. Prints one table per part; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from class_drift import one_device_settings, one_device_traces, p0, seeds_arg  # noqa: E402
from replay_bench import parse_setting  # noqa: E402

from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402

#: indices into ``class_drift.one_device_settings``: uniform, largest ×1.20, smallest ×1.20
SETTINGS = (0, 2, 3)
#: ``--settings`` names of those indices
SETTING_NAMES = {"uniform": 0, "largest": 2, "smallest": 3}
log = logging.getLogger("give_up")


def traces(part: str, args):
    """(requests, cost, slo's decode, noise seed) per run of ``part``
    (``class_drift.one_device_traces``)."""
    for _, reqs, cost, decode, seed in one_device_traces(part, args):
        yield reqs, cost, decode.get("slo", "inline"), seed


def run_part(part: str, variants: dict[str, dict], args) -> list[dict]:
    """One row per (setting, variant): the demo's means over runs, seed-mix pooled."""
    recs: dict[tuple[int, str], list] = {}
    label: dict[int, str] = {}
    for reqs, cost, decode, seed in traces(part, args):
        t0 = time.time()
        settings = one_device_settings(reqs)
        for k in args.settings:
            label[k], by = settings[k]
            for name, opts in variants.items():
                pol = make_policy("slo", cost.fresh(), **opts)
                res = simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode,
                               noise=TimingNoise(args.sigma, 0.0, seed, by))
                recs.setdefault((k, name), []).append(res.records)
        log.info("%s seed %d: %.1f s", part, seed, time.time() - t0)
    rows = []
    for (k, name), runs in recs.items():
        if part == "demo":
            s = [summarize(r) for r in runs]
            row = dict(attainment=statistics.mean(x["slo_attainment"] for x in s),
                       p0=statistics.mean(p0(x) for x in s if p0(x) is not None),
                       p95_s=statistics.mean(x["p95_s"] for x in s),
                       p99_s=statistics.mean(x["p99_s"] for x in s),
                       max_s=statistics.mean(x["max_s"] for x in s))
        else:
            s = summarize([x for r in runs for x in r])
            row = dict(attainment=s["slo_attainment"], p0=p0(s), p95_s=s["p95_s"],
                       p99_s=s["p99_s"], max_s=s["max_s"])
        rows.append(dict(part=part, setting=label[k], variant=name, options=variants[name],
                         runs=len(runs), **row))
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"\n{rows[0]['part']}: {rows[0]['runs']} runs per row, noise σ 3 %")
    print(f"{'setting':<16} {'variant':<14} {'att':>7} {'p0':>7} {'P95':>8} {'P99':>8} "
          f"{'max':>8}")
    for r in sorted(rows, key=lambda r: (SETTINGS.index(_k(r)), 0)):
        print(f"{r['setting']:<16} {r['variant']:<14} {100 * r['attainment']:7.2f} "
              f"{100 * r['p0']:7.2f} {r['p95_s']:8.2f} {r['p99_s']:8.2f} {r['max_s']:8.1f}")


def _k(row: dict) -> int:
    return {"uniform": 0, "largest x1.20": 2, "smallest x1.20": 3}[row["setting"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="demo,seed-mix")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=OPT:JSON,... slo options beside the default (repeatable)")
    ap.add_argument("--noise-seeds", type=int, default=3, help="demo: noise seeds per trace")
    ap.add_argument("--seeds", type=seeds_arg, default=[0, 1, 2], help="seed-mix seeds")
    ap.add_argument("--requests", type=int, default=2000, help="seed-mix requests per seed")
    ap.add_argument("--noise", dest="sigma", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--arrival", default="poisson", help="seed-mix arrivals: poisson | gamma:CV")
    ap.add_argument("--settings", default="uniform,largest,smallest",
                    help=f"comma-separated, from {', '.join(SETTING_NAMES)}")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    if not names or any(n not in SETTING_NAMES for n in names):
        ap.error(f"--settings: choose from {', '.join(SETTING_NAMES)}, got {args.settings!r}")
    args.settings = [SETTING_NAMES[n] for n in names]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    variants = {"default": {}}
    for text in args.variant:
        name, _, opts = parse_setting(text)
        variants[name] = opts
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    bad = [p for p in parts if p not in ("demo", "seed-mix")]
    if bad:
        ap.error(f"--part: unknown {bad}; choose from demo, seed-mix")
    out = {"noise": args.sigma, "command": " ".join(sys.argv), "rows": []}
    for part in parts:
        rows = run_part(part, variants, args)
        print_rows(rows)
        out["rows"] += rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
