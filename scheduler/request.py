"""The request records the scheduler reasons about: what was asked, and how far it got."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

#: Scheduling weight of each priority class (0 high, 1 normal, 2 low): 3:2:1.
PRIORITY_WEIGHTS: dict[int, int] = {0: 3, 1: 2, 2: 1}


@dataclass(slots=True)
class Request:
    """One generation request, as submitted (immutable once queued).

    Times are seconds on the engine's clock (``arrival`` and ``deadline`` share it).
    ``deadline`` and ``standalone_s`` are filled by :meth:`CostModel.assign_deadline`
    (``slo_ms`` when given, else ``slo_scale ×`` the standalone estimate); a request must
    have a deadline before it enters a :class:`~ditmem.scheduler.queue.WaitingQueue`.
    """

    id: str
    arrival: float
    model: str = "qwen-image"
    width: int = 1024
    height: int = 1024
    frames: int = 1
    steps: int = 28
    priority: int = 1
    slo_ms: float | None = None
    prompt: str = ""
    seed: int | None = None
    deadline: float | None = None
    standalone_s: float | None = None

    def __post_init__(self) -> None:
        if self.priority not in PRIORITY_WEIGHTS:
            raise ValueError(
                f"request {self.id!r}: priority must be 0, 1 or 2, got {self.priority}"
            )
        for name in ("width", "height", "frames", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"request {self.id!r}: {name} must be a positive int, got {value!r}"
                )
        if self.slo_ms is not None and self.slo_ms <= 0:
            raise ValueError(f"request {self.id!r}: slo_ms must be > 0, got {self.slo_ms}")

    @property
    def weight(self) -> int:
        """Scheduling weight of the request's priority class (3, 2 or 1)."""
        return PRIORITY_WEIGHTS[self.priority]

    def resubmitted(self, arrival: float, request_id: str | None = None) -> Request:
        """A copy as if submitted anew: same shape, steps, priority, SLO, prompt and seed;
        a new ``arrival`` (and id when given); no deadline yet (assign one before queueing)."""
        return replace(
            self,
            id=self.id if request_id is None else request_id,
            arrival=arrival,
            deadline=None,
            standalone_s=None,
        )


class Location(str, Enum):
    """Where a started request's state (latents, embeddings, caches) lives."""

    DEVICE = "device"
    HOST = "host"


@dataclass(slots=True)
class RequestStatus:
    """A started request (encoded, holding state in pages) as the engine reports it.

    ``steps_done`` counts completed denoising steps (0 … ``request.steps``); ``pages`` is the
    number of pages its state occupies (on the device when ``location`` is DEVICE, in the host
    pool when HOST). A request leaves the engine's active set in the iteration of its last
    step (it is decoded right after that step). With block-level preemption, ``blocks_done``
    counts the transformer blocks of the current step already run (0 between steps),
    ``step_group`` names the ids whose packed step it shares (they continue together), and
    ``activations`` says where its parked block-boundary activations are (None: none parked).
    """

    request: Request
    steps_done: int = 0
    location: Location = Location.DEVICE
    pages: int = 0
    started_at: float | None = None
    preemptions: int = 0
    extra: dict = field(default_factory=dict)
    blocks_done: int = 0
    step_group: tuple[str, ...] = ()
    activations: Location | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def steps_left(self) -> int:
        return self.request.steps - self.steps_done
