"""Wan packed step vs stock diffusers forwards, and cached vs recomputed cross-attention
K/V, on CPU.

Scenarios (timed side by side in the same run, interleaved, median of repeats):

* ``8 x 256^2 x 9f`` — one ``forward_packed`` over 8 small videos (256x256, 9 frames: 768
  video tokens each, 512 padded text tokens as Wan uses, different timesteps) vs 8 separate
  stock ``transformer(**kw)`` calls. Throughput ratio = stock time / packed time.
* ``mixed``          — the same with 8 videos of different sizes and frame counts.
  Both are timed with text K/V recomputed (``encoder_hidden_states``, what stock does) and
  read from cached pages (``cross_kv``): ``cached/recomputed`` isolates the K/V cache.
* ``single``         — one request: ``forward_packed([kw])`` and the patched model's own
  forward vs the stock forward: overhead = patched / stock - 1.

Models: ``tiny`` is the embedded tiny-wan transformer (dim 32, 2 layers); ``small`` is a
random-weight Wan transformer with dim 256 (4 heads of 64), 4 layers, text dim 256, where
compute matters more than per-op overhead.

    .venv/bin/python benchmarks/models/wan_step.py [--quick] [--json PATH] [--threads N]
        [--clock cpu|wall]

Timing helpers (interleaved rounds, CPU clock by default, ratio = median of per-round
ratios) are in common.py, shared with bench_qwen.py.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from pathlib import Path

import torch

import ditmem
from ditmem.memory import PagePool
from ditmem.models.wan.tiny import build_tiny_transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    add_arguments,
    rel_err,
    run_models,
    side_by_side,
    summary,
    write_json,
)

SMALL = dict(num_attention_heads=4, attention_head_dim=64, text_dim=256, freq_dim=256,
             ffn_dim=1024, num_layers=4, in_channels=16, out_channels=16)
TEXT_LEN = 512
SCENARIOS = {
    "8 x 256^2 x 9f": [(256, 256, 9)] * 8,
    "mixed": [(256, 256, 9), (128, 128, 17), (192, 320, 5), (384, 128, 9), (256, 384, 1),
              (160, 160, 13), (320, 320, 5), (128, 256, 9)],
}


def build(name: str):
    """(stock transformer, patched copy, its adapter)."""
    stock = build_tiny_transformer() if name == "tiny" else build_tiny_transformer(seed=5,
                                                                                     **SMALL)
    patched = copy.deepcopy(stock)
    return stock, patched, ditmem.patch(patched)


def make_kwargs(model, videos, seed=0):
    """videos: (height px, width px, frames) -> batch-1 forward kwargs (8x VAE, 4x time)."""
    g = torch.Generator().manual_seed(seed)
    cin, text_dim = model.config.in_channels, model.config.text_dim
    out = []
    for i, (h, w, f) in enumerate(videos):
        out.append(dict(
            hidden_states=torch.randn(1, cin, (f - 1) // 4 + 1, h // 8, w // 8, generator=g),
            timestep=torch.tensor([999 - 900 * i // max(1, len(videos) - 1)]),
            encoder_hidden_states=torch.randn(1, TEXT_LEN, text_dim, generator=g)))
    return out


def run(model_name: str, repeats: int, clock) -> list[dict]:
    stock, _, adapter = build(model_name)
    pool = PagePool(64, 1 << 20)
    rows = []
    with torch.no_grad():
        for name, videos in SCENARIOS.items():
            kws = make_kwargs(stock, videos)
            caches = [adapter.cache_cross_kv(kw["encoder_hidden_states"], pool) for kw in kws]
            cached_kws = [dict(hidden_states=kw["hidden_states"], timestep=kw["timestep"],
                               cross_kv=c) for kw, c in zip(kws, caches, strict=True)]
            fns = {
                "stock": lambda kws=kws: [stock(**kw, return_dict=False)[0] for kw in kws],
                "packed": lambda kws=kws: adapter.forward_packed(kws),
                "cached": lambda c=cached_kws: adapter.forward_packed(c),
            }
            t = side_by_side(fns, repeats, clock)
            ref = fns["stock"]()
            tokens = sum(kw["hidden_states"][0, 0].numel() // 4 for kw in kws)
            for key, label in (("packed", "packed, text K/V recomputed"),
                               ("cached", "packed, text K/V cached")):
                rows.append(dict(model=model_name, scenario=name, variant=label, requests=8,
                                 video_tokens=tokens, baseline="8 stock forwards",
                                 **summary(t, "stock", key), max_rel_err=rel_err(fns[key](), ref)))
            rows.append(dict(model=model_name, scenario=name, variant="cached vs recomputed",
                             requests=8, video_tokens=tokens, baseline="packed, recomputed",
                             **summary(t, "packed", "cached")))
            for c in caches:
                c.free()
        (kw,) = make_kwargs(stock, [(256, 256, 9)])
        t = side_by_side({
            "stock": lambda: stock(**kw, return_dict=False),
            "packed": lambda: adapter.forward_packed([kw]),
            "plain": lambda: adapter.model(**kw, return_dict=False),
        }, repeats * 3, clock)
        for key, label in (("packed", "forward_packed"), ("plain", "patched forward")):
            row = summary(t, "stock", key)
            rows.append(dict(model=model_name, scenario="single 256^2 x 9f", variant=label,
                             requests=1, baseline="stock forward", **row,
                             overhead_pct=100 * (1 / row["ratio"] - 1)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args()
    rows, repeats = run_models(args, run, quick_repeats=3, full_repeats=7)
    print(f"threads={torch.get_num_threads()} repeats={repeats} clock={args.clock} "
          f"({platform.machine()}, CPU); ratio = median over rounds of baseline/ditmem time, "
          "ms = medians")
    print(f"{'model':5} {'scenario':18} {'variant':28} {'baseline':19} {'base ms':>8} "
          f"{'ditmem ms':>9} {'ratio':>6} {'note':>16}")
    for r in rows:
        note = (f"err {r['max_rel_err']:.1e}" if "max_rel_err" in r
                else f"overhead {r['overhead_pct']:+.1f}%" if "overhead_pct" in r else "")
        print(f"{r['model']:5} {r['scenario']:18} {r['variant']:28} {r['baseline']:19} "
              f"{1e3 * r['baseline_s']:8.1f} {1e3 * r['ditmem_s']:9.1f} {r['ratio']:6.2f} "
              f"{note:>16}")
    if args.json:
        write_json(args.json, repeats, args.clock, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
