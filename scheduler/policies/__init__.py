"""Scheduling policies and the registry ``make_policy(name, cost, **options)``."""

from __future__ import annotations

from ..cost import CostModel
from .base import Policy
from .fifo import FifoPolicy
from .slo import SloPolicy
from .srtf import SrtfPolicy

POLICIES: dict[str, type[Policy]] = {
    "fifo": FifoPolicy,
    "srtf": SrtfPolicy,
    "slo": SloPolicy,
}


def make_policy(name: str, cost: CostModel, **options) -> Policy:
    """A fresh policy instance by name ("fifo", "srtf", "slo"); options go to its constructor."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return cls(cost, **options)


__all__ = ["POLICIES", "FifoPolicy", "Policy", "SloPolicy", "SrtfPolicy", "make_policy"]
