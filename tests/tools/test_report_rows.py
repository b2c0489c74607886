"""``ditmem.tools.report.request_rows``: the per-request rows a demo's JSON carries, checked
on hand-built records (two requests, one met and one late)."""

from ditmem.scheduler.request import Request
from ditmem.scheduler.simulator import Record
from ditmem.tools.report import request_rows


def test_rows_in_arrival_order_with_met_from_the_deadline():
    late = Request("b", arrival=2.0, width=512, height=256, steps=4, priority=0, deadline=5.0)
    early = Request("a", arrival=1.0, width=256, height=256, steps=2, priority=2, deadline=4.0)
    rows = request_rows([Record(late, started=3.0, finished=6.5, preemptions=1, offloads=1),
                         Record(early, started=1.5, finished=3.0, preemptions=0, offloads=0)])
    assert [r["id"] for r in rows] == ["a", "b"]
    assert rows[0] == {"id": "a", "shape": "256x256", "steps": 2, "priority": 2,
                       "arrival_s": 1.0, "started_s": 1.5, "finished_s": 3.0,
                       "deadline_s": 4.0, "latency_s": 2.0, "preemptions": 0, "offloads": 0,
                       "met": True}
    assert rows[1]["met"] is False and rows[1]["latency_s"] == 4.5
    assert rows[1]["shape"] == "512x256" and rows[1]["preemptions"] == 1
