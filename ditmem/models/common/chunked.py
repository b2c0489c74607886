"""A packed denoising step run as chunks of ``k`` transformer blocks, parked between chunks.

Works with any generator that offers preemption inside a step (``num_blocks``,
``block(state)``, ``open_step``/``advance``/``save_boundary``: Qwen-Image and Wan). Between
consecutive chunks of the same requests the step stays **open**: its packed batches live in
memory (:class:`~ditmem.models.common.open_step.OpenStep`), so a chunk boundary with no park costs
nothing but the chunk call. Only a park writes each request's block-boundary activations
(image/video hidden rows, and the text rows of Qwen's dual-stream blocks, per CFG branch)
into its pages — reserved by the first chunk that ended inside the step, so a park never
allocates — as ``boundary.*`` tensors; timestep modulation and RoPE are recomputed from the
state's scalars when the step resumes, so nothing else is needed.

    runner = ChunkRunner(generator, offload_engine)
    runner.run_chunk(states, k)           # blocks block .. block+k-1 (the step stays open)
    parked = runner.park(states)          # boundary written to pages, async offload starts
    ...                                   # other requests compute meanwhile
    runner.resume(parked)                 # restore into any free pages (or cancel the
    runner.run_chunk(states, k)           # offload if it has not finished): continue

Running other requests while a step is open writes the open step's boundary to its pages
first (:meth:`ChunkRunner.flush`), so the runner holds at most one open step and a step
left without a park can still be resumed from pages (by this runner or by the generator's
``step``/``step_blocks``). Only the boundary tensors move: the rest of a parked request's
state stays where it is (the engine offloads it separately under memory pressure). A step
resumed after a park ends bit-identical to an uninterrupted one (tests/models/
test_chunked.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ditmem.memory import OffloadEngine, RequestState, TensorState
from ditmem.models.common.open_step import OpenStep

#: Name prefix of the block-boundary tensors the generators store (``ditmem.memory``).
BOUNDARY_PREFIX = "boundary."


def boundary_names(state: RequestState) -> list[str]:
    """Names of the state's block-boundary tensors (empty between steps)."""
    return [n for n in state.names() if n.startswith(BOUNDARY_PREFIX)]


def boundary_bytes(state: RequestState) -> int:
    """Bytes of the state's block-boundary tensors (what a park moves)."""
    return sum(state.paged(n).nbytes for n in boundary_names(state))


@dataclass(slots=True, eq=False)
class ParkedStep:
    """A part-done step: its states, the block it resumes at, the offload of its boundary
    tensors (``handle``; None once finished or never started) and whether it was resumed."""

    states: list[RequestState]
    block: int
    handle: object | None
    resumed: bool = False

    @property
    def on_host(self) -> bool:
        """Whether the boundary tensors have landed on the host."""
        return self.handle is None and not self.resumed


class ChunkRunner:
    """Runs chunks of a generator's steps and parks part-done steps through ``engine``."""

    def __init__(self, generator, engine: OffloadEngine):
        missing = [n for n in ("num_blocks", "block", "open_step", "advance", "save_boundary")
                   if not hasattr(generator, n)]
        if missing:
            raise TypeError(
                f"{type(generator).__name__} cannot pause inside a step: no {', '.join(missing)}"
            )
        self.generator = generator
        self.engine = engine
        self.open: OpenStep | None = None  # the step kept open between chunks

    @property
    def num_blocks(self) -> int:
        return self.generator.num_blocks

    def run_chunk(self, states: list[RequestState], k: int) -> bool:
        """Run the next ``k`` blocks (fewer at the end of the step) of the states' current
        step, as one packed pass. All states must be at the same block, on the device.
        Continues the open step when ``states`` are its requests; otherwise flushes it and
        opens theirs. Returns ``False`` with nothing changed when the pool has no room for
        the boundary activations (the caller decides who yields)."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"run_chunk: k must be a positive int, got {k!r}")
        if not states:
            raise ValueError("run_chunk: states is empty")
        gen = self.generator
        if self.open is not None and not self.open.continues(states):
            self.flush()
        fresh = self.open is None
        step = gen.open_step(states) if fresh else self.open
        try:
            done = gen.advance(step, min(step.block + k, self.num_blocks))
        except BaseException:
            self.open = None
            raise
        self.open = None if step.finished or not done else step
        if not done and not fresh:  # cannot happen: the open step's pages are reserved
            raise RuntimeError("run_chunk: an open step lost its boundary pages")
        return done

    def flush(self) -> None:
        """Write the open step's boundary rows into its requests' pages and close it (a
        no-op when no step is open)."""
        step, self.open = self.open, None
        if step is not None and not step.finished:
            self.generator.save_boundary(step)

    def park(self, states: list[RequestState]) -> ParkedStep:
        """Write the boundary tensors of a part-done step to its pages (if the step is
        open) and start moving them to the host (asynchronous where the engine's copier
        is); returns the :class:`ParkedStep` to resume later. Raises ``ValueError`` for
        states between steps and ``HostPoolExhausted`` (boundary written, nothing else
        changed) when the host pool is full."""
        block = {self.generator.block(s) for s in states}
        if len(block) != 1 or block == {0}:
            raise ValueError(f"park: states must share one block inside a step, got {block}")
        if self.open is not None and self.open.continues(states):
            self.flush()
        tensors = [s.paged(n) for s in states for n in boundary_names(s)]
        handle = self.engine.start_offload(tensors)
        return ParkedStep(list(states), block.pop(), handle)

    def settle(self, parked: ParkedStep, wait: bool = False) -> bool:
        """Finish the park's offload if it is done (or ``wait``): its device pages free.
        Returns whether the boundary tensors are on the host now."""
        self._check(parked, "settle")
        if parked.handle is not None and (wait or self.engine.ready(parked.handle)):
            self.engine.finish_offload(parked.handle)
            parked.handle = None
        return parked.on_host

    def resume(self, parked: ParkedStep) -> bool:
        """Bring a parked step's boundary tensors back to the device: an offload still in
        flight is cancelled (the data never left its pages); a finished one is restored
        into whatever device pages are free. ``False`` (nothing changed) if no room."""
        self._check(parked, "resume")
        if parked.handle is not None and not self.engine.ready(parked.handle):
            self.engine.cancel(parked.handle)
        else:
            self.settle(parked, wait=True)
            # (the engine may have brought them back already with the rest of a state)
            tensors = [
                t
                for s in parked.states
                for t in (s.paged(n) for n in boundary_names(s))
                if t.state is TensorState.ON_HOST
            ]
            if tensors and not self.engine.restore(tensors):
                return False
        parked.handle = None
        parked.resumed = True
        return True

    def drop(self, parked: ParkedStep) -> None:
        """Forget a parked step without resuming it (a member was cancelled or failed): an
        offload in flight is cancelled so every state can be freed; data stays where it is."""
        if parked.handle is not None:
            self.engine.cancel(parked.handle)
            parked.handle = None
        parked.resumed = True

    @staticmethod
    def _check(parked: ParkedStep, what: str) -> None:
        if parked.resumed:
            raise ValueError(f"{what}: this parked step was already resumed")
