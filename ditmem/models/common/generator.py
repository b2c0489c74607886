"""The step-decomposed generator protocol the engine codes against.

A generator turns a :class:`~ditmem.models.common.request.GenerationRequest` into an image (or
video) in three stages the engine can schedule separately:

1. ``encode(request, pool)`` — once per request: text encoder (cond, and uncond when CFG
   runs), initial latents from the request's seed exactly as the stock pipeline draws them,
   the solver's sigma schedule. Everything the request carries between steps goes into
   pages of ``pool`` as a ``ditmem.memory.RequestState``. Returns ``None`` when the pool has
   no room (nothing is left allocated); the engine decides who yields.
2. ``step(states)`` — any number of times: ONE packed transformer forward over all the
   given requests (CFG branches are extra segments; resolutions, text lengths and timesteps
   may all differ), then each request's own solver update; results are written back into
   the request's pages. A state whose pages are offloaded must be restored first.
3. ``decode(state)`` — once, when ``is_done(state)``: VAE decode to ``uint8 [H, W, 3]``
   (images) or ``uint8 [F, H, W, 3]`` (video).

``release(state)`` frees a state's pages (after decode, or to drop a request).
``estimate_pages(request, page_bytes)`` is pure arithmetic (no torch work) so admission can
be decided before any allocation. ``reference(request)`` runs the stock diffusers
pipeline's own ``__call__`` for the same inputs and seed: the equivalence oracle.

Optional, for preemption inside a step (Qwen-Image and Wan have it): ``num_blocks``
(transformer blocks per step), ``block(state)`` (next block of the current step, 0 between
steps), ``step_blocks(states, stop) -> bool`` (run blocks ``block .. stop-1`` for states all
at the same block; the block-boundary activations go into the states' pages; ``False`` and
nothing changed when a pool has no room for them), the same split in three for a step kept
open between chunks (``open_step(states) -> OpenStep``, ``advance(step, stop) -> bool``,
``save_boundary(step)``: see :mod:`ditmem.models.common.open_step`) and
``boundary_pages(request, page_bytes)`` (extra pages held while paused inside a step).
``step(states)`` finishes a step from wherever the states are.

A full ``encode -> step* -> decode`` run equals ``reference`` (see each model module for
the documented tolerance), and offloading a state to host between steps and restoring it
into other pages leaves the result bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from ditmem.memory import PagePool, RequestState
    from ditmem.models.common.request import GenerationRequest


@runtime_checkable
class Generator(Protocol):
    """What ``ditmem.models.load(...)`` returns. Attributes: ``name`` (str), ``device``,
    ``dtype`` (torch), ``adapter`` (the patched transformer's adapter)."""

    name: str

    def estimate_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Pages of ``page_bytes`` the request's state needs (exact for this generator)."""
        ...

    def encode(self, request: GenerationRequest, pool: PagePool) -> RequestState | None:
        """Encode the prompt(s) and draw initial latents into pages; ``None`` if no room."""
        ...

    def step(self, states: list[RequestState]) -> None:
        """Advance every state by one denoising step with one packed forward."""
        ...

    def is_done(self, state: RequestState) -> bool:
        """True when all the request's denoising steps have run."""
        ...

    def progress(self, state: RequestState) -> tuple[int, int]:
        """(steps done, steps total)."""
        ...

    def decode(self, state: RequestState) -> np.ndarray:
        """VAE-decode a finished state: ``uint8 [H, W, 3]`` or ``uint8 [F, H, W, 3]``."""
        ...

    def release(self, state: RequestState) -> None:
        """Free all pages of the state (idempotent per state)."""
        ...

    def reference(self, request: GenerationRequest) -> np.ndarray:
        """The stock pipeline's own output for the same request and seed."""
        ...


def check_generator(obj: Any) -> Generator:
    """Return ``obj`` if it implements :class:`Generator`, else raise ``TypeError`` naming
    the missing methods."""
    names = ("estimate_pages", "encode", "step", "is_done", "progress", "decode", "release",
             "reference")
    missing = [n for n in names if not callable(getattr(obj, n, None))]
    if missing:
        raise TypeError(f"{type(obj).__name__} is not a Generator: missing {', '.join(missing)}")
    return obj


# Bookkeeping the Qwen-Image and Wan generators share (block counters live in
# ``state.scalars["block"]``).


def check_step_states(states: list[RequestState], is_done: Callable[[RequestState], bool]
                      ) -> None:
    """ValueError unless ``states`` is non-empty, without repeats, none finished
    (``is_done``) and all on the device."""
    if not states:
        raise ValueError("step: states is empty")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("step: the same state appears twice")
    for i, s in enumerate(states):
        if is_done(s):
            raise ValueError(f"step: states[{i}] ({s.request_id}) has already finished")
        if s.location != "device":
            raise ValueError(f"step: states[{i}] ({s.request_id}) is {s.location}; restore "
                             "it to the device first")


def common_block(states: list[RequestState], num_blocks: int) -> int:
    """The block all ``states`` are at; ValueError when they differ (or it is not inside
    ``[0, num_blocks)``)."""
    start = states[0].scalars["block"]
    if any(s.scalars["block"] != start for s in states):
        blocks = [s.scalars["block"] for s in states]
        raise ValueError(f"step_blocks: states are at different blocks {blocks}")
    if not 0 <= start < num_blocks:
        raise ValueError(f"step_blocks: block {start} is not in [0, {num_blocks})")
    return start


def check_block_range(states: list[RequestState], stop: int, num_blocks: int) -> int:
    """The block all ``states`` are at (``start``); ValueError when they differ or
    ``stop`` is not in ``(start, num_blocks]``."""
    start = common_block(states, num_blocks)
    if not start < stop <= num_blocks:
        raise ValueError(f"step_blocks: stop={stop} not in ({start}, {num_blocks}]")
    return start


def check_finished(state: RequestState, progress: tuple[int, int]) -> None:
    """ValueError for ``decode`` unless ``progress`` (steps done, total) shows all steps
    run."""
    done, total = progress
    if done < total:
        raise ValueError(f"decode: state {state.request_id} has run {done} of {total} steps")
