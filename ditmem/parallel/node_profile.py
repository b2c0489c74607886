"""A profile's node sections measured on the node's own workers: ``parallel`` (the speed-up
per degree, checked plausible — see :mod:`ditmem.parallel.speedup`) and ``links`` (the peer
link's rate, the host link from the single-device part, the fixed seconds per move and per
job)."""

from __future__ import annotations

import statistics
import time

from ditmem.parallel.job_latency import add_job_latency
from ditmem.parallel.move_latency import add_move_latency
from ditmem.parallel.speedup import PROMPT, CalibrationError, calibrate, speedup_table


def measure_node_sections(node, profile: dict, key: str, sides, log, *, tool: str,
                          rounds: int = 5, clock: str = "wall") -> list[dict]:
    """Write ``profile["parallel"][key]`` and ``profile["links"]`` measured on ``node`` now
    (``sides``: square image sides; ``tool`` names the measuring command in the sources).
    On a busy-time ``clock`` ("cpu"/"process") a table refused only because the ranks
    waited for cores is measured again on wall time, which is what this machine's replays
    see now. Returns the calibration rows; ``CalibrationError`` when it stays implausible."""
    from ditmem.scheduler.models import tokens_for

    def measure(on: str) -> list[dict]:
        return calibrate(node, list(sides), rounds, clock=on, report=log,
                         tokens_for=lambda s: tokens_for(key, s, s, 1))

    log(f"measuring the speed-up per degree on {node.num_devices} devices (sides "
        f"{list(sides)}, at least {rounds} rounds of 2 steps each, checked for "
        "plausibility) ...")
    try:
        rows = measure(clock)
    except CalibrationError as exc:
        if clock == "wall" or not exc.waited_only:
            raise
        log(f"the {clock}-time table is refused only because the degree-2 ranks waited for "
            "cores (wall time far below it): measuring on wall time instead, which is what "
            "the replays will see on this machine now")
        clock = "wall"
        rows = measure(clock)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    spread = sorted({r["rounds"] for r in rows})
    profile.setdefault("parallel", {})[key] = speedup_table(
        rows, f"measured by {tool} {node.num_devices}, {when}; {clock} time, median of "
              f"{spread[0]}-{spread[-1]} interleaved rounds of 2 steps, checked plausible",
        clock)
    profile["parallel"][key]["measured"] = rows
    host = profile["host_link_bytes_per_s"]
    profile["links"] = {"device_bytes_per_s": node.peer_link_rate(),
                        "host_bytes_per_s": host["value"] if isinstance(host, dict) else host,
                        "source": f"measured by {tool}, {when}"}
    add_move_latency(node, profile["links"], log)
    add_job_latency(node, profile["links"], log)
    return rows


#: request ids of the start-up measurement on the workers (released before the replays)
_PREFIX = "profile-on-workers"


def measure_on_workers(node, profile: dict, key: str, sides, log, *, tokens_for,
                       repeats: int = 3, tile: tuple[int, int] | None = None,
                       at_once: bool = True, encode_order: str = "back-to-back") -> dict:
    """Measure the single-device numbers the replays use on the node's own workers, through
    the engine's commands as a replay times them (engine-side wall time: the worker's work
    and the control path), and write them into ``profile["models"][key]``: the step table
    (each point measured on every device — ``at_once``: all devices at the same time, each
    on its own thread, as a replay keeps them all busy; else in turn — median over
    devices), ``encode_s``, and with ``tile``
    (tile, stride px) ``decode_tile_s`` and ``decode_s_per_megapixel`` (one ``tile``² image:
    its decode is one tile). The engine process's own measurement of these (another
    process, unpinned, without the control path) is replaced; what it alone knows (state
    bytes, weights) stays. Every number is a ``stable_median`` (first call discarded, two
    agreeing passes); a side's batch sizes are measured together, interleaved
    (``stable_medians``: their ratios hold through a slow spell). ``tokens_for(side)``: the
    scheduler's tokens of a side² image. Returns ``{"before", "after"}`` (the replaced
    numbers: ``steps`` {(tokens, batch): s}, ``encode_s``, ``decode_tile_s``) and
    ``checks`` (each measurement's passes)."""
    from ditmem.models.common.request import GenerationRequest
    from ditmem.tools.profile import (
        ENCODE_ORDERS,
        checked_batches,
        checked_median,
        stability_note,
        timed,
    )

    if encode_order not in ENCODE_ORDERS:
        raise ValueError(f"encode_order: one of {ENCODE_ORDERS}, got {encode_order!r}")

    section = profile["models"][key]
    points = section["step"]["points"]["value"]
    batches = sorted({p["batch"] for p in points})
    devices = list(range(node.num_devices))
    ids = iter(range(10**9))
    checks: list[dict] = []

    def request(side: int, steps: int) -> GenerationRequest:
        return GenerationRequest(PROMPT, width=side, height=side, num_inference_steps=steps,
                                 seed=0, request_id=f"{_PREFIX}-{side}-{next(ids)}")

    def encode(side: int, device: int, steps: int) -> str:
        r = request(side, steps)
        if not node.encode(r, device):
            raise RuntimeError(f"measure_on_workers: no room for a {side}x{side} request on "
                               f"device {device}")
        return r.request_id

    def stable(sample, n: int, what: str) -> float:
        return checked_median(checks, sample, n, what, log)

    between: dict[int, str] = {}  # per device, a request stepped before each timed encode

    def encode_once(side: int, device: int) -> float:
        if encode_order == "after-step":
            if device not in between:
                between[device] = encode(sides[len(sides) // 2], device, 1000)
            node.step([((device,), [between[device]])])
        t0 = time.perf_counter()
        rid = encode(side, device, 1000)
        dt = time.perf_counter() - t0
        node.release(rid)
        return dt

    def decode_once(side: int, device: int) -> float:
        rid = encode(side, device, 2)
        node.step([((device,), [rid])])
        node.step([((device,), [rid])])
        dt = timed(lambda: node.decode(rid, tile))
        node.release(rid)
        return dt

    def over_devices(fn) -> list:
        if not at_once:
            return [fn(d) for d in devices]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(devices)) as pool:
            return list(pool.map(fn, devices))

    def median_over_devices(fn) -> float:
        return statistics.median(over_devices(fn))

    before = {"steps": {(p["tokens"], p["batch"]): p["seconds"] for p in points},
              "encode_s": section["encode_s"]["value"],
              "decode_tile_s": section.get("decode_tile_s", {}).get("value")}
    new_points, encodes = [], []
    for side in sides:
        tokens = tokens_for(side)
        encodes.append(median_over_devices(lambda d, side=side: stable(
            lambda: encode_once(side, d), max(2, repeats), f"encode {side}x{side} on {d}")))
        def steps_on(d, side=side):
            rids = [encode(side, d, 1000) for _ in range(max(batches))]
            try:
                return checked_batches(
                    checks, lambda b: node.step([((d,), rids[:b])]), batches, repeats,
                    [f"step {side}x{side} batch {b} on {d}" for b in batches], log)
            finally:
                for rid in rids:
                    node.release(rid)

        per_device = over_devices(steps_on)
        for k, b in enumerate(batches):
            new_points.append({"tokens": tokens, "batch": b,
                               "seconds": statistics.median(r[k] for r in per_device)})
    src_when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    how = (f"measured on the node's workers through the engine's commands "
           f"({node.num_devices} devices{', all at once' if at_once else ''}, median over "
           f"devices), {src_when}; "
           + stability_note(checks))
    section["step"]["points"] = {"value": new_points, "source": how}
    for rid in between.values():
        node.release(rid)
    enc = statistics.median(encodes)
    section["encode_s"] = {"value": enc, "source": how + ("; each encode right after a step "
                           "of another request" if encode_order == "after-step" else "")}
    after = {"steps": {(p["tokens"], p["batch"]): p["seconds"] for p in new_points},
             "encode_s": enc, "decode_tile_s": None}
    if tile is not None:
        t = median_over_devices(lambda d: stable(lambda: decode_once(tile[0], d),
                                                 max(2, repeats - 1),
                                                 f"decode {tile[0]}x{tile[0]} on {d}"))
        section["decode_tile_s"] = {"value": t, "source": how}
        section["decode_s_per_megapixel"] = {
            "value": t / (tile[0] * tile[0] / 1e6),
            "source": how + f"; one {tile[0]}x{tile[0]} image decodes as one tile"}
        after["decode_tile_s"] = t
    return {"before": before, "after": after, "checks": checks}
