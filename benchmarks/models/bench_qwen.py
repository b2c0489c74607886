"""Qwen-Image packed step vs stock diffusers forwards, on CPU.

Scenarios (each timed side by side in the same run, interleaved, median of repeats):

* ``8 x 256^2``  — one ``forward_packed`` over 8 requests (256x256 images: 256 image tokens,
  ~150 text tokens, different timesteps) vs 8 separate stock ``transformer(**kw)`` calls.
  Throughput ratio = stock time / packed time; target >= 1.3.
* ``stock batch 8 (bound)`` — measured in the same rounds as ``8 x 256^2``: the stock model's
  own forward over the 8 identical-shape requests as ONE batch (batch dimension 8, same text
  length) vs the 8 separate forwards. That is the best any packing can do for these
  requests on this machine; ``packed = x bound`` is ours as a fraction of it (median over
  rounds of batch-8 time / packed time).
* ``mixed res``  — the same with 8 requests of different resolutions and text lengths.
* ``single``     — one request: patched ``forward_packed([kw])`` and the patched model's
  ordinary forward vs the stock forward. Overhead = patched / stock - 1; target <= 5 %.

Models: ``tiny`` is the embedded tiny-qwen-image transformer (dim 64, 2 layers); ``small``
is a bigger random-weight Qwen-Image transformer (dim 256, 4 layers), where compute
matters more than per-op overhead.

    .venv/bin/python benchmarks/models/bench_qwen.py [--quick] [--json PATH] [--threads N]
        [--clock cpu|wall]

The default clock is process CPU time: on a machine shared with other jobs, wall time
mostly measures how long the process waited for a core. Use ``--threads 1`` with it (with
several threads, OpenMP spin-waiting counts as CPU time).
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from pathlib import Path

import torch

import ditmem
from ditmem.models.qwen.tiny import TRANSFORMER_CONFIG, build_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    add_arguments,
    rel_err,
    run_models,
    side_by_side,
    summary,
    write_json,
)

SMALL_CONFIG = dict(TRANSFORMER_CONFIG, num_layers=4, attention_head_dim=64,
                    num_attention_heads=4, joint_attention_dim=64, axes_dims_rope=(16, 24, 24))


def build_models(name: str):
    """(stock transformer, patched copy, adapter)."""
    if name == "tiny":
        stock = build_pipeline().transformer
    else:
        from diffusers import QwenImageTransformer2DModel

        from ditmem.models.qwen.tiny import fill_seeded_noise

        stock = fill_seeded_noise(QwenImageTransformer2DModel(**SMALL_CONFIG), 5, std=0.05)
    patched = copy.deepcopy(stock)
    return stock, patched, ditmem.patch(patched)


def make_kwargs(model, sizes, seed=0):
    """sizes: list of (height px, width px, text tokens) -> batch-1 forward kwargs."""
    g = torch.Generator().manual_seed(seed)
    cin, dj = model.config.in_channels, model.config.joint_attention_dim
    out = []
    for i, (h, w, txt) in enumerate(sizes):
        gh, gw = h // 16, w // 16
        out.append(dict(
            hidden_states=torch.randn(1, gh * gw, cin, generator=g),
            encoder_hidden_states=torch.randn(1, txt, dj, generator=g),
            encoder_hidden_states_mask=None,
            timestep=torch.tensor([0.1 + 0.8 * i / max(1, len(sizes) - 1)]),
            img_shapes=[[(1, gh, gw)]],
        ))
    return out


def stack_kwargs(kws: list[dict]) -> dict:
    """Batch-1 kwargs of identical shapes -> one stock batch (batch dimension len(kws))."""
    return dict(
        hidden_states=torch.cat([k["hidden_states"] for k in kws]),
        encoder_hidden_states=torch.cat([k["encoder_hidden_states"] for k in kws]),
        encoder_hidden_states_mask=None,
        timestep=torch.cat([k["timestep"] for k in kws]),
        img_shapes=[s for k in kws for s in k["img_shapes"]],
    )


def run(model_name: str, repeats: int, clock) -> list[dict]:
    stock, patched, adapter = build_models(model_name)
    rows = []
    scenarios = {
        "8 x 256^2": [(256, 256, 150)] * 8,
        "mixed res": [(128, 128, 40), (256, 256, 150), (192, 320, 90), (384, 128, 200),
                      (256, 384, 60), (160, 160, 120), (320, 320, 30), (128, 256, 170)],
    }
    with torch.no_grad():
        for name, sizes in scenarios.items():
            kws = make_kwargs(stock, sizes)

            def sep(kws=kws):
                return [stock(**kw, return_dict=False)[0] for kw in kws]

            def packed(kws=kws):
                return adapter.forward_packed(kws)

            fns = {"stock": sep, "packed": packed}
            if name == "8 x 256^2":
                batch = stack_kwargs(kws)
                fns["batch"] = lambda batch=batch: stock(**batch, return_dict=False)[0]
            t = side_by_side(fns, repeats, clock)
            rows.append(dict(model=model_name, scenario=name, requests=len(kws),
                             **summary(t, "stock", "packed"), target=">= 1.3 (throughput)",
                             max_rel_err=rel_err(packed(), sep())))
            if "batch" in fns:
                rows.append(dict(model=model_name, scenario="stock batch 8 (bound)",
                                 requests=len(kws), **summary(t, "stock", "batch"),
                                 target="upper bound of packing",
                                 packed_share=summary(t, "batch", "packed")["ratio"],
                                 max_rel_err=rel_err(list(fns["batch"]().split(1)),
                                                     [o[0] for o in sep()])))
        (kw,) = make_kwargs(stock, [(256, 256, 150)])
        t = side_by_side({
            "stock": lambda: stock(**kw, return_dict=False),
            "packed": lambda: adapter.forward_packed([kw]),
            "plain": lambda: patched(**kw, return_dict=False),
        }, repeats * 3, clock)
        for key, label in (("packed", "single, forward_packed"), ("plain", "single, patched fwd")):
            stats = summary(t, "stock", key)
            rows.append(dict(model=model_name, scenario=label, requests=1, **stats,
                             target="overhead <= 5 %", overhead_pct=100 * (1 / stats["ratio"] - 1)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args()
    rows, repeats = run_models(args, run, quick_repeats=5, full_repeats=11)
    print(f"threads={torch.get_num_threads()} repeats={repeats} clock={args.clock} "
          f"({platform.machine()}, CPU)")
    print("ratio = median over rounds of stock/ditmem time; ms = medians")
    print(f"{'model':6} {'scenario':24} {'n':>2} {'stock ms':>9} {'ditmem ms':>9} {'ratio':>6} "
          f"{'note':>22}")
    for r in rows:
        if "packed_share" in r:
            note = f"packed = {r['packed_share']:.2f} x bound"
        elif "max_rel_err" in r:
            note = f"err {r['max_rel_err']:.1e}"
        else:
            note = f"overhead {r['overhead_pct']:+.1f}%"
        print(f"{r['model']:6} {r['scenario']:24} {r['requests']:>2} {1e3 * r['baseline_s']:9.2f} "
              f"{1e3 * r['ditmem_s']:9.2f} {r['ratio']:6.2f} {note:>22}")
    if args.json:
        write_json(args.json, repeats, args.clock, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
