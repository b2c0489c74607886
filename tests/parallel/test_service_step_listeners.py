"""The node service's step listeners (``/metrics``' step histogram) get each job's steps once,
although a job hands its devices and decodes back in several events (``EngineDevices``:
stepped, one per decode, last), every one carrying the job's ``Timings``."""

from __future__ import annotations

from types import SimpleNamespace

from ditmem.parallel.serving import _Listened
from ditmem.scheduler import Request
from ditmem.scheduler.node.device import Completion, Job, Timings
from ditmem.scheduler.node.topology import Node


class Scripted:
    def __init__(self, events):
        self.events = list(events)

    def launch(self, job, now):
        pass

    def wait(self, until):
        return [self.events.pop(0)] if self.events else []


def test_a_job_in_several_events_reports_its_steps_once():
    pair = Node(2).groups(2)[0]
    a, b = (Request(r, 0.0, width=64, height=64, steps=4) for r in "ab")
    decoding = Job(0, pair, [a, b], 4, [], [], [a, b])
    plain = Job(1, pair, [a], 2)  # no decode: reported in one event
    t, u = Timings(step_s=2.0), Timings(step_s=0.5)
    events = [Completion(decoding, 0.0, 2.1, t, (), (), True, last=False),
              Completion(decoding, 0.0, 2.5, t, (0,), ("a",), last=False),
              Completion(decoding, 0.0, 2.6, t, (1,), ("b",), last=False),
              Completion(decoding, 0.0, 2.6, t),
              Completion(plain, 3.0, 3.5, u)]
    seen = []
    listener = SimpleNamespace(on_step=lambda s, n: seen.append((s, n)))
    devices = _Listened(SimpleNamespace(devices=Scripted(events), _listeners=[listener]))
    for _ in events:
        devices.wait(None)
    assert seen == [(0.5, 2)] * 4 + [(0.25, 1)] * 2


def test_the_service_devices_pass_a_take_back_through():
    """``ditmem serve`` runs node ``slo`` (split decodes that yield: on by default) on
    ``_Listened``: a spare the loop takes back reaches the devices, the run is the bare
    devices' one, where the 256² ends sooner than with split alone."""
    from node_cases import take_back_run

    def listened(devices):
        return _Listened(SimpleNamespace(devices=devices, _listeners=[]))

    bare = take_back_run(lambda d: d, split_yield=True)
    assert bare["small"] < take_back_run(lambda d: d, split_yield=False)["small"] - 1e-3
    assert take_back_run(listened, split_yield=True) == bare
