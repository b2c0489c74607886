"""``ditmem demo --decisions`` on the real engine: each policy's decision log (the
``DecisionLog`` around the demo's profile-check ``ObservingPolicy``) comes back from the replay
processes on the replay's clock, one logged step per request step."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

PROFILE = Path(__file__).parents[2] / "benchmarks" / "serving" / "cpu-tiny-measured.json"


@pytest.mark.slow
def test_each_replays_decisions_on_the_replays_clock(tmp_path):
    from ditmem.cli import build_parser

    out, log = tmp_path / "demo.json", tmp_path / "decisions.json"
    parser, module = build_parser("demo")
    args = parser.parse_args(["demo", "--requests", "6", "--divisor", "8", "--mode",
                              "parallel", "--profile", str(PROFILE), "--no-progress",
                              "--plot", "", "--json", str(out), "--decisions", str(log)])
    assert module.main(args) == 0
    decisions = json.loads(log.read_text())
    for row in json.loads(out.read_text()):
        rows = decisions[row["policy"]]
        stepped = Counter(i for d in rows for i in (d["ran"] or ()))
        for q in row["per_request"]:
            # every step of a request is one logged decision that ran it
            assert stepped[q["id"]] == q["steps"], (row["policy"], q["id"])
            times = [d["now"] for d in rows if q["id"] in (d["ran"] or ())]
            admitted = [d["now"] for d in rows if q["id"] in d["admit"]]
            # admitted after it arrived (replay clock) and before its encode started; its
            # first step may come with that decision or a later one (a decode tile can run
            # in the admitting iteration instead of the plan's step)
            assert q["arrival_s"] - 1e-3 <= min(admitted) <= q["started_s"]
            assert min(admitted) <= min(times)
            assert max(times) < q["finished_s"]
            # its tiled decode is seen pending only after its last step, until it finished
            decoding = [d["now"] for d in rows if q["id"] in d["decoding"]]
            assert all(max(times) < t < q["finished_s"] for t in decoding)
            if row["decode"][row["policy"]] == "inline":
                assert not decoding
        assert all(set(d["ran"]) <= set(d["batch"]) for d in rows if d["ran"] is not None)
        if row["decode"][row["policy"]] == "tiled":  # a tile's iteration decides first
            # every decode is seen pending, those of the tail lane's members included (their
            # tiles go first, one decision each, since session 20: they ran whole before)
            seen = {i for d in rows for i in d["decoding"]}
            assert seen == {q["id"] for q in row["per_request"]}
