"""The node engine's control-path lag during a real ``ditmem demo --devices`` run.

    python benchmarks/parallel/control_lag.py [--json OUT] -- demo --devices 2 --profile P.json ...

The loop decides at the time of the completion it handles (``Completion.finished``) and
launches jobs at that ``now``; the node simulator takes both as instantaneous. This wraps
``EngineDevices`` for one run of the given ``ditmem`` command and reports, per launch, the
engine clock at launch minus the loop's ``now`` (decision and launch), and per completion the
delay until the loop picked it up (milliseconds: median, p90, p99, max, and the sum in s).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

log = logging.getLogger("control_lag")


def quantiles(values_ms: list[float]) -> dict:
    xs = sorted(values_ms)
    if not xs:
        return {"n": 0}
    pick = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"n": len(xs), "median_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
            "max_ms": xs[-1], "sum_s": sum(xs) / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the two summaries here")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="the ditmem command after --, e.g. demo --devices 2 ...")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the ditmem command after --")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from ditmem.cli import main as ditmem_main
    from ditmem.parallel import devices

    lags, pickups = [], []
    launch, wait = devices.EngineDevices.launch, devices.EngineDevices.wait

    def timed_launch(self, job, now):
        lags.append(1e3 * (self.now() - now))
        return launch(self, job, now)

    def timed_wait(self, until):
        out = wait(self, until)
        pickups.extend(1e3 * (self.now() - c.finished) for c in out)
        return out

    devices.EngineDevices.launch, devices.EngineDevices.wait = timed_launch, timed_wait
    rc = ditmem_main(command)
    out = {"launch_lag": quantiles(lags), "pickup": quantiles(pickups)}
    for name, q in out.items():
        if q["n"]:
            log.info("%-10s n %5d  median %.2f  p90 %.2f  p99 %.2f  max %.1f ms  sum %.2f s",
                     name, q["n"], q["median_ms"], q["p90_ms"], q["p99_ms"], q["max_ms"],
                     q["sum_s"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return rc


if __name__ == "__main__":  # the workers are spawned: they re-import this file
    sys.exit(main())
