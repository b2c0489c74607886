"""The one-device demo's parallel mode: collecting the replay processes' messages."""

import queue

import pytest

from ditmem.tools.demo_runs import _collect


class Proc:
    def __init__(self, name, exitcode):
        self.name, self.exitcode, self.terminated = name, exitcode, False

    def is_alive(self):
        return self.exitcode is None

    def terminate(self):
        self.terminated = True


def test_messages_are_collected_by_name():
    q = queue.Queue()
    q.put(("profile", "fifo", {"a": 1}))
    q.put(("profile", "slo", {"a": 2}))
    assert dict(_collect(q, [Proc("p1", None), Proc("p2", None)], 2)) == {
        "fifo": {"a": 1}, "slo": {"a": 2}}


def test_a_replay_process_that_dies_is_an_error_not_a_hang():
    q = queue.Queue()
    q.put(("profile", "fifo", {}))
    alive, dead = Proc("fifo-process", None), Proc("slo-process", 1)
    with pytest.raises(RuntimeError, match="slo-process \\(exit code 1\\) died"):
        _collect(q, [alive, dead], 2)
    assert alive.terminated
