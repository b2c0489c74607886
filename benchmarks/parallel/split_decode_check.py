"""A split decode across two devices of one machine (``NodeEngine.decode_split``) against
the same request's tiled decode on one device: the images (bits), the seconds of each
(median of interleaved rounds, the first round a warm-up), the spare handed back once,
and no page left. On a GPU machine with two or more GPUs ``scripts/device_check.sh`` runs
it on CUDA; on CPU (``--device cpu``: two worker processes, gloo) it is the tests' check
(``tests/parallel/test_split_decode.py``) with times.

    .venv/bin/python benchmarks/parallel/split_decode_check.py --device cuda \\
        [--side 1024 --tile 256,224 --rounds 4 --json OUT.json]
    .venv/bin/python benchmarks/parallel/split_decode_check.py --device cpu --side 128 \\
        --tile 64,48     # ~1 minute on 2 CPU cores

Exit status 1 when the images differ by more than one uint8 level, the spare is not
handed back exactly once, or pages are left; identical bits are reported apart from that
(a split decode runs the same tiles and blend: on one device type it is bit-equal).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

log = logging.getLogger("split_decode_check")


def parse_tile(text: str) -> tuple[int, int]:
    """``"256,224"`` → (tile_px, stride_px)."""
    try:
        tile, stride = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tile: expected TILE,STRIDE, got {text!r}") from None
    if not 0 < stride <= tile:
        raise argparse.ArgumentTypeError(f"--tile: need 0 < stride <= tile, got {text!r}")
    return tile, stride


def run(device: str, model: str, side: int, tile: tuple[int, int], rounds: int,
        steps: int = 2) -> dict:
    """``rounds`` rounds of: two copies of one ``side``² request finished on device 0, one
    decoded tiled there alone, the other split over devices (0, 1). Returns the checks and
    the medians (s) over the rounds after the first."""
    import numpy as np

    from ditmem.models.common.request import GenerationRequest
    from ditmem.parallel.node import NodeEngine
    from ditmem.scheduler.decode_lane import tile_sizes

    page = 64 * 1024
    pages = max(64, int(256 * 2**20) // page)
    whole_s, split_s, diffs, hand_backs = [], [], [], []
    with NodeEngine(model, 2, device_type=device, pool_pages=pages, page_bytes=page,
                    host_pages=4 * pages, model_kwargs={"dtype": None}) as node:
        def finished(rid: str) -> None:
            r = GenerationRequest("a red cat on a mat", width=side, height=side,
                                  num_inference_steps=steps, seed=7, request_id=rid)
            if not node.encode(r, 0):
                raise RuntimeError(f"no room for {side}x{side} on device 0")
            for _ in range(steps):
                node.step([((0,), [rid])])

        for k in range(rounds):
            finished(f"whole-{k}")
            finished(f"split-{k}")
            t0 = time.perf_counter()
            whole = node.decode(f"whole-{k}", tile)
            whole_s.append(time.perf_counter() - t0)
            node.release(f"whole-{k}")
            freed: list[tuple[int, ...]] = []
            t0 = time.perf_counter()
            split = node.decode_split(f"split-{k}", (0, 1), tile, freed.append)
            split_s.append(time.perf_counter() - t0)
            node.release(f"split-{k}")
            diffs.append(int(np.abs(whole.astype(int) - split.astype(int)).max()))
            hand_backs.append(freed)
            log.info("round %d: whole %.1f ms, split %.1f ms, max |diff| %d", k,
                     1e3 * whole_s[-1], 1e3 * split_s[-1], diffs[-1])
        left = {d: (s.device_pages, s.host_pages) for d, s in node.stats().items()}
    timed = slice(1, None) if rounds > 1 else slice(None)
    whole_med, split_med = statistics.median(whole_s[timed]), statistics.median(split_s[timed])
    tiles = len(tile_sizes(side, *tile)) ** 2
    return {"device": device, "model": model, "side": side, "tile": list(tile),
            "tiles": tiles, "rounds": rounds, "identical": max(diffs) == 0,
            "max_abs_diff": max(diffs), "handed_back_once": all(f == [(1,)] for f in hand_backs),
            "pages_left": {str(d): v for d, v in left.items()},
            "whole_s": whole_med, "split_s": split_med, "speedup": whole_med / split_med,
            "whole_all_s": whole_s, "split_all_s": split_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "npu", "cpu"), default="cuda")
    ap.add_argument("--model", default="tiny-qwen-image")
    ap.add_argument("--side", type=int, default=1024, help="the square image's side, px")
    ap.add_argument("--tile", type=parse_tile, default=(256, 224), metavar="TILE,STRIDE",
                    help="the VAE's tiled decode, px (default 256,224: 25 tiles at 1024²)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (the first a warm-up)")
    ap.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds: expected >= 1, got {args.rounds}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    res = run(args.device, args.model, args.side, args.tile, args.rounds)
    ok = (res["max_abs_diff"] <= 1 and res["handed_back_once"]
          and all(tuple(v) == (0, 0) for v in res["pages_left"].values()))
    res["ok"] = ok
    print(f"split decode on 2 {args.device} devices, {args.side}² in {res['tiles']} tiles: "
          f"whole {1e3 * res['whole_s']:.1f} ms, split {1e3 * res['split_s']:.1f} ms "
          f"(x{res['speedup']:.2f}); images {'identical' if res['identical'] else 'differ'} "
          f"(max |diff| {res['max_abs_diff']}); spare handed back once: "
          f"{res['handed_back_once']}; pages left {res['pages_left']}: "
          f"{'ok' if ok else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
