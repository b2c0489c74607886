"""A profile's node sections measured on the node's own workers: ``parallel`` (the speed-up
per degree, checked plausible — see :mod:`ditmem.parallel.speedup`) and ``links`` (the peer
link's rate, the host link from the single-device part, the fixed seconds per move)."""

from __future__ import annotations

import time

from ditmem.parallel.move_latency import add_move_latency
from ditmem.parallel.speedup import CalibrationError, calibrate, speedup_table


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
    return rows
