"""Factories for node tests: a round-number profile with parallel/links sections."""

from __future__ import annotations

from sched_factories import PAGE, table_profile

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise

#: 512² = 1,024 tokens: no gain from parallelism; 1024² = 4,096 tokens: perfect at 2, 3.2× at 4.
SPEEDUP = {"1": [1.0, 1.0], "2": [1.0, 2.0], "4": [1.0, 3.2]}


def node_profile(
    *, device_bytes=1e12, state_bytes=PAGE, peer=1e9, host=1e8, move_latency=None,
    job_latency=None, **kw
) -> dict:
    """512² steps in 1 s, 1024² in 4 s (batch 1); state ``state_bytes``; links in B/s;
    ``move_latency`` seconds per move command, ``job_latency`` per job (each absent from the
    profile when None)."""
    prof = table_profile(state_bytes=state_bytes, device_bytes=device_bytes, link=host, **kw)
    prof["page_bytes"] = {"value": PAGE, "source": "test"}
    prof["parallel"] = {
        "qwen-image": {"tokens": [1024, 4096], "speedup": SPEEDUP, "source": "test"}
    }
    prof["links"] = {"device_bytes_per_s": peer, "host_bytes_per_s": host, "source": "test"}
    if move_latency is not None:
        prof["links"]["move_latency_s"] = move_latency
    if job_latency is not None:
        prof["links"]["job_latency_s"] = job_latency
    return prof


def node_cost(**kw) -> NodeCost:
    return NodeCost(CostModel.from_dict(node_profile(**kw)))


def tiled_node_cost() -> NodeCost:
    """``node_profile`` with tiled decodes (1 s per megapixel in 256-px tiles of 0.25 s),
    which a node may split over a group's devices."""
    prof = node_profile(decode_s_per_mp=1.0)
    prof["models"]["qwen-image"].update(
        decode_tile_px={"value": 256, "source": "test"},
        decode_stride_px={"value": 256, "source": "test"},
        decode_tile_s={"value": 0.25, "source": "test"},
    )
    return NodeCost(CostModel.from_dict(prof))


def run(requests, policy: str, devices: int, ncost: NodeCost | None = None, **options):
    """Simulate ``requests`` (deadlines set) noise-free; returns the NodeResult."""
    ncost = ncost or node_cost()
    node = Node(devices, ncost.links)
    pol = make_node_policy(policy, ncost, node, **options)
    return simulate_node(requests, pol, node, noise=TimingNoise(0.0))


def by_id(result) -> dict:
    return {r.request.id: r for r in result.records}
