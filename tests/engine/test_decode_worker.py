"""Decode workers run the earliest deadline first and finish queued work on shutdown."""

from __future__ import annotations

import threading

import pytest

from ditmem.engine.decode_worker import DecodeWorkers


def test_earliest_deadline_first_after_the_running_one():
    gate, started, order = threading.Event(), threading.Event(), []
    workers = DecodeWorkers(1)

    def first():
        started.set()
        gate.wait(10)
        order.append("first")

    workers.submit(100.0, first)
    assert started.wait(10)
    for name, deadline in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("a2", 1.0)]:
        workers.submit(deadline, lambda name=name: order.append(name))
    gate.set()
    workers.shutdown(wait=True)  # queued decodes still run
    assert order == ["first", "a", "a2", "b", "c"]
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(0.0, lambda: None)


def test_rejects_zero_workers():
    with pytest.raises(ValueError, match=">= 1"):
        DecodeWorkers(0)
