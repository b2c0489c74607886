"""One prepared device check (run by scripts/device_check.sh): what ditmem does on a real
accelerator, each part beside its baseline measured in the same run.

Parts: (1) Triton paged attention vs FlashAttention varlen (SDPA per request where
flash-attn is absent) at bf16 on Qwen-Image 1024^2 / 2048^2 and Wan 480p shapes with
shuffled pages; (2) copy_blocks and offload/restore vs a raw pinned memcpy; (3) a step's
slowdown while an offload overlaps it; (4) a real-dimension Qwen-Image block stack (random
weights, hidden 3072, 24 heads) per step vs the h200 profile's prediction; (5) a short
serving run through the engine.

``--dry-run`` runs every part on the CPU with tiny shapes (Triton through its interpreter,
fp32) so the script itself is tested where no GPU is; its numbers mean nothing.
Prints a table; ``--json PATH`` writes the results.
"""

# ruff: noqa: B023  (each timed closure runs inside its own loop iteration)
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    p.add_argument("--json", default=None)
    p.add_argument("--parts", default="attention,copy,overlap,blocks,serve")
    p.add_argument("--repeats", type=int, default=10)
    return p.parse_args(argv)


def _timer(device):
    import torch

    def run(fn, repeats):
        fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2]

    return run


def _paged_batch(lens, heads, dim, block, dtype, device, seed=0):
    """Packed q/k/v of requests with lengths ``lens``, K/V in shuffled pages."""
    import torch

    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block) for n in lens]
    perm = torch.randperm(sum(need), generator=g).tolist()
    tables, used = [], 0
    for n in need:
        tables.append(perm[used:used + n])
        used += n
    total = sum(lens)
    q = torch.randn(total, heads, dim, dtype=dtype, device=device)
    k_cache = torch.randn(sum(need), block, heads, dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    return q, k_cache, v_cache, tables


def part_attention(dev, dry, timed, repeats):
    import torch
    import torch.nn.functional as F

    import ditmem.ops as ops
    from ditmem.ops.plan import AttentionPlan

    if dry:
        shapes = {"tiny": ([40, 23], 2, 16, 16)}
        dtype = torch.float32
    else:  # tokens = image tokens + text tokens (Qwen: 16 px per token side; Wan: 480x832x81)
        shapes = {"qwen-image 1024^2 x2 (CFG)": ([4096 + 256] * 2, 24, 128, 128),
                  "qwen-image 2048^2": ([16384 + 256], 24, 128, 128),
                  "wan2.2 480p 81f": ([21 * 30 * 52], 40, 128, 128)}
        dtype = torch.bfloat16
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    rows = []
    for name, (lens, heads, dim, block) in shapes.items():
        q, k_cache, v_cache, tables = _paged_batch(lens, heads, dim, block, dtype, dev)
        plan = AttentionPlan.build(q_lens=lens, kv_lens=lens, block_tables=tables,
                                   block_size=block, num_blocks=k_cache.shape[0], device=dev)
        dense_k = [k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)]
        dense_v = [v_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)]
        with ops.use_backend("triton"):
            ours = timed(lambda: ops.planned_attention(q, k_cache, v_cache, plan), repeats)
            out = ops.planned_attention(q, k_cache, v_cache, plan)
        cu = plan.cu_seqlens_q
        if flash_attn_varlen_func is not None and dev.type == "cuda":
            k, v = torch.cat(dense_k), torch.cat(dense_v)
            base_name = "flash_attn_varlen"
            base = timed(lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens)),
                         repeats)
        else:
            base_name = "sdpa per request"

            def sdpa():
                return [F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1)[None], k.transpose(0, 1)[None],
                    v.transpose(0, 1)[None])
                    for a, b, k, v in zip(cu[:-1].tolist(), cu[1:].tolist(), dense_k, dense_v,
                                          strict=True)]
            base = timed(sdpa, repeats)
        # error against fp32 SDPA on the first 512 queries of every request (full keys)
        spans = [(a, min(b, a + 512)) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(),
                                                       strict=True)]
        ref = [F.scaled_dot_product_attention(
            q[a:b].float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
            v.float().transpose(0, 1)[None])[0].transpose(0, 1)
            for (a, b), k, v in zip(spans, dense_k, dense_v, strict=True)]
        err = max((out[a:b].float() - r).abs().max().item()
                  for (a, b), r in zip(spans, ref, strict=True))
        if err > (1e-4 if dtype == torch.float32 else 5e-2):
            raise AssertionError(f"{name}: paged attention is off by {err} vs fp32 SDPA")
        flops = sum(4 * n * n * heads * dim for n in lens)
        rows.append(dict(part="attention", case=name, ours_ms=ours * 1e3, baseline=base_name,
                         baseline_ms=base * 1e3, ratio=ours / base, max_abs_err=err,
                         tflops=flops / ours / 1e12))
    return rows


def part_copy(dev, dry, timed, repeats):
    import torch

    import ditmem.ops as ops
    from ditmem.memory import HostPool, OffloadEngine, PagePool
    from ditmem.ops import blockcopy

    page = 64 << 10 if dry else 2 << 20
    pages = 64 if dry else 1024  # 4 MiB / 2 GiB
    pool = PagePool(pages, page, dev)
    host = HostPool(pages, page, device=dev)
    nbytes = pages * page
    perm = torch.randperm(pages)
    mapping = torch.stack([perm, torch.arange(pages)], 1)
    raw_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    raw_dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rows = []
    h2d = timed(lambda: raw_dst.copy_(raw_src, non_blocking=True), repeats)
    d2h = timed(lambda: raw_src.copy_(raw_dst, non_blocking=True), repeats)
    other = PagePool(pages, page, dev)
    dev_dev = timed(lambda: ops.copy_blocks(pool.arena, other.arena, mapping.to(dev)), repeats)
    restore = timed(lambda: ops.copy_blocks(host.arena, pool.arena, mapping.to(dev)), repeats)
    offload = timed(lambda: ops.copy_blocks(pool.arena, host.arena, mapping.to(dev)), repeats)
    # the previous path: one torch copy per run of consecutive pages (all runs of 1 here)
    runs_restore = timed(lambda: blockcopy.copy_blocks(host.arena, pool.arena, mapping),
                         max(3, repeats // 3))
    eng = OffloadEngine(pool, host)
    tensor = pool.allocate_tensor(nbytes // 4 - 1, (), torch.float32)

    def roundtrip():
        eng.finish_offload(eng.start_offload([tensor]))
        handle = eng.start_restore([tensor])
        eng.finish_restore(handle)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    rt = timed(roundtrip, max(3, repeats // 3))
    gb = nbytes / 1e9
    rows += [
        dict(part="copy", case="raw pinned memcpy h2d", gbps=gb / h2d),
        dict(part="copy", case="raw pinned memcpy d2h", gbps=gb / d2h),
        dict(part="copy", case="copy_blocks device->device shuffled", gbps=2 * gb / dev_dev),
        dict(part="copy", case="copy_blocks host->device shuffled", gbps=gb / restore,
             ratio=h2d / restore),
        dict(part="copy", case="copy_blocks device->host shuffled", gbps=gb / offload,
             ratio=d2h / offload),
        dict(part="copy", case="copy per run (previous path) host->device shuffled",
             gbps=gb / runs_restore, ratio=h2d / runs_restore),
        dict(part="copy", case="OffloadEngine offload+restore", gbps=2 * gb / rt,
             ratio=(h2d + d2h) / rt),
    ]
    eng.close()
    return rows


def part_overlap(dev, dry, timed, repeats):
    import torch

    from ditmem.memory import HostPool, OffloadEngine, PagePool

    n = 256 if dry else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.float32 if dry else torch.bfloat16)

    def step():
        for _ in range(4 if dry else 20):
            a @ a

    page = 64 << 10 if dry else 2 << 20
    pages = 32 if dry else 512
    pool, host = PagePool(pages, page, dev), HostPool(pages, page, device=dev)
    eng = OffloadEngine(pool, host, mode="thread" if dev.type == "cpu" else "stream")
    tensor = pool.allocate_tensor(pages * page // 4 - 1, (), torch.float32)
    alone = timed(step, repeats)

    def overlapped():
        h = eng.start_offload([tensor])
        step()
        eng.finish_offload(h)
        eng.finish_restore(eng.start_restore([tensor]))

    both = timed(overlapped, repeats)
    copy = timed(lambda: (eng.finish_offload(eng.start_offload([tensor])),
                          eng.finish_restore(eng.start_restore([tensor]))), repeats)
    eng.close()
    return [dict(part="overlap", case="step alone vs with offload on the copier",
                 step_ms=alone * 1e3, transfer_ms=copy * 1e3, overlapped_ms=both * 1e3,
                 slowdown=both / alone, serial_ratio=(alone + copy) / both)]


def part_blocks(dev, dry, timed, repeats):
    import torch
    from diffusers import QwenImageTransformer2DModel

    import ditmem
    from ditmem.scheduler import CostModel

    if dry:
        cfg = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                   axes_dims_rope=(4, 6, 6))
        side, layers_full, dtype = 64, 2, torch.float32
    else:  # Qwen-Image: 60 blocks, hidden 3072 = 24 x 128; 4 timed and scaled to 60
        cfg = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=4,
                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=3584,
                   axes_dims_rope=(16, 56, 56))
        side, layers_full, dtype = 1024, 60, torch.bfloat16
    with torch.device(dev):  # initialised on the device: 1.4 B parameters init fast there
        model = QwenImageTransformer2DModel(**cfg).to(dtype).eval()
    adapter = ditmem.patch(model)
    h = w = side // 16
    kw = dict(hidden_states=torch.randn(1, h * w, cfg["in_channels"], device=dev, dtype=dtype),
              encoder_hidden_states=torch.randn(1, 256 if not dry else 8,
                                                cfg["joint_attention_dim"], device=dev,
                                                dtype=dtype),
              encoder_hidden_states_mask=None, timestep=torch.tensor([0.5], device=dev),
              img_shapes=[[(1, h, w)]])
    with torch.no_grad():
        per = timed(lambda: adapter.forward_packed([kw, kw]), max(3, repeats // 2))
    step = per * layers_full / cfg["num_layers"]
    row = dict(part="blocks", case=f"qwen-image {side}^2 CFG batch 2, {cfg['num_layers']} of "
               f"{layers_full} blocks timed", measured_step_ms=step * 1e3)
    if not dry:
        tokens = h * w
        predicted = CostModel.load("h200").step_time("qwen-image", [tokens, tokens])
        row.update(h200_profile_ms=predicted * 1e3, measured_over_profile=step / predicted)
    return [row]


def _mid_size_generator(dev, dry):
    """The tiny Qwen-Image pipeline with a mid-size random-weight transformer (8 blocks,
    hidden 1536 = 12 heads x 128) in bf16; the tiny model itself for a dry run."""
    import torch
    from diffusers import QwenImageTransformer2DModel

    from ditmem import models
    from ditmem.models.qwen.generate import QwenGenerator
    from ditmem.models.qwen.tiny import TRANSFORMER_CONFIG, build_pipeline

    if dry:
        return models.load("tiny-qwen-image"), "tiny-qwen-image"
    pipe = build_pipeline(seed=0, dtype=torch.bfloat16, device=str(dev))
    config = {**TRANSFORMER_CONFIG, "num_layers": 8, "num_attention_heads": 12,
              "attention_head_dim": 128, "axes_dims_rope": (16, 56, 56)}
    with torch.device(dev):
        pipe.transformer = QwenImageTransformer2DModel(**config).to(torch.bfloat16).eval()
    return QwenGenerator(pipe, name="mid-qwen-image"), "mid-qwen-image (8 x 1536, bf16)"


def part_serve(dev, dry, timed, repeats):
    from ditmem.engine.factory import EngineConfig, build_engine
    from ditmem.models.common.request import GenerationRequest

    gen, label = _mid_size_generator(dev, dry)
    engine = build_engine(EngineConfig(model="tiny-qwen-image", device=str(dev),
                                       pool_mb=64 if dry else None,
                                       host_memory_gb=0.25 if dry else 4,
                                       profile="cpu-tiny" if dry else "h200"),
                          generator=gen).start()
    side = 128 if dry else 512
    t0 = time.perf_counter()
    tickets = [engine.submit(GenerationRequest(prompt=f"p{i}", width=side * (1 + i % 2),
                                               height=side * (1 + i % 2),
                                               num_inference_steps=4 if dry else 8, seed=i,
                                               request_id=f"r{i}"), priority=i % 3)
               for i in range(8)]
    lat = sorted(t.future.result(600).timing.latency_s for t in tickets)
    wall = time.perf_counter() - t0
    engine.drain(60)
    return [dict(part="serve", case=f"{label}: 8 requests, 2 sizes (engine)",
                 wall_s=wall, p50_s=lat[len(lat) // 2], p95_s=lat[math.ceil(0.95 * 8) - 1],
                 pool_pages=engine.pool.num_pages)]


PARTS = {"attention": part_attention, "copy": part_copy, "overlap": part_overlap,
         "blocks": part_blocks, "serve": part_serve}


def main(argv=None) -> int:
    args = _args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    dev = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if not args.dry_run and dev.type != "cuda":
        print("device_check: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    timed = _timer(dev)
    results, failures = [], []
    for name in [p.strip() for p in args.parts.split(",") if p.strip()]:
        t0 = time.perf_counter()
        try:
            rows = PARTS[name](dev, args.dry_run, timed, args.repeats)
        except Exception as exc:  # noqa: BLE001 - one part's failure must not hide the rest
            failures.append(name)
            rows = [dict(part=name, case="FAILED", error=repr(exc)[:300])]
        for r in rows:
            r["part_s"] = round(time.perf_counter() - t0, 2)
        results += rows
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (dry run)"
    print(f"device check on {device} ({'dry run, tiny shapes' if args.dry_run else 'full'})")
    for r in results:
        fields = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in r.items() if k not in ("part", "case"))
        print(f"  {r['part']:<9} {r['case']:<55} {fields}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "dry_run": args.dry_run, "results": results}, f,
                      indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
