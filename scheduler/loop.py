"""The iteration order, written once: offload → restore → admit/encode → step → decode.

Every loop that executes a decision runs it through :func:`run_stages`, against the small
:class:`Stages` interface of whatever executes it:

* the single-device simulator (``ditmem.scheduler.simulator``: virtual pages and a host
  link, durations drawn around the profile),
* the single-device engine (``ditmem.engine.executor``: a real pool, offload engine and
  generator),
* one job of a node's device group, virtual (``ditmem.scheduler.node.device``) or real
  (``ditmem.parallel.devices``).

So the simulator and the engines cannot disagree on what runs before what. What a stage
does with a request it cannot act on is the implementation's: the simulator raises
``PlanError`` (a broken plan is a policy bug), an engine fails or skips that request alone.

Transfers are two-phase: ``start_*`` launches a copy, ``finish_*`` completes it (an
implementation whose copies are synchronous does all the work in ``start_*``). A copy is
completed before the step only when this iteration needs it there: offloads when restores
or admits may want their pages, a restore when its request steps now. The others complete
after the step and its decodes, overlapping them.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Sequence
from typing import Protocol


class Stages(Protocol):
    """One device, or one group of a node's devices, as :func:`run_stages` drives it.
    Requests are named by id."""

    def start_offload(self, rid: str) -> object | None:
        """Launch the copy of ``rid``'s state to the host; its handle (None: nothing to
        finish)."""

    def finish_offload(self, handle: object) -> None:
        """Complete an offload: its device pages are free afterwards."""

    def start_restore(self, rid: str) -> object | None:
        """Launch the copy of ``rid``'s state onto the device(s); its handle (None: nothing
        to finish)."""

    def finish_restore(self, handle: object) -> None:
        """Complete a restore: the state may be read afterwards."""

    def encode(self, rids: Sequence[str]) -> None:
        """Admit waiting requests: encode each into fresh pages."""

    def step(self, rids: Sequence[str], steps: int, blocks: int | None) -> list[str]:
        """Run ``steps`` packed denoising steps of the batch (``blocks``: with block
        preemption, a chunk of that many blocks; None: the policy's choice); called with an
        empty batch too (block preemption parks a part-done step the plan leaves out).
        Returns the ids whose last step ran (to decode)."""

    def decode(self, rids: list[str]) -> None:
        """Decode finished requests (or hand them to the device's decode path)."""


def run_stages(
    stages: Stages,
    *,
    offload: Sequence[str] = (),
    restore: Sequence[str] = (),
    admit: Sequence[str] = (),
    batch: Sequence[str] = (),
    needed: Collection[str] | None = None,
    steps: int = 1,
    blocks: int | None = None,
) -> list[str]:
    """Execute one decision on ``stages`` in the loop's order; returns the ids decoded.

    ``offload``/``restore``/``admit``: ids, in the order their copies and encodes start;
    ``batch``: the ids to step (``steps`` steps, or a chunk of ``blocks``); ``needed``:
    the ids whose restore must complete before the step (default: the batch).
    """
    offloads = []
    for rid in offload:
        handle = stages.start_offload(rid)
        if handle is not None:
            offloads.append(handle)
    early = bool(restore or admit)  # they may need the pages the offloads free
    if early:
        for handle in offloads:
            stages.finish_offload(handle)
    later = []
    if restore:
        needed = set(batch) if needed is None else needed
        for rid in restore:
            handle = stages.start_restore(rid)
            if handle is None:
                continue
            if rid in needed:
                stages.finish_restore(handle)
            else:
                later.append(handle)
    if admit:
        stages.encode(admit)
    finished = stages.step(batch, steps, blocks)  # also with no batch: it parks
    if finished:
        stages.decode(finished)
    if not early:
        for handle in offloads:
            stages.finish_offload(handle)
    for handle in later:
        stages.finish_restore(handle)
    return finished


def preempted(
    last_batch: Sequence[str], stepped: Container[str], started: Container[str]
) -> list[str]:
    """The ids this iteration preempted: they stepped in the last one, are still started,
    and did not step now (what the simulator and the engine count as a preemption)."""
    return [rid for rid in last_batch if rid in started and rid not in stepped]


def mid_step(members: Sequence[object | None]) -> bool:
    """Whether the last iteration's batch (its members' ``RequestStatus``, None for one no
    longer started) is still inside its step: all started, with blocks run (block
    preemption). Such a step continues before a decode tile or another plan runs."""
    return bool(members) and all(s is not None and s.blocks_done > 0 for s in members)
