"""Run a function on N gloo ranks (spawned processes), bounded in time, for the
sequence-parallel tests."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback

import torch


def _plain(value):
    """Tensors as numpy arrays (pickled by value: a torch tensor would travel as a shared
    memory handle that dies with this process)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _entry(target, rank, world, port, args, results):
    from ditmem.parallel.groups import close_node, init_node

    torch.set_num_threads(1)
    try:
        groups = init_node(rank, world, port)
        results.put((rank, "ok", _plain(target(rank, groups, *args))))
    except BaseException:  # report any failure to the parent instead of hanging it
        results.put((rank, "error", traceback.format_exc()))
    finally:
        close_node()


def run_ranks(target, world: int = 2, args: tuple = (), timeout_s: float = 240.0) -> list:
    """``target(rank, groups, *args)`` on ``world`` ranks; returns their results by rank
    (tensors come back as numpy arrays).
    Fails (AssertionError with the rank's traceback) on an error or after ``timeout_s``."""
    from ditmem.parallel.groups import free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(target, r, world, port, args, results),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world):
            try:
                rank, status, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"ranks did not finish within {timeout_s} s") from None
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]
