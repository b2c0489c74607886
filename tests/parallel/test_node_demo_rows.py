"""What the two-device demo's JSON keeps to diagnose a run against its prediction: per
request rows and the decisions counted as the loop makes them (``CountingDevices``), on
the hand-built take-back case (``node_cases.take_back_records``: a lone 1024² whose decode
splits over both devices, a 256² arriving during it that meets its deadline only when the
spare is taken back) — no engine needed."""

from __future__ import annotations

import json

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


def _logged(split_yield: bool):
    from ditmem.scheduler.node.policies.recorder import DecisionLog

    logs = []

    def wrap_policy(policy):
        logs.append(DecisionLog(policy, lambda r: r.width >= 1024))
        return logs[-1]

    records = {r.request.id: r for r in take_back_records(lambda d: d, split_yield, wrap_policy)}
    return records, logs[0].rows()


def test_the_decision_log_keeps_take_backs_late_ids_and_who_waited():
    """The take-back case, logged (``ditmem demo --devices 2 --decisions``'s rows): the
    256²'s arrival offers the 1024²'s spare (device 1); the yielding policy grants it and
    then places the 256² on device 1 alone, on time. Without the yield nothing is asked,
    and the 256² is placed only once the decode has ended, already counted late (it
    misses)."""
    yielded, rows = _logged(True)
    small = yielded["small"].request
    assert rows["take_backs"] == [{"now": small.arrival, "offered": [[1, "big"]],
                                   "granted": [1]}]
    first = next(d for d in rows["decisions"] if "small" in d["placed"])
    assert first["now"] >= small.arrival
    assert ["small", [1], True, False] in first["jobs"]  # alone on the taken-back spare
    assert "small" in first["waiting"] and first["late"] == []
    assert yielded["small"].finished <= small.deadline
    # before the 256² arrives the 1024² is the only one, placed and never late
    assert all(d["jobs"][0][:2] == ["big", [0, 1]] and not d["late"]
               for d in rows["decisions"] if d["now"] < small.arrival)

    held, rows = _logged(False)
    assert rows["take_backs"] == []
    placed = next(d for d in rows["decisions"] if "small" in d["placed"])
    assert placed["late"] == ["small"]
    assert placed["now"] > small.deadline - 0.1  # after the decode, too late to make it
    assert held["small"].finished > small.deadline
    json.dumps(rows)  # JSON-ready as the demo writes it


def test_timelines_show_the_wait_behind_the_split_decode_and_the_tool_prints_them(tmp_path):
    """The 256²'s timeline from the log: it waits behind the 1024²'s last job (its split
    decode) from its arrival until it is placed — on the taken-back spare after the tile in
    progress, or after the whole decode without the yield — then runs its one step and
    decode. ``node_demo_misses.py`` prints the same from the demo's two files."""
    import subprocess
    import sys
    from pathlib import Path

    from ditmem.scheduler.node.policies.recorder import from_rows, timeline

    for split_yield in (True, False):
        records, rows = _logged(split_yield)
        small = records["small"]
        placed = next(d["now"] for d in rows["decisions"] if "small" in d["placed"])
        segs = timeline(from_rows(rows["decisions"]), "small", small.request.arrival,
                        small.finished)
        assert [(g.state, g.start, g.end) for g in segs] == [
            ("wait (large decode)", small.request.arrival, placed),
            ("last step + decode", placed, small.finished)]
        assert segs[0].others == {"big": 1}
    counted = []
    records = take_back_records(lambda d: counted.append(CountingDevices(d, demo_truth()))
                                or counted[-1], False)
    held = run_rows(records, counted[0])
    sim = _counted(True)[1]["per_request"]
    run = [{"policy": "slo", **held, "sim_per_request": sim,
            "missed_apart": missed_apart(held["per_request"], sim)}]
    logs = {"slo": {"run": _logged(False)[1], "sim": _logged(True)[1]}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "d.json").write_text(json.dumps(logs))
    tool = Path(__file__).resolve().parents[2] / "benchmarks/parallel/node_demo_misses.py"
    out = subprocess.run([sys.executable, str(tool), str(tmp_path / "run.json"),
                          str(tmp_path / "d.json"), "--timelines", "--json",
                          str(tmp_path / "out.json")], capture_output=True, text=True,
                         check=True).stdout
    assert "take-backs run: asked 0" in out and "take-backs sim: asked 1, with a spare 1, " \
        "granted 1" in out
    rows = json.loads((tmp_path / "out.json").read_text())["requests"]
    assert [r["id"] for r in rows] == ["small"]  # missed in the run only
    assert [g["state"] for g in rows[0]["run_timeline"]] == [
        "wait (large decode)", "last step + decode"]


def test_rides_count_the_decisions_a_request_shared_a_larger_requests_step(load_benchmark):
    """Hand-built log: s (256²) alone on device 0, then in device 1's job with b (1024²)
    twice, then with t (256²); b is never smaller than its partner."""
    tool = load_benchmark("parallel/node_demo_misses.py")
    rows = [{"id": "s", "shape": "256x256"}, {"id": "t", "shape": "256x256"},
            {"id": "b", "shape": "1024x1024"}]
    decisions = [
        {"jobs": [["s", [0], False, False]]},
        {"jobs": [["b", [1], False, True], ["s", [1], False, False]]},
        {"jobs": [["s", [1], False, False], ["b", [1], False, True], ["t", [0], False, False]]},
        {"jobs": [["s", [0], True, False], ["t", [0], True, False]]},
    ]
    assert tool.rides(decisions, rows) == {"s": (4, 2), "b": (2, 0), "t": (2, 0)}
