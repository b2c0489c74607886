"""What the two-device demo's JSON keeps to diagnose a run against its prediction: per
request rows and the decisions counted as the loop makes them (``CountingDevices``), on
the hand-built take-back case (``node_cases.take_back_records``: a lone 1024² whose decode
splits over both devices, a 256² arriving during it that meets its deadline only when the
spare is taken back) — no engine needed."""

from __future__ import annotations

import pytest
from node_cases import demo_truth, take_back_records, take_back_run

from ditmem.scheduler.metrics import summarize
from ditmem.tools.node_demo import CountingDevices, missed_apart, run_rows


def _counted(split_yield: bool):
    counted = []

    def wrap(devices):
        counted.append(CountingDevices(devices, demo_truth()))
        return counted[-1]

    records = take_back_records(wrap, split_yield)
    return records, run_rows(records, counted[0])


def test_decisions_are_counted_and_the_rows_agree_with_attainment():
    yielded, taken = _counted(True)
    kept, held = _counted(False)
    # the counter passes the take-back through: the same finishes as the bare devices'
    assert {r.request.id: r.finished for r in yielded} == take_back_run(lambda d: d, True)
    # one split decode (the 1024²'s; the 256²'s one tile runs whole), one take-back when
    # the policy yields, none when it does not; nothing moves between groups
    assert taken["decisions"] == {"take_backs": 1, "split_decodes": 1, "migrations": 0}
    assert held["decisions"] == {"take_backs": 0, "split_decodes": 1, "migrations": 0}
    for records, rows in ((yielded, taken), (kept, held)):
        per = rows["per_request"]
        assert [q["id"] for q in per] == ["big", "small"]  # arrival order
        assert sum(q["met"] for q in per) / len(per) == pytest.approx(
            summarize(records)["slo_attainment"])
        assert all(q["arrival_s"] <= q["started_s"] <= q["finished_s"] for q in per)
    assert [q["met"] for q in taken["per_request"]] == [True, True]
    assert [q["met"] for q in held["per_request"]] == [True, False]
    # the held run beside the yielding one as if it were its prediction, and back
    assert missed_apart(held["per_request"], taken["per_request"]) == {
        "run_only": ["small"], "sim_only": []}
    assert missed_apart(taken["per_request"], held["per_request"]) == {
        "run_only": [], "sim_only": ["small"]}
