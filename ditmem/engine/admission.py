"""What every engine checks before it takes a request (one device, a node, a Ray replica's
front): its pages against the pool, the model's shape rules, and the cost model's standalone
estimate against the server's limit; and the scheduler's view of it (``Request``)."""

from __future__ import annotations

import re

from ditmem.engine.results import InvalidRequest, RequestTooLarge, TooSlow
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import Request

_FIELD = re.compile(r"^request\.(\w+):")


def scheduled(request: GenerationRequest, model: str, now: float, priority: int,
              slo_ms: float | None, cost, slo_scale: float) -> Request:
    """The scheduler's record of ``request`` arriving at ``now`` (s), its deadline set by
    ``cost`` (``slo_ms``, else ``slo_scale`` x the standalone estimate)."""
    sched = Request(id=request.request_id, arrival=now, model=model,
                    width=request.width, height=request.height,
                    frames=request.num_frames, steps=request.num_inference_steps,
                    priority=priority, slo_ms=slo_ms, prompt=request.prompt,
                    seed=request.seed)
    cost.assign_deadline(sched, slo_scale)
    return sched


def window_ms(sched: Request) -> float:
    """The SLO window ``sched`` is held to (ms): the client's ``slo_ms`` exactly where it
    gave one (not recomputed from the deadline, which float arithmetic on the arrival
    clock would round), else the cost model's window."""
    if sched.slo_ms is not None:
        return float(sched.slo_ms)
    return 1000.0 * (sched.deadline - sched.arrival)


def pages_needed(gen, request: GenerationRequest, page_bytes: int, pool_pages: int,
                 pool: str = "the pool") -> int:
    """Pages ``request``'s state needs (``gen.estimate_pages``). ``InvalidRequest`` naming
    the field when the model's rules refuse it, ``RequestTooLarge`` when it needs more
    than ``pool_pages`` (``pool`` names that pool in the message)."""
    try:
        need = int(gen.estimate_pages(request, page_bytes))
    except ValueError as exc:
        match = _FIELD.match(str(exc))
        raise InvalidRequest(str(exc).removeprefix("request."),
                             match.group(1) if match else None) from None
    if need > pool_pages:
        raise RequestTooLarge(
            f"size: a {request.width}x{request.height}x{request.num_frames} request needs "
            f"{need} pages of {page_bytes} bytes, {pool} has {pool_pages} (raise "
            "--pool-mb or ask for a smaller size)", "size")
    return need


def check_standalone(sched: Request, max_standalone_s: float | None, where: str) -> None:
    """``TooSlow`` when the standalone estimate is over ``max_standalone_s`` (None: no
    limit); ``where`` says what the estimate is for ("this device", "one device")."""
    if max_standalone_s is not None and sched.standalone_s > max_standalone_s:
        raise TooSlow(f"request: estimated {sched.standalone_s:.1f} s alone on {where} "
                      f"(cost model), over the server's limit of {max_standalone_s:g} s "
                      "(--max-request-s): ask for fewer steps, pixels or frames",
                      sched.standalone_s, max_standalone_s)
