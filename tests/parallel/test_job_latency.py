"""A job's fixed cost on the node engine (ditmem.parallel.job_latency), measured on a
2-device CPU NodeEngine (worker processes, gloo) through EngineDevices as the loop runs."""

from __future__ import annotations

import pytest
from node_cases import pages as _pages
from node_cases import tiny_node

from ditmem.parallel.job_latency import add_job_latency, measure_job_latency
from ditmem.scheduler.node.speedup import parse_links

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def node():  # this module's own engine
    yield from tiny_node()


def test_job_latency_is_the_span_beyond_the_workers_stages(node):
    m = measure_job_latency(node, repeats=5, device=1)
    assert m["jobs"] == len(m["gaps_s"]) == 5
    assert all(g >= 0 for g in m["gaps_s"])
    assert 0 < m["stages_s"] < m["span_s"] < 1.0
    assert 0 < m["job_latency_s"] < m["span_s"]
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}  # the probe is gone


def test_add_job_latency_writes_a_valid_links_field(node):
    links = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 1e9, "source": "test"}
    lines: list[str] = []
    m = add_job_latency(node, links, lines.append, repeats=3)
    assert links["job_latency_s"] == m["job_latency_s"]
    assert links["job_latency_measured"]["jobs"] == 3
    assert parse_links({"name": "t", "links": links}).job_latency_s == m["job_latency_s"]
    assert len(lines) == 1 and lines[0].startswith("job latency: ")
    with pytest.raises(ValueError, match="repeats"):
        measure_job_latency(node, repeats=0)
    with pytest.raises(ValueError, match="device"):
        measure_job_latency(node, device=2)
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}
