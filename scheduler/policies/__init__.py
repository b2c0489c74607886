"""Scheduling policies and the registry ``make_policy(name, cost, **options)``."""

from __future__ import annotations

import inspect

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


def check_options(name: str, cls: type, options: dict, positional: int = 1) -> None:
    """ValueError naming any option ``cls``'s constructor does not take (the first
    ``positional`` parameters after ``self`` are not options)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1 + positional:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    known = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"policy {name!r}: unknown option(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(known) or 'none'}")


def make_policy(name: str, cost: CostModel, **options) -> Policy:
    """A fresh policy instance by name ("fifo", "srtf", "slo"); options go to its constructor
    (ValueError naming an option it does not take)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    check_options(name, cls, options)
    return cls(cost, **options)


__all__ = ["POLICIES", "FifoPolicy", "Policy", "SloPolicy", "SrtfPolicy", "check_options",
           "make_policy"]
