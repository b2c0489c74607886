"""Add the node sections ("parallel" speed-up tables, "links") to the GPU/NPU profiles.

    python benchmarks/scheduler/node_profiles.py          # rewrites scheduler/profiles/*.json
    python benchmarks/scheduler/node_profiles.py --print  # only prints the tables

Run it after ``make_profiles.py`` (which writes the profiles without these sections). The
cpu-tiny profile is left alone: ``ditmem profile --devices N`` measures its table.

The speed-up model (ours, derived from public numbers; every profile states it):

    t_d(n) = floor + W(n) · (s_d + (1 − s_d)/d) + comm_d(n)

* ``t_1(n) = floor + W(n)`` is the profile's own batch-1 step time (FLOPs model);
* ``comm_d(n)`` — Ulysses moves four all-to-alls per attention layer and CFG branch (q, k, v
  out, the result back); each rank sends ``(n + text)·hidden·2 B·(d−1)/d²`` per all-to-all
  over its peer link, plus a per-collective latency (25 µs, an estimate for NCCL/HCCL small
  messages);
* ``s_d`` — the share of a step that does not shard at degree d (replicated text stream,
  norms/modulation, launch overheads) — is solved per degree so that Qwen-Image 2048²
  reproduces vllm-omni's Ulysses speed-ups on H800 exactly (112.5 / 65.2 / 39.6 / 30.8 s:
  1.73 / 2.84 / 3.65 ×), and reused for every model and device (the one public SP anchor).
Small shapes then gain little (the floor and the collective latency do not shrink), as
calibration.md says and TetriServe reports (the best degree differs per resolution).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditmem.scheduler import CostModel
from ditmem.scheduler.models import geometry

PROFILES = Path(__file__).resolve().parents[2] / "scheduler" / "profiles"
CAL = "calibration.md"
ANCHOR = {2: 112.5 / 65.2, 4: 112.5 / 39.6, 8: 112.5 / 30.8}
ANCHOR_TOKENS = 16384
LATENCY_S = 25e-6
DEGREES = (1, 2, 4, 8)
TOKENS = {
    "qwen-image": [256, 1024, 2304, 4096, 6889, 9216, 16384],
    "wan2.2-a14b": [8190, 32760, 75600],
    "wan2.2-ti2v-5b": [4096, 8190, 27280],
}
#: Peer link per device, one direction (bytes/s), and its source.
LINKS = {
    "h200": (450e9, f"{CAL}: NVLink 4 on H100/H200 ≈ 900 GB/s per GPU (450 each way)"),
    "h100": (450e9, f"{CAL}: NVLink 4 on H100/H200 ≈ 900 GB/s per GPU (450 each way)"),
    "a100": (300e9, "NVIDIA A100 datasheet: NVLink 3, 600 GB/s per GPU (300 each way)"),
    "ascend-910b": (
        196e9,
        f"{CAL}: HCCS on 910B ≈ 392 GB/s per card (vendor figure, unverified; half each way)",
    ),
}


def comm_s(model: str, tokens: int, degree: int, link: float, cfg: int) -> float:
    """Seconds of Ulysses all-to-alls per step at ``degree`` (see the module docstring)."""
    if degree == 1:
        return 0.0
    geo = geometry(model)
    rows = tokens + geo.text_stream_tokens
    per_rank = rows * geo.hidden * 2 * (degree - 1) / degree**2
    return geo.blocks * cfg * 4 * (per_rank / link + LATENCY_S)


def solve_shares(cost: CostModel, link: float) -> dict[int, float]:
    """``s_d`` per degree so that Qwen-Image 2048² matches the vllm-omni anchor."""
    t1 = cost.step_time("qwen-image", [ANCHOR_TOKENS])
    floor = float(cost.profile["models"]["qwen-image"]["step"]["step_floor_s"])
    work = t1 - floor
    shares = {}
    for d, speedup in ANCHOR.items():
        target = t1 / speedup - floor - comm_s("qwen-image", ANCHOR_TOKENS, d, link, 2)
        # target = work · (s + (1 − s)/d)  →  s
        shares[d] = (target / work - 1 / d) / (1 - 1 / d)
    return shares


def table(cost: CostModel, model: str, link: float, shares: dict[int, float]) -> dict:
    step = cost.profile["models"][model]["step"]
    floor, cfg = float(step["step_floor_s"]), int(step["cfg_passes"])
    rows = {"1": [1.0] * len(TOKENS[model])}
    for d in DEGREES[1:]:
        row = []
        for n in TOKENS[model]:
            t1 = cost.step_time(model, [n])
            work = t1 - floor
            td = floor + work * (shares[d] + (1 - shares[d]) / d) + comm_s(model, n, d, link, cfg)
            row.append(round(t1 / td, 4))
        rows[str(d)] = row
    return rows


def sections(name: str) -> dict:
    cost = CostModel.load(name)
    link, link_src = LINKS[name]
    shares = solve_shares(cost, link)
    share_txt = ", ".join(f"s_{d}={s:.3f}" for d, s in shares.items())
    source = (
        "derived (benchmarks/scheduler/node_profiles.py): t_d = floor + W·(s_d + (1−s_d)/d) + "
        "Ulysses all-to-alls (4 per layer and CFG branch over the peer link, 25 µs latency "
        f"each); s_d solved so that Qwen-Image 2048² gives vllm-omni's Ulysses 1/2/4/8 "
        f"speed-ups on H800 (112.5/65.2/39.6/30.8 s, docs/user_guide/diffusion_acceleration.md)"
        f": {share_txt}; W and floor are this profile's batch-1 step model. Cross-checks: "
        "Wan2.2-I2V-A14B 720p on 8×H100 6.3 s/step vs ≈26 s predicted alone (≈4.1×, "
        "calibration.md); TetriServe (arXiv 2510.01565): small resolutions gain little from SP"
    )
    parallel = {}
    for model in cost.profile["models"]:
        parallel[model] = {
            "tokens": TOKENS[model],
            "speedup": table(cost, model, link, shares),
            "source": source,
        }
    links = {
        "device_bytes_per_s": link,
        "host_bytes_per_s": float(cost.profile["host_link_bytes_per_s"]),
        "source": f"device: {link_src}; host: {CAL}: PCIe Gen5 x16 ≈ 50-55 GB/s pinned "
        "(the profile's host_link_bytes_per_s), one link per device",
    }
    return {"parallel": parallel, "links": links}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only, write nothing")
    args = parser.parse_args()
    for name in LINKS:
        extra = sections(name)
        for model, entry in extra["parallel"].items():
            print(f"{name:<12} {model:<15} tokens {entry['tokens']}")
            for d, row in entry["speedup"].items():
                print(f"{'':<28} d={d}: {row}")
        if args.print:
            continue
        path = PROFILES / f"{name}.json"
        data = json.loads(path.read_text())
        data.update(extra)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
