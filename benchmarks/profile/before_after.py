"""The start-up profile's accuracy before and after the session-7 measurement fix, side by
side in one script: short ``ditmem demo`` runs (one device, and ``--devices 2``) of the code
before (``--before``: a copy of the tree with the profile files as committed before the fix)
and after (``--after``), alternating so that both see the same machine.

Per run it records what the run measured against its own start-up profile:
* one device: fifo's mean in-run service time ÷ the profile's mean standalone time of the
  same requests (the factor by which the trace's load missed the requested one; the same
  rule as ``past_runs.py``), both policies' measured load, and (after) the per-kind ratios
  the demo now prints;
* two devices: the per-kind ratios both versions record (``vs_profile``) and the load the
  run's work implies (requested × all measured seconds / all predicted).

    .venv/bin/python benchmarks/profile/before_after.py --before /tmp/profile_before \
        --one 3 --two 2 --requests 40 --json benchmarks/profile/results/before_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from replay_bench import demo_trace  # noqa: E402

CLI = "import sys; from ditmem.cli import main; sys.exit(main())"


def run_demo(tree: str, extra: list[str], out: Path, timeout: int) -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, "-c", CLI, "demo", "--no-progress", "--json", str(out),
           "--profile-out", str(out.with_suffix(".profile.json")), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    out.with_suffix(".txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} in {tree}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text()), wall


def one_device_row(rows: list[dict], profile_path: Path) -> dict:
    from ditmem.scheduler import CostModel

    meta = rows[0]
    cost = CostModel.load(profile_path)
    trace = demo_trace(meta, cost)
    alone = statistics.mean(cost.standalone_time(r) for r in trace)
    by = {r["policy"]: r for r in rows}
    out = {"fifo_service_ratio": by["fifo"]["mean_service_s"] / alone,
           "measured_load": {p: r["measured_load"] for p, r in by.items()}}
    if "vs_profile" in by["fifo"]:
        out["vs_profile"] = {p: {k: v["ratio"] for k, v in r["vs_profile"].items()}
                             for p, r in by.items()}
    return out


def two_device_row(rows: list[dict]) -> dict:
    from ditmem.tools.profile_check import work_ratio

    return {"vs_profile": {r["policy"]: {k: v["ratio"] for k, v in r["vs_profile"].items()}
                           for r in rows},
            "work_load": {r["policy"]: r["load"] * work_ratio(r["vs_profile"]) for r in rows},
            "attainment": {r["policy"]: r["slo_attainment"] for r in rows}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--after", default=str(Path(__file__).resolve().parents[2]))
    p.add_argument("--one", type=int, default=3)
    p.add_argument("--two", type=int, default=2)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--out-dir", default="/tmp/profile_before_after")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "requests": args.requests, "one": [], "two": []}
    plan = [("one", i) for i in range(args.one)] + [("two", i) for i in range(args.two)]
    for kind, i in plan:
        for version, tree in (("before", args.before), ("after", args.after)):
            extra = ["--requests", str(args.requests)]
            if kind == "one":
                extra += ["--plot", ""]
            else:
                extra += ["--devices", "2"]
            out = out_dir / f"{kind}_{version}_{i}.json"
            load0 = os.getloadavg()[0]
            rows, wall = run_demo(tree, extra, out, timeout=1200)
            row = (one_device_row(rows, out.with_suffix(".profile.json")) if kind == "one"
                   else two_device_row(rows))
            row.update(version=version, run=i, wall_s=wall,
                       load_average=[load0, os.getloadavg()[0]])
            results[kind].append(row)
            print(json.dumps({"kind": kind, **row}), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2))
    for kind in ("one", "two"):
        for version in ("before", "after"):
            rs = [r for r in results[kind] if r["version"] == version]
            if not rs:
                continue
            if kind == "one":
                x = [r["fifo_service_ratio"] for r in rs]
                loads = [r["measured_load"]["fifo"] for r in rs]
                print(f"one device {version}: fifo in-run/profile "
                      f"{', '.join(f'x{v:.2f}' for v in x)}; measured load (fifo) "
                      f"{', '.join(f'{v:.2f}' for v in loads)} "
                      f"(spread {max(loads) - min(loads):.2f})")
            else:
                for pol in ("fifo", "slo"):
                    kinds = sorted({k for r in rs for k in r["vs_profile"][pol]})
                    print(f"two devices {version} {pol}: " + "; ".join(
                        f"{k} " + "/".join(f"x{r['vs_profile'][pol].get(k, float('nan')):.2f}"
                                           for r in rs) for k in kinds)
                        + "; implied load " + "/".join(f"{r['work_load'][pol]:.2f}" for r in rs))


if __name__ == "__main__":
    main()
