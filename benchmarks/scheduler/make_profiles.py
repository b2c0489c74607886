"""Write scheduler/profiles/{h200,h100,a100,ascend-910b,cpu-tiny}.json from sourced numbers.

Every value below carries the sentence that justifies it (mostly ../shared/calibration.md;
"estimate:" marks numbers calibration.md does not give, with the reasoning). Rerun after
editing: ``python benchmarks/scheduler/make_profiles.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "scheduler" / "profiles"
CAL = "calibration.md"
GB = 1e9


def v(value, source):
    return {"value": value, "source": source}


def batching_anchor(note=""):
    return v(
        {"tokens": 1024, "batch": 4, "throughput_gain": 0.296},
        f"{CAL}: SGLang on 1xH100, Qwen-Image-2512 at 512² (1,024 tokens), batch <= 4: "
        f"+29.6 % throughput; sets the utilisation curve u(N)=N/(N+N0){note}",
    )


def gpu_models(slowdown: float, slow_src: str, device_gb: float, wan14b: bool):
    """Model sections for an H100-class GPU slowed by ``slowdown``."""
    rate = 500.0 / slowdown
    rate_src = f"{CAL}: ≈500 effective TFLOP/s on one H100-class GPU (CFG on)" + (
        f"; {slow_src}" if slowdown != 1.0 else ""
    )
    floor = v(0.02, f"{CAL}: 'add a 10-30 ms per-step floor' (midpoint)")
    enc = lambda base, what: v(  # noqa: E731
        round(base * slowdown, 4),
        f"estimate: {what}; calibration.md has no per-stage time"
        + (f"; x{slowdown} ({slow_src})" if slowdown != 1.0 else ""),
    )
    dec = v(
        round(0.06 * slowdown, 4),
        "estimate: VAE decode ≈ 60 ms per megapixel(-frame) on H100 (Wan-2.1-style VAE, "
        "~3 TFLOP/MP at ~50 TFLOP/s conv efficiency)"
        + (f"; x{slowdown} ({slow_src})" if slowdown != 1.0 else ""),
    )
    max_batch = v(4, f"{CAL}: batching measured up to batch 4 (SGLang, 1xH100)")
    models = {
        "qwen-image": {
            "weights_bytes": v(
                57.6 * GB, f"{CAL}: Qwen-Image DiT ≈ 41 GB + Qwen2.5-VL-7B ≈ 16.6 GB"
            ),
            "workspace_bytes": v(
                (4 if device_gb < 70 else 8) * GB,
                "estimate: activations of one packed step (2048² = 16k tokens x 3072 x bf16 "
                "≈ 100 MB per hidden tensor, FFN 4x) plus allocator slack",
            ),
            "state_bytes_per_token": v(
                256,
                f"{CAL}: 1024² latent ≈ 1 MB fp32 over 4,096 tokens (flow-match Euler: no history)",
            ),
            "state_bytes_per_request": v(4e6, f"{CAL}: text embeddings ≈ 2 MB per CFG branch, x2"),
            "encode_s": enc(0.04, "Qwen2.5-VL-7B on a ~300-token prompt, 2 branches ≈ 8 TFLOP"),
            "decode_s_per_megapixel": dec,
            "max_batch": max_batch,
            "step": {
                "kind": "flops",
                "flops_points": v(
                    [[1024, 17, 0.06], [4096, 71, 0.19], [9216, 191, 0.34], [16384, 425, 0.47]],
                    f"{CAL} FLOPs table: Qwen-Image 512²/1024²/1536²/2048² TFLOP per forward "
                    "and attention share; tokens = 1 per 16x16 px",
                ),
                "cfg_passes": v(2, f"{CAL}: true CFG 4.0, 2 passes with a negative prompt"),
                "effective_tflops": v(rate, rate_src),
                "step_floor_s": floor,
                "batching": batching_anchor(),
            },
        },
        "wan2.2-ti2v-5b": {
            "weights_bytes": v(
                21 * GB, "estimate: 5B params x bf16 = 10 GB + umT5 ≈ 11 GB (calibration.md)"
            ),
            "workspace_bytes": v(
                6 * GB, "estimate: 27,280 tokens x 3072 x bf16 ≈ 170 MB per hidden tensor, FFN 4.7x"
            ),
            "state_bytes_per_token": v(
                768,
                "estimate: 48-ch latent x 2x2 patch x fp32 = 768 B per token "
                "(geometry in calibration.md)",
            ),
            "state_bytes_per_request": v(
                3.77e8,
                "estimate: cross-attention K/V 30 layers x (K,V) x 512 x 3072 x bf16 "
                "≈ 189 MB per CFG branch, x2",
            ),
            "encode_s": enc(0.05, "umT5-XXL encoder on 512 tokens, 2 branches ≈ 12 TFLOP"),
            "decode_s_per_megapixel": dec,
            "max_batch": max_batch,
            "step": {
                "kind": "flops",
                "flops_points": v([[27280, 517, 0.54]], f"{CAL} FLOPs table: Wan-5B 720p 121f"),
                "cfg_passes": v(2, f"{CAL}: guidance 5.0 (2 passes)"),
                "effective_tflops": v(rate, rate_src),
                "step_floor_s": floor,
                "batching": batching_anchor(" (assumed: same hidden size 3072 as Qwen-Image)"),
            },
        },
    }
    if wan14b:
        models["wan2.2-a14b"] = {
            "weights_bytes": v(68 * GB, f"{CAL}: A14B's two experts ≈ 57 GB + umT5 ≈ 11 GB"),
            "workspace_bytes": v(
                10 * GB,
                "estimate: 75,600 tokens x 5120 x bf16 ≈ 0.77 GB per hidden tensor, FFN 2.7x",
            ),
            "state_bytes_per_token": v(
                768,
                f"{CAL}: Wan 720p latent ≈ 19 MB over 75,600 tokens (256 B), "
                "x3 for UniPC order-2 history (estimate)",
            ),
            "state_bytes_per_request": v(
                8.4e8, f"{CAL}: cross-attention K/V cache ≈ 420 MB per CFG branch (14B), x2"
            ),
            "encode_s": enc(0.05, "umT5-XXL encoder on 512 tokens, 2 branches ≈ 12 TFLOP"),
            "decode_s_per_megapixel": dec,
            "max_batch": max_batch,
            "step": {
                "kind": "flops",
                "flops_points": v(
                    [[32760, 1680, 0.53], [75600, 6520, 0.72]],
                    f"{CAL} FLOPs table: Wan-14B 480p/720p 81f TFLOP per forward "
                    "and attention share",
                ),
                "cfg_passes": v(2, f"{CAL}: guidance 4.0 (2 passes)"),
                "effective_tflops": v(rate, rate_src),
                "step_floor_s": floor,
                "batching": batching_anchor(" (assumed; irrelevant at >= 32k tokens)"),
            },
        }
    return models


def gpu_profile(name, desc, device_gb, device_src, slowdown=1.0, slow_src="", wan14b=True):
    return {
        "format": 1,
        "name": name,
        "description": desc,
        "device_bytes": v(device_gb * GB, device_src),
        "host_bytes": v(256 * GB, "assumption: 2 TB host RAM shared by 8 accelerators"),
        "host_link_bytes_per_s": v(
            50 * GB,
            f"{CAL}: PCIe Gen5 x16 ≈ 50-55 GB/s pinned (lower end)"
            if name in ("h200", "h100")
            else "assumption: PCIe host link, pinned (Gen4 ≈ 25 GB/s "
            "would halve it; transfers are small next to steps)",
        ),
        "models": gpu_models(slowdown, slow_src, device_gb, wan14b),
    }


def cpu_tiny():
    src = (
        "../shared/workloads/README.md: measured once, tiny Qwen-Image transformer, "
        "2 layers, one CPU core pair"
    )
    return {
        "format": 1,
        "name": "cpu-tiny",
        "description": "Tiny embedded models on a 2-core CPU; `ditmem profile` overwrites this "
        "file with measured points in the same format.",
        "device_bytes": v(4 * GB, "assumption: engine arena on CPU memory (24 GB machine)"),
        "host_bytes": v(4 * GB, "assumption: host pool in the same CPU memory"),
        "host_link_bytes_per_s": v(5 * GB, "estimate: single-threaded memcpy on this machine"),
        "models": {
            "qwen-image": {
                "weights_bytes": v(
                    0.05 * GB, "estimate: tiny transformer + encoder + VAE, a few MB"
                ),
                "workspace_bytes": v(0.5 * GB, "estimate: activations of a tiny packed step"),
                "state_bytes_per_token": v(
                    256, "same latent layout as Qwen-Image (16 ch x 2x2 x fp32)"
                ),
                "state_bytes_per_request": v(1e5, "estimate: tiny text embeddings (hidden 32)"),
                "encode_s": v(
                    0.005,
                    "estimate: tiny 2-layer text encoder; whole 128² pipeline "
                    "runs 'well under a second' (DESIGN.md)",
                ),
                "decode_s_per_megapixel": v(0.05, "estimate: tiny VAE decode"),
                "max_batch": v(
                    4,
                    "engine packed step; no batch points measured, so batches cost "
                    "the sum of single steps",
                ),
                "step": {
                    "kind": "table",
                    "points": v(
                        [
                            {"tokens": 256, "batch": 1, "seconds": 0.006},
                            {"tokens": 1024, "batch": 1, "seconds": 0.016},
                            {"tokens": 4096, "batch": 1, "seconds": 0.145},
                        ],
                        src + ": 256 tokens ≈ 6 ms/step, 1,024 ≈ 16 ms, 4,096 ≈ 145 ms",
                    ),
                },
            }
        },
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    slow_a100 = f"{CAL}: A100 ≈ 2.9x slower than H100 (large shapes fit ≈170 TFLOP/s per A100)"
    slow_910 = f"{CAL}: 910B ≈ 2.4-3x slower than H100 (middle, 2.7x)"
    profiles = [
        gpu_profile(
            "h200",
            "NVIDIA H200 141 GB: H100 compute, more memory",
            141,
            f"{CAL}: H200 ≈ H100 compute with 141 GB memory",
        ),
        gpu_profile("h100", "NVIDIA H100 80 GB", 80, "H100 SXM/PCIe: 80 GB HBM (datasheet)"),
        gpu_profile(
            "a100",
            "NVIDIA A100 80 GB",
            80,
            "A100 80 GB variant (calibration.md: A100-80G)",
            2.9,
            slow_a100,
        ),
        gpu_profile(
            "ascend-910b",
            "Huawei Ascend 910B 64 GB (Wan2.2-A14B does not fit on one card)",
            64,
            f"{CAL}: 910B: 64 GB HBM",
            2.7,
            slow_910,
            wan14b=False,
        ),
        cpu_tiny(),
    ]
    for prof in profiles:
        path = OUT / f"{prof['name']}.json"
        path.write_text(json.dumps(prof, indent=2, ensure_ascii=False) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
