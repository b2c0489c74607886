"""Whether a demo's tail target was possible at all on the trace it ran, settled by an
exact bound for every schedule: one device, "within 1 point of the clairvoyant reference
and P99 ≤ fifo's" (issue 13; ``scheduler.exact_bound``, packed steps included); two
devices, "≥ 99 % with P95 ≤ the bar" (issue 16; ``scheduler.node.exact_bound``, the pooled
node)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ditmem.scheduler import CostModel, Request

#: the two co-present charges; each bounds every schedule, the larger miss count binds
PACKED_WORKS = ("co-present", "co-present-proportional")


def p99_verdict(trace: Sequence[Request], cost: CostModel, fifo_p99_s: float, *,
                cells: int = 8) -> dict:
    """On ``trace`` (arrivals, deadlines; ``standalone_s`` at ``cost``'s times): the
    clairvoyant reference's misses, the fewest misses any schedule can have with its P99
    ≤ ``fifo_p99_s`` (``p99_lower_misses``; None where no schedule keeps that P99 at all),
    and ``forbidden``: that bound exceeds the clairvoyant's misses by more than 1 % of the
    requests, so no schedule meets the criterion. ImportError (naming the ``bounds``
    extra) without scipy."""
    from ditmem.scheduler.bound import clairvoyant_misses
    from ditmem.scheduler.exact_bound import min_misses_percentile

    if not fifo_p99_s > 0:
        raise ValueError(f"fifo_p99_s must be > 0 s, got {fifo_p99_s!r}")
    reqs = list(trace)
    clairvoyant = clairvoyant_misses(reqs, cost)
    lower = _lower_or_none(lambda: max(
        min_misses_percentile(reqs, cost, q=99, value=fifo_p99_s, work=w, cells=cells).lower
        for w in PACKED_WORKS))
    forbidden = lower is None or lower - clairvoyant > 0.01 * len(reqs)
    return {"fifo_p99_s": fifo_p99_s, "clairvoyant_misses": clairvoyant,
            "p99_lower_misses": lower, "forbidden": forbidden, "requests": len(reqs)}


def _lower_or_none(solve: Callable[[], int]) -> int | None:
    """``solve()``'s least misses, or None where no schedule keeps its limits."""
    from ditmem.scheduler.exact_bound import Infeasible

    try:
        return solve()
    except Infeasible:
        return None


def describe_verdict(v: dict) -> str:
    """One line for the demo's report."""
    lower = ("no schedule keeps that P99 at all" if v["p99_lower_misses"] is None
             else f"every schedule misses >= {v['p99_lower_misses']}")
    verdict = ("FORBIDDEN on this trace (no schedule meets it)" if v["forbidden"]
               else "not forbidden (the bound leaves room)")
    return (f"tail criterion 'within 1 pt of the clairvoyant and P99 <= fifo's "
            f"{v['fifo_p99_s']:.2f} s' at slo's run speed: {lower}, clairvoyant "
            f"{v['clairvoyant_misses']} of {v['requests']}: {verdict}")


def p95_node_verdict(trace: Sequence[Request], cost: CostModel, devices: int,
                     p95_bar_s: float, attainment: float, *, cells: int = 8) -> dict:
    """On ``trace`` (deadlines set) on ``devices`` devices at ``cost``'s times: the fewest
    misses any node schedule can have with its P95 ≤ ``p95_bar_s`` (``p95_lower_misses``;
    None where none keeps that P95), and ``forbidden``: more than the ``attainment`` bar
    (a fraction) allows. ImportError (naming the ``bounds`` extra) without scipy."""
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.exact_bound import node_misses_percentile
    from ditmem.scheduler.node.topology import Node

    if not p95_bar_s > 0:
        raise ValueError(f"p95_bar_s must be > 0 s, got {p95_bar_s!r}")
    reqs = list(trace)
    ncost = NodeCost(cost)
    degrees = Node(devices, ncost.links).degrees
    lower = _lower_or_none(lambda: node_misses_percentile(
        reqs, ncost, devices, degrees, q=95, value=p95_bar_s, cells=cells).lower)
    allowed = len(reqs) * (1.0 - attainment) + 1e-9
    return {"p95_bar_s": p95_bar_s, "attainment_bar": attainment, "p95_lower_misses": lower,
            "forbidden": lower is None or lower > allowed, "requests": len(reqs)}


def describe_node_verdict(v: dict) -> str:
    """One line for the two-device demo's report."""
    lower = ("no schedule keeps that P95 at all" if v["p95_lower_misses"] is None
             else f"every schedule misses >= {v['p95_lower_misses']} of {v['requests']}")
    verdict = ("FORBIDDEN on this trace (no schedule meets it)" if v["forbidden"]
               else "not forbidden (the pooled-node bound leaves room)")
    return (f"  P95 target with attainment >= {100 * v['attainment_bar']:.1f} % and P95 <= "
            f"{v['p95_bar_s']:.2f} s (exact program, pooled node, start-up profile): "
            f"{lower}: {verdict}")
