"""A split decode on 2 CPU device workers (gloo), whole vs split vs split with the spare
taken back before its second tile (``NodeEngine.decode_split``'s ``taken``).

    python benchmarks/parallel/split_yield_bench.py OUT.json

tiny-qwen-image 1024² (1 step), tiles 256/224 (25 tiles: 13 on the holder, 12 on the spare,
one command each); the three kinds interleaved, 3 repeats after a warm-up; per kind the
median wall seconds of the decode call, and when the spare was handed back (``on_tiles``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.node import NodeEngine

TILE = (256, 224)
KINDS = ("whole", "split", "split_taken")


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest("a red cat", width=1024, height=1024, num_inference_steps=1,
                             seed=3, request_id=rid)


def main() -> int:
    rows: dict[str, list[dict]] = {k: [] for k in KINDS}
    with NodeEngine("tiny-qwen-image", num_devices=2, pool_pages=4096, page_bytes=1 << 16,
                    host_pages=256, start_timeout_s=300, command_timeout_s=300) as node:
        for rep in range(4):
            for kind in KINDS:
                rid = f"{kind}{rep}"
                assert node.encode(_request(rid), 0)
                node.step([((0,), [rid])])
                back: list[float] = []
                t0 = time.perf_counter()
                if kind == "whole":
                    node.decode(rid, TILE)
                else:
                    node.decode_split(rid, (0, 1), TILE,
                                      lambda d, b=back, t=t0: b.append(time.perf_counter() - t),
                                      (lambda d: True) if kind == "split_taken" else None)
                wall = time.perf_counter() - t0
                node.release(rid)
                if rep:  # the first round warms up
                    rows[kind].append({"wall_s": wall, "spare_back_s": back[0] if back else None})
    out = {"machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
           **{k: {"median_wall_s": statistics.median(r["wall_s"] for r in v), "reps": v}
              for k, v in rows.items()}}
    whole = out["whole"]["median_wall_s"]
    print(f"{'kind':12} {'wall s':>7} {'x whole':>7} {'spare back s':>12}")
    for k in KINDS:
        backs = [r["spare_back_s"] for r in rows[k] if r["spare_back_s"] is not None]
        back = f"{statistics.median(backs):12.3f}" if backs else f"{'-':>12}"
        print(f"{k:12} {out[k]['median_wall_s']:7.3f} {out[k]['median_wall_s'] / whole:7.2f} "
              f"{back}")
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
