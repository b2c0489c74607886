"""What the engine shows a policy each iteration, what the policy answers, what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .request import Request, RequestStatus

if TYPE_CHECKING:  # pragma: no cover
    from .queue import WaitingQueue


@dataclass(slots=True)
class MemoryState:
    """The device page pool and the host pool, as numbers (the scheduler never sees pages).

    ``total_pages``/``free_pages`` count device pages usable for request state;
    ``host_free_pages`` counts free pages in the host pool (offload target);
    ``page_bytes`` is the size of one page.
    """

    total_pages: int
    free_pages: int
    page_bytes: int
    host_free_pages: int


@dataclass(slots=True, frozen=True)
class PendingDecode:
    """A finished request whose decode runs tile by tile on the step loop (``decode="tiled"``):
    ``tiles_left`` of its ``tiles`` still to run. Such a tile runs instead of a planned step
    due later than the decode, while the decode can still meet its deadline
    (``decode_lane.TiledDecodes``), so it takes device time the plan does not show."""

    request: Request
    tiles_left: int
    tiles: int


@dataclass(slots=True)
class SchedulerView:
    """A snapshot of the engine, the only thing a policy may read (besides its cost model).

    ``active`` lists started requests (running or paused, on device or host) in the order the
    engine admitted them; ``waiting`` holds requests that have arrived but not started;
    ``last_batch`` the ids that advanced in the previous iteration (to count preemptions);
    ``max_active`` the most started requests the engine holds at once (None: no limit) —
    policies never admit beyond it; ``preemption`` is ``"step"`` (requests pause only between
    steps) or ``"block"`` (a step runs in chunks of blocks, and a batch may pause between
    chunks: its members then show ``blocks_done > 0`` and a ``step_group``); ``decodes`` the
    tiled decodes still pending, earliest deadline first (empty for other decode modes).
    """

    active: list[RequestStatus]
    waiting: WaitingQueue
    memory: MemoryState
    last_batch: tuple[str, ...] = ()
    max_active: int | None = None
    preemption: str = "step"
    decodes: tuple[PendingDecode, ...] = ()


@dataclass(slots=True)
class StepPlan:
    """One iteration's decision.

    The engine executes it in this order:
    1. ``offload`` — active ids moved device → host (their device pages free once copied);
    2. ``restore`` — ids on the host brought back into free device pages;
    3. ``admit`` — waiting ids started: pages allocated, prompt encoded;
    4. ``batch`` — ids (same model, all on device after 1–3) that advance one denoising step
       together, as one packed forward; a request whose last step this is, is decoded and
       finished right after the step.
    ``pause`` lists ids that advanced in the previous iteration and do not now (preempted);
    it is informational (anything not in ``batch`` simply waits). An empty ``batch`` with
    nothing else means "nothing to run": call again after the next arrival.
    ``blocks`` (block-level preemption only): transformer blocks of the step to run now
    (None: the policy's ``chunk_blocks`` choice); a batch whose step is part-done must be
    exactly that step's ``step_group`` and continues from its ``blocks_done``; a part-done
    batch left out of ``batch`` is parked (its activations go to pages, then to the host).
    ``late_tiles_s``: seconds of late decode tiles the plan spares (``decode_lane``).
    ``first_decodes``: members of ``batch`` whose decode, if this is their last step, goes
    first where decodes run tile by tile between steps: its tiles run before any later
    plan's step unless that plan holds them (a promise made for the request's whole
    remaining work, ``policies.tail_lane``, counts on it; until session 20 they ran whole,
    right after the step, and a short request arriving meanwhile waited for all of them);
    nothing changes where decodes run inline anyway. ``hold_tiles``: run this plan before
    any pending decode tile (the loop otherwise lets a due or first-going tile go first).
    ``yield_s``: seconds a first-going decode may yield to an on-time decode that would
    miss behind its remaining tiles (``decode_lane.TiledDecodes.pick``; 0: none).
    """

    batch: list[str] = field(default_factory=list)
    admit: list[str] = field(default_factory=list)
    offload: list[str] = field(default_factory=list)
    restore: list[str] = field(default_factory=list)
    pause: list[str] = field(default_factory=list)
    blocks: int | None = None
    late_tiles_s: float = 0.0
    first_decodes: tuple[str, ...] = ()
    hold_tiles: bool = False
    yield_s: float = 0.0

    @property
    def idle(self) -> bool:
        return not (self.batch or self.admit or self.offload or self.restore)


@dataclass(slots=True)
class StepReport:
    """What the engine measured for one executed plan (fed to ``policy.observe``).

    ``model`` and ``tokens`` (image/video tokens per batch member, in ``batch`` order) describe
    the denoising step; ``step_s`` is its wall time, excluding encode/decode/transfers, which
    are reported separately (seconds, summed over the requests concerned); ``blocks`` is the
    number of transformer blocks that ran when the step ran in chunks (None: a whole step).
    ``encoded`` and ``decoded`` are the requests whose encode and decode ``encode_s`` and
    ``decode_s`` timed, ``transfer_bytes`` the bytes ``transfer_s`` moved (what the cost
    model's per-kind corrections compare against; empty/0: that time is not attributed).
    """

    now: float
    batch: list[str]
    model: str
    tokens: list[int]
    step_s: float
    encode_s: float = 0.0
    decode_s: float = 0.0
    transfer_s: float = 0.0
    finished: list[str] = field(default_factory=list)
    blocks: int | None = None
    encoded: list[Request] = field(default_factory=list)
    decoded: list[Request] = field(default_factory=list)
    transfer_bytes: float = 0.0
