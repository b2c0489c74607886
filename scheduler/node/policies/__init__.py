"""Node policies and the registry ``make_node_policy(name, ncost, node, **options)``."""

from __future__ import annotations

from ...policies import check_options
from ..cost import NodeCost
from ..topology import Node
from .base import NodePolicy, Placer, best_group
from .baselines import ElasticNp, StaticFifo, StaticSrtf
from .slo import NodeSloPolicy

NODE_POLICIES: dict[str, type[NodePolicy]] = {
    "fifo": StaticFifo,
    "srtf": StaticSrtf,
    "elastic-np": ElasticNp,
    "slo": NodeSloPolicy,
}
#: Policies that run on static replicas of a fixed degree (``baseline_degree``).
STATIC = ("fifo", "srtf")


def make_node_policy(
    name: str, ncost: NodeCost, node: Node, *, baseline_degree: int = 1, **options
) -> NodePolicy:
    """A fresh node policy by name; ``baseline_degree`` applies to the static baselines."""
    cls = NODE_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown node policy {name!r}; choose from {', '.join(NODE_POLICIES)}")
    check_options(name, cls, options, positional=2)
    if name in STATIC:
        node.groups(baseline_degree)  # validates the degree against the node
        return cls(ncost, node, baseline_degree=baseline_degree, **options)
    return cls(ncost, node, **options)


__all__ = [
    "NODE_POLICIES",
    "STATIC",
    "ElasticNp",
    "NodePolicy",
    "NodeSloPolicy",
    "Placer",
    "StaticFifo",
    "StaticSrtf",
    "best_group",
    "make_node_policy",
]
