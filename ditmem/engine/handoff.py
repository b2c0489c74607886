"""Handing a parked request from one engine to another: export it as one self-contained
blob, adopt the blob into another engine, where it resumes at the step it left.

A request is *parked* when it is started (encoded, its state in pages), between two
denoising steps (``scalars["block"] == 0``: no open step) and not running. Between two
iterations of the engine loop every started request that is not decoding is parked.

Export (:func:`export_parked`, on the engine thread): a state still in device pages is
first offloaded through the engine's host pool (the copy any preemption makes), then the
bytes of its host pages are read out — per tensor, page after page, the bytes of data each
page holds (``rows_per_page`` rows; the last page its rest), so neither padding nor an
earlier tenant's bytes leave — into one ``uint8`` buffer, with the ``RequestState`` layout
(name, shape, rows, row shape, dtype, pages of each tensor), its scalars (solver state,
schedule, step), the progress, the timing so far and the request record with its arrival
and deadline as ages (seconds before the export; clocks of two engines share no origin,
the wall clock of the export adds the time in transit). The request then leaves the engine:
its pages are freed and its ticket's future raises :class:`RequestMoved`.

Adopt (:func:`adopt_blob`, on the engine thread): the blob's pages are written verbatim into
fresh pages of this engine's host pool, so its page size must be the exporter's; the request
enters the active set as paused on the host (``Location.HOST``, ``steps_done`` as exported):
the policy restores it like any offloaded request, and the rest of the run is the run the
exporter would have made. Its deadline is the original one. Returns a new :class:`Ticket`.

:class:`Handoff` is the thread-safe front (``engine.handoff``): :meth:`Handoff.export` and
:meth:`Handoff.adopt` queue the work and wait; the engine loop calls :meth:`Handoff.serve`
at the top of each iteration, so nothing runs while a step, offload or restore is under way.
"""

from __future__ import annotations

import copy
import hashlib
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from ditmem.engine.jobs import Job, Phase
from ditmem.engine.results import Ticket
from ditmem.engine.timing import Timing
from ditmem.memory import PagedTensor, RequestState, rows_per_page
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import Location, Request, RequestStatus

#: layout version of :class:`ParkedBlob`; an adopter refuses any other
BLOB_VERSION = 1
#: the timing fields a blob carries over
_TIMING = ("running_s", "encode_s", "decode_s", "offload_s", "steps_run", "preemptions",
           "offloads")


class RequestMoved(Exception):  # noqa: N818 - an outcome, like RequestCancelled
    """Set on a request's future when the request left this engine for another (exported:
    its blob carries it on; the adopter's ticket gets the result)."""


class HandoffRefused(Exception):
    """This engine cannot export or adopt that request now (not parked, no room, the id is
    already live, the engine is stopping); nothing changed."""


class BadBlob(ValueError):
    """A blob this engine cannot adopt: malformed, truncated or corrupted, of another model,
    dtype, page size or layout version. ``field`` names the offending part."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(slots=True)
class TensorLayout:
    """One tensor of a ``RequestState``: ``shape`` as ``get`` returns it, stored as ``rows``
    of ``row_shape`` ``dtype`` in ``pages`` pages; ``nbytes`` bytes of data in the blob."""

    name: str
    shape: tuple[int, ...]
    rows: int
    row_shape: tuple[int, ...]
    dtype: str
    pages: int
    nbytes: int


@dataclass(slots=True)
class ParkedBlob:
    """A parked request, self-contained. ``data``: ``uint8 [sum(t.nbytes)]``, the tensors'
    page bytes in ``tensors`` order; ``digest``: BLAKE2b of ``data``. Times: ``age_s``
    (since arrival), ``deadline_in_s`` (to the deadline; negative when late) and
    ``started_age_s`` are seconds before ``exported_at`` (wall clock, ``time.time()``)."""

    version: int
    generator: str
    model: str
    dtype: str
    page_bytes: int
    request: GenerationRequest
    priority: int
    slo_ms: float | None
    window_ms: float
    standalone_s: float
    age_s: float
    deadline_in_s: float
    started_age_s: float
    exported_at: float
    steps_done: int
    pages_needed: int
    peak_pages: int
    scalars: dict
    tensors: list[TensorLayout]
    data: np.ndarray
    digest: str
    timing: dict = field(default_factory=dict)
    source: str = ""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_pages(self) -> int:
        return sum(t.pages for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def _digest(data: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(data)), digest_size=16).hexdigest()


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise BadBlob(f"tensors: unknown dtype {name!r}", "tensors")
    return value


# ---------------------------------------------------------------------- export
def export_parked(engine, request_id: str, source: str = "") -> ParkedBlob:
    """Export parked ``request_id`` from ``engine`` and remove it (engine thread only).
    Raises :class:`HandoffRefused` (nothing changed) when it is not parked there or the
    host pool has no room to offload it."""
    ex = engine.executor
    job = ex.active.get(request_id)
    if job is None or job.status is None or job.state is None:
        with engine.intake.lock:
            live = engine.intake.live.get(request_id)
        where = ("queued: not started" if live is not None and live.phase is Phase.WAITING
                 else "decoding, finished or unknown")
        raise HandoffRefused(f"{request_id}: not a parked request of this engine ({where})")
    state = job.state
    if job.status.blocks_done or state.scalars.get("block", 0):
        raise HandoffRefused(f"{request_id}: paused inside a step (block "
                             f"{state.scalars.get('block')}); only whole steps move")
    if ex.blocks is not None and any(request_id in g for g in ex.blocks.parked):
        raise HandoffRefused(f"{request_id}: its part-done step is parked")
    if state.location == "device":
        _offload(engine, job)
    if state.location != "host":
        raise HandoffRefused(f"{request_id}: its pages are {state.location}, not on the host")
    layouts, parts = [], []
    for name in state.names():
        t = state.paged(name)
        rows = t.read()  # from the host pages, [rows, *row_shape] on the CPU
        raw = rows.contiguous().reshape(-1).view(torch.uint8)
        layouts.append(TensorLayout(name, tuple(state.shape(name)), t.rows, tuple(t.row_shape),
                                    str(t.dtype).removeprefix("torch."), t.num_pages,
                                    int(raw.numel())))
        parts.append(raw)
    data = (torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)).numpy()
    now, wall = engine.clock(), time.time()
    sched, timing = job.sched, job.timing
    blob = ParkedBlob(
        version=BLOB_VERSION, generator=str(engine.gen.name), model=engine.model,
        dtype=str(engine.gen.dtype).removeprefix("torch."), page_bytes=engine.pool.page_bytes,
        request=copy.copy(job.gen), priority=sched.priority, slo_ms=sched.slo_ms,
        window_ms=float(job.ticket.slo_ms), standalone_s=float(sched.standalone_s or 0.0),
        age_s=now - sched.arrival, deadline_in_s=sched.deadline - now,
        started_age_s=now - (timing.started if timing.started is not None else now),
        exported_at=wall, steps_done=int(job.status.steps_done),
        pages_needed=job.pages_needed,
        peak_pages=max(job.peak_pages, job.pages_needed, int(state.num_pages)),
        scalars=copy.deepcopy(state.scalars), tensors=layouts, data=data,
        digest=_digest(data), timing={k: getattr(timing, k) for k in _TIMING}, source=source)
    _remove(engine, job)
    return blob


def _offload(engine, job: Job) -> None:
    """Move a paused job's device pages to the host, as a preemption does."""
    from ditmem.memory import HostPoolExhausted

    ex = engine.executor
    try:
        handle = ex.stages.start_offload(job)
    except HostPoolExhausted as exc:
        raise HandoffRefused(f"{job.id}: no room in the host pool to move it ({exc})") from None
    ex.stats.bytes_offloaded += ex.stages.finish_offload(job, handle)
    job.status.location = Location.HOST
    job.timing.offloads += 1


def _remove(engine, job: Job) -> None:
    """The job leaves this engine: pages freed, ticket told, nothing counted as done."""
    ex = engine.executor
    steps = job.status.steps_done
    if ex.blocks is not None:
        ex.blocks.forget(job)
    ex.stages.release(job)
    ex.active.pop(job.id, None)
    ex.last_batch = tuple(i for i in ex.last_batch if i != job.id)
    job.phase = Phase.DONE
    job.timing.finished = engine.clock()
    engine.intake.forget(job, started=True)
    if engine._exact is not None:
        engine._exact.forget(job.id)
    job.ticket.future.set_exception(RequestMoved(
        f"{job.id}: handed off to another engine after {steps} of {job.sched.steps} steps"))
    ex.publish()


# ---------------------------------------------------------------------- adopt
def check_blob(engine, blob) -> None:
    """:class:`BadBlob` unless ``engine`` can adopt ``blob`` (pure checks, any thread)."""
    if not isinstance(blob, ParkedBlob):
        raise BadBlob(f"blob: expected a ParkedBlob, got {type(blob).__name__}", "blob")
    if blob.version != BLOB_VERSION:
        raise BadBlob(f"version: blob layout {blob.version}, this engine reads "
                      f"{BLOB_VERSION}", "version")
    mine = (str(engine.gen.name), engine.model, str(engine.gen.dtype).removeprefix("torch."))
    theirs = (blob.generator, blob.model, blob.dtype)
    if theirs != mine:
        raise BadBlob(f"model: the blob is a {'/'.join(map(str, theirs))} request, this "
                      f"engine serves {'/'.join(mine)}", "model")
    if blob.page_bytes != engine.pool.page_bytes:
        raise BadBlob(f"page_bytes: the blob's pages are {blob.page_bytes} bytes, this "
                      f"engine's {engine.pool.page_bytes} (pages are adopted as they are: "
                      "run both engines with the same --page-kb)", "page_bytes")
    request = blob.request
    if not isinstance(request, GenerationRequest) or not request.request_id:
        raise BadBlob("request: missing or without a request id", "request")
    if not 0 <= blob.steps_done < request.num_inference_steps:
        raise BadBlob(f"steps_done: {blob.steps_done} of {request.num_inference_steps} "
                      "steps: not a parked request", "steps_done")
    data = blob.data
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        raise BadBlob("data: expected a 1-d uint8 array", "data")
    want = 0
    for t in blob.tensors:
        dtype = _dtype(t.dtype)
        elems = math.prod(t.row_shape)
        if (t.rows * elems != math.prod(t.shape)
                or t.nbytes != t.rows * elems * dtype.itemsize):
            raise BadBlob(f"tensors: {t.name!r} layout is inconsistent (shape {t.shape}, "
                          f"{t.rows} rows of {t.row_shape}, {t.nbytes} bytes)", "tensors")
        if t.rows and t.pages != -(-t.rows // rows_per_page(t.row_shape, dtype,
                                                             engine.pool.page_bytes)):
            raise BadBlob(f"tensors: {t.name!r} claims {t.pages} pages", "tensors")
        want += t.nbytes
    if data.nbytes != want:
        raise BadBlob(f"data: {data.nbytes} bytes, the layout needs {want} (truncated?)",
                      "data")
    if _digest(data) != blob.digest:
        raise BadBlob("data: the digest does not match (corrupted in transit)", "data")


def adopt_blob(engine, blob: ParkedBlob) -> Ticket:
    """Enter ``blob``'s request into ``engine`` as paused on the host (engine thread only);
    returns its ticket. :class:`BadBlob` for a blob it cannot read, :class:`HandoffRefused`
    (nothing changed) when it has no room or the id is already live."""
    check_blob(engine, blob)
    ex, intake = engine.executor, engine.intake
    rid = blob.request_id
    if len(ex.active) >= engine.max_active:
        raise HandoffRefused(f"{rid}: {engine.max_active} requests are already started here")
    if not engine.host.can_allocate(blob.num_pages):
        raise HandoffRefused(f"{rid}: needs {blob.num_pages} host pages, "
                             f"{engine.host.num_free_pages} free")
    state = _host_state(engine, blob)
    done, total = engine.gen.progress(state)
    if done != blob.steps_done or engine.gen.is_done(state):
        engine.gen.release(state)
        raise BadBlob(f"scalars: the state is at step {done} of {total}, the blob says "
                      f"{blob.steps_done}", "scalars")
    now = engine.clock()
    transit = max(0.0, time.time() - blob.exported_at)
    g = blob.request
    sched = Request(id=rid, arrival=now - transit - blob.age_s, model=engine.model,
                    width=g.width, height=g.height, frames=g.num_frames,
                    steps=g.num_inference_steps, priority=blob.priority, slo_ms=blob.slo_ms,
                    prompt=g.prompt, seed=g.seed, deadline=now - transit + blob.deadline_in_s,
                    standalone_s=blob.standalone_s)
    timing = Timing(arrival=sched.arrival, started=now - transit - blob.started_age_s,
                    **{k: blob.timing.get(k, 0) for k in _TIMING})
    ticket = Ticket(rid, blob.priority, blob.window_ms)
    job = Job(gen=copy.copy(g), sched=sched, ticket=ticket, timing=timing,
              pages_needed=blob.pages_needed, phase=Phase.ACTIVE, state=state,
              status=RequestStatus(request=sched, steps_done=blob.steps_done,
                                   location=Location.HOST, pages=int(state.num_pages),
                                   started_at=timing.started,
                                   preemptions=int(blob.timing.get("preemptions", 0))),
              peak_pages=blob.peak_pages)
    with intake.lock:
        if rid in intake.live:
            duplicate = True
        else:
            duplicate = False
            intake.live[rid] = job
    if duplicate:
        engine.gen.release(state)
        raise HandoffRefused(f"{rid}: a request with this id is already live here")
    if engine._exact is not None:
        engine._exact.register(rid, engine.pool.page_bytes, blob.pages_needed)
    ex.active[rid] = job
    ex.publish()
    return ticket


def _host_state(engine, blob: ParkedBlob) -> RequestState:
    """A ``RequestState`` of ``engine``'s pool whose tensors sit in fresh host pages holding
    the blob's bytes (as if offloaded there)."""
    host = engine.host
    n = host.chunk_pages
    data = torch.from_numpy(np.ascontiguousarray(blob.data))
    state = RequestState(engine.pool, request_id=blob.request_id)
    offset = 0
    try:
        for t in blob.tensors:
            dtype = _dtype(t.dtype)
            pages = host.allocate(t.pages)
            per_page = rows_per_page(t.row_shape, dtype, host.page_bytes) * (
                t.nbytes // t.rows if t.rows else 0)
            left = t.nbytes
            for p in pages:
                k = min(per_page, left)
                host.chunks[p // n][p % n, :k].copy_(data[offset:offset + k])
                offset, left = offset + k, left - k
            paged = PagedTensor(engine.pool, [], t.rows, tuple(t.row_shape), dtype)
            # the state a finished offload leaves (ditmem.memory has no public call for it)
            paged._land_on_host(host, pages)
            _put_host(state, t.name, paged, tuple(t.shape))
    except BaseException:
        engine.gen.release(state)
        raise
    state.scalars.update(copy.deepcopy(blob.scalars))
    return state


def _put_host(state: RequestState, name: str, paged: PagedTensor, shape) -> None:
    """``state.put`` of a host-resident ``PagedTensor`` under ``name`` with the shape
    ``get`` returns (``put`` of a ``PagedTensor`` keeps its row shape)."""
    state.put(name, paged)
    state._entries[name].shape = shape


# ---------------------------------------------------------------------- thread-safe front
class Handoff:
    """``engine.handoff``: export and adopt from any thread; the engine thread runs the
    work at the top of its next iteration (:meth:`serve`). ``exported``/``adopted``:
    requests that left and entered this engine this way."""

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._tasks: list[tuple[object, Future]] = []
        self.exported = 0
        self.adopted = 0

    def export(self, request_id: str, *, source: str = "", timeout: float = 30.0
               ) -> ParkedBlob:
        """Export parked ``request_id`` (:func:`export_parked`); its ticket then raises
        :class:`RequestMoved`. Raises :class:`HandoffRefused` when it cannot."""
        blob = self._call(lambda: export_parked(self.engine, request_id, source), timeout,
                          adopting=False)
        self.exported += 1
        return blob

    def adopt(self, blob: ParkedBlob, *, timeout: float = 30.0) -> Ticket:
        """Adopt ``blob`` (:func:`adopt_blob`): the new ticket of its request. Raises
        :class:`BadBlob` (checked here, off the engine thread) or :class:`HandoffRefused`."""
        check_blob(self.engine, blob)
        ticket = self._call(lambda: adopt_blob(self.engine, blob), timeout, adopting=True)
        self.adopted += 1
        return ticket

    def serve(self) -> None:
        """Run the queued exports and adoptions (engine thread, between iterations)."""
        with self._lock:
            tasks, self._tasks = self._tasks, []
        for fn, future in tasks:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - the caller gets it
                future.set_exception(exc)

    def _call(self, fn, timeout: float, *, adopting: bool):
        engine, intake = self.engine, self.engine.intake
        self._check_running(adopting)
        future: Future = Future()
        with self._lock:
            self._tasks.append((fn, future))
        intake.signal()
        deadline = time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=0.05)
            except TimeoutError:
                pass
            alive = engine._thread.is_alive()
            if (time.monotonic() > deadline or not alive) and future.cancel():
                with self._lock:
                    self._tasks = [t for t in self._tasks if t[1] is not future]
                why = f"within {timeout:g} s" if alive else "it stopped"
                raise HandoffRefused(f"the engine thread did not get to it ({why})")

    def _check_running(self, adopting: bool) -> None:
        intake = self.engine.intake
        if self.engine._thread is None:
            raise HandoffRefused("the engine is not started")
        if intake.dead is not None or intake.stopping:
            raise HandoffRefused("the engine is stopping or dead")
        if adopting and intake.draining:
            raise HandoffRefused("the engine is draining and takes no new requests")
