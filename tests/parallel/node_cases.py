"""Shared pieces of the node engine tests: a 2-device tiny-qwen ``NodeEngine`` (each test
module starts its own, module-scoped), its page counts, and a simulated run in which the
loop takes a split decode's spare back (to check that wrappers of the devices pass the
take-back through, and what they count)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

PROFILE = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run4_profile.json"
MODEL = "qwen-image"


def tiny_node(pool_pages: int = 256, host_pages: int = 256) -> Iterator:
    """A ``NodeEngine`` of tiny-qwen-image on 2 CPU devices (gloo), closed after its
    module's tests (``yield from`` it in a module-scoped fixture)."""
    from ditmem.parallel.node import NodeEngine

    engine = NodeEngine("tiny-qwen-image", num_devices=2, pool_pages=pool_pages,
                        page_bytes=1 << 14, host_pages=host_pages, start_timeout_s=300,
                        command_timeout_s=300)
    yield engine
    engine.close()


def pages(node) -> dict[int, tuple[int, int]]:
    """Device → (device pages, host pages) in use."""
    return {d: (s.device_pages, s.host_pages) for d, s in node.stats().items()}


def demo_truth():
    """The saved two-device demo profile's ``NodeCost`` (25 tiles for a 1024² decode)."""
    from ditmem.scheduler.cost import CostModel
    from ditmem.scheduler.node.cost import NodeCost

    return NodeCost(CostModel.from_dict(json.loads(PROFILE.read_text())))


def take_back_run(wrap: Callable, split_yield: bool) -> dict[str, float]:
    """Request id → finish (s) of :func:`take_back_records`' run."""
    return {r.request.id: r.finished for r in take_back_records(wrap, split_yield)}


def take_back_records(wrap: Callable, split_yield: bool,
                      wrap_policy: Callable = lambda policy: policy) -> list:
    """The records of node ``slo`` (split decodes, noise-free virtual devices wrapped by
    ``wrap``) on a lone 1024² whose decode splits over both devices once its 4 steps end,
    and a 256² arriving two of the spare's tiles later with a deadline 2.5 × its time
    alone: it misses waiting for the spare's tiles to end and meets it on the spare taken
    back after the tile in progress. ``wrap_policy`` wraps the policy (e.g. in a
    ``DecisionLog``)."""
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.device import VirtualDevices
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.noise import TimingNoise

    truth = demo_truth()
    topo = Node(2, truth.links)
    big = Request("big", 0.0, MODEL, width=1024, height=1024, steps=4)
    tiles = truth.cost.decode_tiles(big)
    assert len(tiles) == 25
    stepped = (4 * truth.step_time(MODEL, [truth.cost.tokens(big)], 2)
               + truth.cost.encode_time(big))
    small = Request("small", stepped + 2 * tiles[1], MODEL, width=256, height=256, steps=1)
    truth.cost.assign_deadline(big, 3.0)
    truth.cost.assign_deadline(small, 2.5)
    pol = make_node_policy("slo", NodeCost(truth.cost), topo, forecast=False,
                           split_decodes=True, split_yield=split_yield)
    devices = VirtualDevices(NodeCost(truth.cost), TimingNoise(0.0), 2)
    return run_node([big, small], wrap_policy(pol), wrap(devices), topo, truth).records
