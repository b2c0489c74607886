"""The saved demo runs' start-up profiles against what their runs measured.

For each saved ``ditmem demo`` run (one device) this prints the profile's key numbers
(step at each side, batch 1; encode; one decode tile), the mean standalone time the profile
predicts for the trace's requests, the mean service time fifo measured during the run and
their ratio (the run's measured load / requested load comes from it). For the two-device
runs it prints the per-stage ratios the node demo recorded (``vs_profile``).

    .venv/bin/python benchmarks/profile/past_runs.py
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from replay_bench import demo_trace  # noqa: E402

R1 = Path("benchmarks/serving/results")
R2 = Path("benchmarks/parallel/results")


def _v(section, key):
    return section[key]["value"]


def profile_numbers(path: str) -> dict:
    p = json.load(open(path))
    m = next(iter(p["models"].values()))
    pts = {(q["tokens"], q["batch"]): q["seconds"] for q in m["step"]["points"]["value"]}
    b1 = {t: s for (t, b), s in pts.items() if b == 1}
    return {"step_b1_ms": [round(1e3 * b1[t], 1) for t in sorted(b1)],
            "encode_ms": round(1e3 * _v(m, "encode_s"), 1),
            "tile_ms": round(1e3 * _v(m, "decode_tile_s"), 1) if "decode_tile_s" in m else None}


def one_device(run: str) -> dict | None:
    from ditmem.scheduler import CostModel

    rows = json.load(open(run))
    prof = run.replace(".json", "_profile.json")
    if not Path(prof).is_file():
        return None
    meta = rows[0]
    cost = CostModel.load(prof)
    trace = demo_trace(meta, cost)
    alone = statistics.mean(cost.standalone_time(r) for r in trace)
    out = {"run": Path(run).stem, **profile_numbers(prof), "profile_mean_alone_s": alone}
    for r in rows:
        out[f"{r['policy']}_service_s"] = r["mean_service_s"]
        out[f"{r['policy']}_load"] = r["measured_load"]
    out["fifo_in_run/profile"] = out["fifo_service_s"] / alone
    return out


def main() -> None:
    print("one device: the profile's numbers and fifo's in-run mean service ÷ the profile's "
          "mean standalone time (same 150 requests in every run)")
    for run in sorted(glob.glob(str(R1 / "demo_s*_run?.json"))):
        o = one_device(run)
        if o:
            print(f"  {o['run']:<16} steps b1 {o['step_b1_ms']} ms, encode {o['encode_ms']} "
                  f"ms, tile {o['tile_ms']} ms | alone {o['profile_mean_alone_s']:.3f} s, "
                  f"fifo in-run {o['fifo_service_s']:.3f} s (x{o['fifo_in_run/profile']:.2f})"
                  f", measured load fifo {o['fifo_load']:.2f} slo {o['slo_load']:.2f}")
    print("two devices: profile numbers and the in-run ratios per stage (vs_profile)")
    for run in sorted(glob.glob(str(R2 / "demo_devices2_run*.json"))):
        if run.endswith("_profile.json") or "moves" in run:
            continue
        rows = json.load(open(run))
        # run 7b replayed run 6's saved profile; the others their own
        stem = "demo_devices2_run6" if Path(run).stem == "demo_devices2_run7b" else \
            "_".join(Path(run).stem.split("_")[:3])
        prof = glob.glob(str(R2 / f"{stem}_profile.json"))
        nums = profile_numbers(prof[0]) if prof else {}
        for r in rows:
            vs = r.get("vs_profile", {})
            print(f"  {Path(run).stem:<22} {r['policy']:<5} {nums} "
                  + ", ".join(f"{k} x{v['ratio']:.2f}" for k, v in vs.items()))


if __name__ == "__main__":
    main()
