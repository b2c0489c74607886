"""The fixed cost of a move on the node engine, measured at start-up.

A move of paused state (re-shard between groups over the device link, park on the host,
restore from it) costs its bytes over a link plus a fixed part: the command's round trip
to every worker it involves, the exchange's set-up, the page bookkeeping. The fixed part
is what ``links.move_latency_s`` prices (``ditmem.scheduler.node.speedup.Links``: seconds
per move command). :func:`measure_move_latency` moves one tiny request (a few KiB of state:
its bytes take microseconds on any link) around two idle workers — re-shards 1 → 2 → 1
device and park/restore round trips — and takes the median of each kind over repeats.
"""

from __future__ import annotations

import statistics

from ditmem.models.common.request import GenerationRequest

#: the probe request's side (pixels) and id
PROBE_SIDE = 32
PROBE_ID = "ditmem-move-probe"


def measure_move_latency(node, repeats: int = 9, devices: tuple[int, int] = (0, 1)) -> dict:
    """Median seconds per move command on ``node`` (idle: nothing else may run), per kind
    ("peer": a re-shard between groups; "offload": a park on the host; "restore": from the
    host onto one device) and over all of them (``move_latency_s``), with the wall and
    control-path medians. Every command is timed from the last device beginning it to its
    end (``MoveTiming.own_s``)."""
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    a, b = devices
    request = GenerationRequest("move probe", width=PROBE_SIDE, height=PROBE_SIDE,
                                num_inference_steps=2, seed=0, request_id=PROBE_ID)
    if not node.encode(request, a):
        raise RuntimeError(f"measure_move_latency: no room on device {a} for the probe")
    kinds: dict[str, list] = {"peer": [], "offload": [], "restore": []}
    try:
        for _ in range(repeats):
            kinds["peer"].append(node.move(PROBE_ID, (a, b)))   # degree 1 -> 2
            kinds["peer"].append(node.move(PROBE_ID, (b,)))     # 2 -> 1, other device
            kinds["peer"].append(node.move(PROBE_ID, (a,)))     # 1 -> 1, back
            kinds["offload"].append(node.park(PROBE_ID))
            kinds["restore"].append(node.restore(PROBE_ID, (b,)))
            kinds["offload"].append(node.park(PROBE_ID))
            kinds["restore"].append(node.restore(PROBE_ID, (a,)))
    finally:
        node.release(PROBE_ID)
    every = [t for ts in kinds.values() for t in ts]
    if any(t is None for t in every):
        raise RuntimeError("measure_move_latency: a restore found no room")
    return {
        "move_latency_s": statistics.median(t.own_s for t in every),
        "by_kind_s": {k: statistics.median(t.own_s for t in ts) for k, ts in kinds.items()},
        "wall_s": statistics.median(t.wall_s for t in every),
        "control_s": statistics.median(t.parts()["control"] for t in every),
        "commands": len(every),
        "probe_bytes_note": f"a {PROBE_SIDE}x{PROBE_SIDE} request's state: its bytes are "
                            "negligible on any link, so each command's time is its fixed cost",
    }


def record_measured(links: dict, key: str, m: dict, what: str) -> None:
    """Write ``links[key] = m[key]`` and the measurement beside it (``links[key without its
    "_s" + "_measured"]``: ``m`` with its source: when, on the idle workers, ``what``)."""
    import time

    links[key] = m[key]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    source = f"measured on the node's idle workers, {when}: {what}"
    links[f"{key.removesuffix('_s')}_measured"] = dict(m, source=source)


def add_move_latency(node, links: dict, log=None, repeats: int = 9) -> dict:
    """Measure (:func:`measure_move_latency`) and write ``links["move_latency_s"]`` (and the
    measurement beside it, ``links["move_latency_measured"]``); returns the measurement."""
    m = measure_move_latency(node, repeats)
    record_measured(links, "move_latency_s", m,
                    f"median over {m['commands']} move commands of a tiny request")
    if log is not None:
        kinds = ", ".join(f"{k} {1e3 * v:.2f}" for k, v in m["by_kind_s"].items())
        log(f"move latency: {1e3 * m['move_latency_s']:.2f} ms per move command (median; "
            f"by kind, ms: {kinds}; control path {1e3 * m['control_s']:.2f} ms)")
    return m


def breakdown(moves) -> dict[str, dict]:
    """Where the moves' time went, per kind (``EngineDevices.moves`` records): count and
    the medians and sums (seconds) of ``wall``, ``wait`` (for devices busy with another
    job: the source's step), ``copy`` (the last device's command) and ``control`` (the
    pipes' round trip)."""
    by: dict[str, list] = {}
    for m in moves:
        by.setdefault(m.kind, []).append(m.timing)
    out = {}
    for kind, ts in sorted(by.items()):
        parts = [t.parts() for t in ts]
        row = {"moves": len(ts), "wall_median_s": statistics.median(t.wall_s for t in ts),
               "wall_sum_s": sum(t.wall_s for t in ts)}
        for part in ("wait", "copy", "control"):
            row[f"{part}_median_s"] = statistics.median(p[part] for p in parts)
            row[f"{part}_sum_s"] = sum(p[part] for p in parts)
        out[kind] = row
    return out
