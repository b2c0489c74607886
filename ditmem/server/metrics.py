"""Prometheus exposition of the engine's state (``GET /metrics``).

Gauges are read from :meth:`Engine.stats` at scrape time (a custom collector), so they are
never stale; the step-latency histogram is fed by the engine's step listener. Each app owns
its own ``CollectorRegistry`` (no process-global metrics).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PRIORITY_LABELS = ("0", "1", "2")
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class EngineCollector:
    """Turns one ``EngineStats`` snapshot into metric families."""

    def __init__(self, engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        s = self.engine.stats()
        gauges = {
            "ditmem_queue_depth": ("requests waiting to start", s.queued),
            "ditmem_running": ("requests holding device pages", s.running),
            "ditmem_paused": ("preempted requests (device or host)", s.paused),
            "ditmem_offloaded": ("requests whose pages are on the host", s.offloaded),
            "ditmem_pages_used": ("device pool pages in use", s.pages_used),
            "ditmem_engine_dead": ("1 when the engine stopped after a failure it could "
                                   "not survive", int(s.dead is not None)),
            "ditmem_pages_free": ("device pool pages free", s.pages_free),
            "ditmem_host_pages_used": ("host pool pages in use", s.host_pages_used),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        devices = getattr(s, "devices", None)  # a node (ditmem serve --devices N)
        if devices is not None:
            used = GaugeMetricFamily("ditmem_device_pages_used",
                                     "device pool pages in use, per device", labels=["device"])
            alive = GaugeMetricFamily("ditmem_device_alive",
                                      "1 while the device's worker serves, 0 once it is lost",
                                      labels=["device"])
            for d in devices:
                used.add_metric([str(d.device)], d.pages_used)
                alive.add_metric([str(d.device)], int(d.lost is None))
            yield used
            yield alive
        counters = {
            "ditmem_bytes_offloaded": ("bytes moved device->host", s.bytes_offloaded),
            "ditmem_bytes_restored": ("bytes moved host->device", s.bytes_restored),
            "ditmem_preemptions": ("times a running request was paused", s.preemptions),
            "ditmem_steps": ("denoising step batches executed", s.steps),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        done = CounterMetricFamily(
            "ditmem_requests_finished", "finished requests by outcome", labels=["outcome"]
        )
        for outcome in ("completed", "failed", "cancelled", "rejected"):
            done.add_metric([outcome], getattr(s, outcome))
        yield done
        slo = CounterMetricFamily(
            "ditmem_slo", "completed requests by SLO outcome and priority",
            labels=["result", "priority"],
        )
        for p in PRIORITY_LABELS:
            slo.add_metric(["met", p], s.slo_met[int(p)])
            slo.add_metric(["missed", p], s.slo_missed[int(p)])
        yield slo


class GaugeCallbacks:
    """Gauges read from callables at scrape time (server-side state such as the video
    store)."""

    def __init__(self):
        self.gauges: dict[str, tuple[str, object]] = {}

    def describe(self):
        return []

    def collect(self):
        for name, (doc, read) in self.gauges.items():
            yield GaugeMetricFamily(name, doc, value=read())


class ServerMetrics:
    """The registry of one server: engine gauges plus a step-latency histogram."""

    def __init__(self, engine):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine))
        self.callbacks = GaugeCallbacks()
        self.registry.register(self.callbacks)
        self.step_seconds = Histogram(
            "ditmem_step_seconds", "wall time of one packed denoising step",
            buckets=STEP_BUCKETS, registry=self.registry,
        )
        self.request_seconds = Histogram(
            "ditmem_request_seconds", "end-to-end latency of completed requests",
            labelnames=["priority"], buckets=STEP_BUCKETS + (60, 120, 300),
            registry=self.registry,
        )
        engine.add_listener(self)

    def add_gauge(self, name: str, doc: str, read) -> None:
        """A gauge whose value is ``read()`` at each scrape."""
        self.callbacks.gauges[name] = (doc, read)

    def on_step(self, seconds: float, batch_size: int) -> None:
        self.step_seconds.observe(seconds)

    def on_finish(self, result) -> None:
        """Called for completed requests only (failures are counted by the engine)."""
        self.request_seconds.labels(str(result.priority)).observe(result.timing.latency_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
