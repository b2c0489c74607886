"""The side-stream copier's ordering, checked with a recording fake device module (no GPU
here), and the CPU copiers' error propagation."""

import pytest
import torch

from ditmem.memory import copiers


class FakeModule:
    """Records the stream/event calls a StreamCopier makes, in order."""

    def __init__(self):
        self.log = []
        self.current = self.Stream(self, "compute")

    class Stream:
        def __init__(self, mod, name="side", device=None):
            self.mod, self.name = mod, name

        def wait_stream(self, other):
            self.mod.log.append(("wait_stream", self.name, other.name))

        def wait_event(self, ev):
            self.mod.log.append(("wait_event", self.name, ev.id))

        def synchronize(self):
            self.mod.log.append(("stream_sync", self.name))

    class Event:
        count = 0

        def __init__(self, mod, enable_timing=False):
            FakeModule.Event.count += 1
            self.mod, self.id, self.timing = mod, FakeModule.Event.count, enable_timing

        def elapsed_time(self, end):
            assert self.timing and end.timing
            return 2.5  # ms

        def record(self, stream):
            self.mod.log.append(("record", self.id, stream.name))

        def query(self):
            return True

        def synchronize(self):
            self.mod.log.append(("event_sync", self.id))

    def current_stream(self, device):
        return self.current

    def stream(self, s):
        mod = self

        class Ctx:
            def __enter__(self):
                mod.log.append(("enter", s.name))

            def __exit__(self, *exc):
                mod.log.append(("exit", s.name))

        return Ctx()


@pytest.fixture
def fake(monkeypatch):
    mod = FakeModule()
    stream_cls, event_cls = FakeModule.Stream, FakeModule.Event
    mod.Stream = lambda device=None: stream_cls(mod, "side", device)
    mod.Event = lambda enable_timing=False: event_cls(mod, enable_timing)
    monkeypatch.setattr(copiers.torch, "get_device_module", lambda kind: mod)
    return mod


def test_stream_copier_orders_copy_after_compute_and_before_later_use(fake):
    c = copiers.make_copier("auto", torch.device("cuda", 0))
    assert c.name == "stream"
    token = c.start(lambda: fake.log.append(("copy",)))
    begin, ev = token[0].id, token[1].id
    assert fake.log == [("wait_stream", "side", "compute"), ("enter", "side"),
                        ("record", begin, "side"), ("copy",), ("record", ev, "side"),
                        ("exit", "side")]
    fake.log.clear()
    c.wait_device(token)  # restore: the compute stream waits, the host does not
    c.wait_host(token)    # offload/cancel: the host waits for the copy
    assert fake.log == [("wait_event", "compute", ev), ("event_sync", ev)]
    assert c.elapsed(token) == 0.0025  # the copy's own time, from its two events


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_cpu_side_copiers_wait_for_the_stream_on_cuda(fake, mode):
    # copy_blocks issues a non-blocking DMA: the copier must not report it done before the
    # stream it went out on has finished
    c = copiers.make_copier(mode, torch.device("cuda", 0))
    token = c.start(lambda: fake.log.append(("copy",)))
    c.wait_host(token)
    assert fake.log == [("copy",), ("stream_sync", "compute")]
    assert c.elapsed(token) >= 0.0
    c.close()


def test_stream_copier_rejects_cpu():
    with pytest.raises(ValueError, match="cuda or npu"):
        copiers.StreamCopier(torch.device("cpu"))


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_cpu_copiers_propagate_copy_errors(mode):
    c = copiers.make_copier(mode, torch.device("cpu"))

    def boom():
        raise RuntimeError("copy failed")

    with pytest.raises(RuntimeError, match="copy failed"):
        c.wait_host(c.start(boom))
    c.close()
