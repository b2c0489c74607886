"""Whole tiled decodes on the node's workers against the profile's price for them.

The profile prices a tiled decode as ``decode_tile_s`` x the tiles' pixel shares (a 1024²
image with 256-px tiles every 224 px: 25 tiles = 20.25 full tiles); the node demo measures
``decode_tile_s`` as one 256² image's decode. Here whole ``NodeEngine.decode(rid, tile)``
calls are timed on the workers through the engine's commands (as a replay times them), both
devices at once (median over devices), each a ``stable_median``, the sides interleaved;
printed: each side's measured time beside its price, and a fit of fixed + per-full-tile
seconds (a fixed part would be a per-call cost the one-tile measurement charges every tile).

    .venv/bin/python benchmarks/parallel/decode_tiles_check.py     # ~2 min on 2 CPU cores
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.node import NodeEngine
from ditmem.parallel.speedup import PROMPT
from ditmem.scheduler.decode_lane import tile_sizes
from ditmem.tools.profile import stable_median, timed

TILE = (256, 224)
ORDER = (256, 1024, 512, 256, 1024, 512, 256)


def full_tiles(side: int) -> float:
    """A side² image's tiles in full tiles' pixels (the profile's price / ``decode_tile_s``)."""
    return (sum(tile_sizes(side, *TILE)) / TILE[0]) ** 2


def main() -> None:
    page = 64 * 1024
    pages = max(64, int(64 * 2**20) // page)  # the demo's default pool
    ids = iter(range(10**9))
    with NodeEngine("tiny-qwen-image", 2, pool_pages=pages, page_bytes=page,
                    host_pages=4 * pages, model_kwargs={"dtype": None}) as node:
        def decode_once(side: int, device: int) -> float:
            r = GenerationRequest(PROMPT, width=side, height=side, num_inference_steps=2,
                                  seed=0, request_id=f"dec-{side}-{next(ids)}")
            if not node.encode(r, device):
                raise RuntimeError(f"no room for {side}x{side} on device {device}")
            for _ in range(2):
                node.step([((device,), [r.request_id])])
            dt = timed(lambda: node.decode(r.request_id, TILE))
            node.release(r.request_id)
            return dt

        res: dict[int, list[float]] = {}
        for side in ORDER:
            def on(d: int, side: int = side) -> float:
                return stable_median(lambda: decode_once(side, d), 3,
                                     what=f"decode {side} on {d}", log=print).seconds

            with ThreadPoolExecutor(2) as pool:
                res.setdefault(side, []).append(statistics.median(pool.map(on, (0, 1))))
            print(side, [round(1e3 * s, 1) for s in res[side]], "ms", flush=True)
    tile_s = statistics.median(res[256])
    print(f"one 256x256 decode (the profile's decode_tile_s): {1e3 * tile_s:.1f} ms")
    for side in (512, 1024):
        m, full = statistics.median(res[side]), full_tiles(side)
        print(f"{side}x{side}: {len(tile_sizes(side, *TILE)) ** 2} tiles = {full:.4f} full "
              f"tiles; measured {1e3 * m:.0f} ms, priced {1e3 * full * tile_s:.0f} ms "
              f"(x{m / (full * tile_s):.3f})")
    xs = [full_tiles(s) for s in (256, 512, 1024)]
    ys = [statistics.median(res[s]) for s in (256, 512, 1024)]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    print(f"fit: fixed {1e3 * (my - slope * mx):.1f} ms + {1e3 * slope:.1f} ms per full tile")


if __name__ == "__main__":
    main()
