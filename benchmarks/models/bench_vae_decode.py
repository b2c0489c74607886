"""VAE decode on the CPU: the stock diffusers VAE vs the same VAE with ditmem's CPU fast
paths (``ditmem.models.common.cpu_vae``: conv3d through oneDNN, RMS norm by a sum of
squares), side by side in the same run, interleaved, median of repeats.

Cases: the embedded ``tiny-qwen-image`` VAE at 256², 512² and 1024² (one latent frame, as
the demos decode) and the ``tiny-wan`` VAE at 64² × 9 frames and 256² × 17 frames. A ratio
is the median over rounds of stock / patched time; ``rel err`` the largest
``|patched − stock| / max |stock|`` of the decoded pixels.

    .venv/bin/python benchmarks/models/bench_vae_decode.py [--quick] [--json PATH]
        [--repeats N] [--threads N] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
from functools import partial
from pathlib import Path

import torch

import ditmem.models as dm
from ditmem.models.common.cpu_vae import VaePatch, onednn_ready, speed_up_vae

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLOCKS, add_arguments, side_by_side, summary, write_json  # noqa: E402

log = logging.getLogger("bench_vae_decode")

#: (model, latent [N, C, T, H, W] shape, label)
CASES = (
    ("tiny-qwen-image", (1, 4, 1, 32, 32), "qwen 256^2"),
    ("tiny-qwen-image", (1, 4, 1, 64, 64), "qwen 512^2"),
    ("tiny-qwen-image", (1, 4, 1, 128, 128), "qwen 1024^2"),
    ("tiny-wan", (1, 4, 3, 8, 8), "wan 64^2 x 9"),
    ("tiny-wan", (1, 4, 5, 32, 32), "wan 256^2 x 17"),
)


def vaes(model: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(stock VAE, patched VAE): the generator patches its pipe's VAE; the stock one is a
    copy with every per-instance override removed."""
    stock = copy.deepcopy(dm.load(model).pipe.vae)
    VaePatch.found_in(stock).undo()
    patched = copy.deepcopy(stock)
    speed_up_vae(patched)
    return stock, patched


def run(repeats: int, clock, quick: bool) -> list[dict]:
    rows, built = [], {}
    for model, shape, label in CASES[:2] + CASES[3:4] if quick else CASES:
        if model not in built:
            built[model] = vaes(model)
        stock, patched = built[model]
        z = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            ref, out = stock.decode(z).sample, patched.decode(z).sample
            times = side_by_side({"stock": partial(stock.decode, z),
                                  "ditmem": partial(patched.decode, z)}, repeats, clock)
        err = float((out - ref).abs().max() / ref.abs().max())
        rows.append(dict(case=label, **summary(times, "stock", "ditmem"), rel_err=err))
        log.info("%s done", label)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not onednn_ready():
        log.error("this torch build has no oneDNN (or it is off): nothing to compare")
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 7)
    rows = run(repeats, CLOCKS[args.clock], args.quick)
    print(f"\nVAE decode, stock vs ditmem CPU paths ({args.clock} clock, {repeats} rounds, "
          f"{torch.get_num_threads()} threads)")
    print(f"{'case':<16}{'stock s':>10}{'ditmem s':>10}{'speed-up':>10}{'rel err':>10}")
    for r in rows:
        print(f"{r['case']:<16}{r['baseline_s']:>10.3f}{r['ditmem_s']:>10.3f}"
              f"{r['ratio']:>9.2f}x{r['rel_err']:>10.1e}")
    if args.json:
        write_json(args.json, repeats, args.clock, rows)
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
