"""benchmarks/scheduler/demo_misses.py: the run's misses beside its replays', per request."""

import pytest


@pytest.fixture(scope="module")
def demo_misses(load_benchmark):
    return load_benchmark("scheduler/demo_misses.py")


def _row(rid, shape, arrival, window, start, latency, met, pre=0):
    return {"id": rid, "shape": shape, "steps": 4, "priority": 1, "arrival_s": arrival,
            "started_s": arrival + start, "finished_s": arrival + latency,
            "deadline_s": arrival + window, "latency_s": latency, "preemptions": pre,
            "offloads": 0, "met": met}


def test_lists_requests_missed_in_the_run_or_any_replay(demo_misses):
    real = [_row("a", "64x64", 0.0, 1.0, 0.0, 0.5, True),
            _row("b", "64x64", 1.0, 1.0, 0.6, 1.4, False, pre=2),
            _row("c", "128x128", 2.0, 4.0, 0.0, 3.0, True)]
    sim0 = {r["id"]: dict(r) for r in real}
    sim0["b"] = _row("b", "64x64", 1.0, 1.0, 0.1, 0.7, True)
    sim1 = {k: dict(v) for k, v in sim0.items()}
    sim1["c"] = _row("c", "128x128", 2.0, 4.0, 2.0, 5.0, False)
    res = demo_misses.compare({"policy": "slo", "per_request": real}, [sim0, sim1])
    assert [r["id"] for r in res["lost"]] == ["b", "c"]
    b, c = res["lost"]
    assert (b["real_met"], b["sim_missed_of"], b["real_preemptions"]) == (False, "0/2", 2)
    assert b["real_wait_s"] == pytest.approx(0.6) and b["sim_wait_s"] == pytest.approx(0.1)
    assert (c["real_met"], c["sim_missed_of"]) == (True, "1/2")
    assert res["real_misses"] == 1 and res["sim_misses"] == [0, 1]
    small = res["shapes"]["64x64"]
    assert small["n"] == 2 and small["real_misses"] == 1 and small["sim_misses_mean"] == 0
    assert small["real_latency_per_window"] == pytest.approx((0.5 + 1.4) / 2)


def test_refuses_a_replay_of_another_trace(demo_misses):
    real = [_row("a", "64x64", 0.0, 1.0, 0.0, 0.5, True)]
    with pytest.raises(ValueError, match="differs"):
        demo_misses.compare({"policy": "slo", "per_request": real},
                            [{"z": _row("z", "64x64", 0.0, 1.0, 0.0, 0.5, True)}])


def test_replays_decode_as_the_demos_prediction(demo_misses):
    run = {"policy": "slo", "decode": {"fifo": "inline", "slo": "tiled"}, "decode_workers": 0}
    assert demo_misses.replay_decode(run) == "tiled"
    assert demo_misses.replay_decode(dict(run, policy="fifo")) == "inline"
    # decode worker threads: the run's decode mode reads "inline", the demo predicts with
    # the simulator's concurrent decode lane
    workers = dict(run, decode={"fifo": "inline", "slo": "inline"}, decode_workers=1)
    assert demo_misses.replay_decode(workers) == "concurrent"


def test_one_runs_decisions_only(demo_misses, monkeypatch, tmp_path):
    monkeypatch.setattr("sys.argv", ["demo_misses.py", str(tmp_path / "a.json"),
                                     str(tmp_path / "b.json"), "--decisions",
                                     str(tmp_path / "d.json")])
    with pytest.raises(SystemExit) as err:
        demo_misses.main()
    assert err.value.code == 2
