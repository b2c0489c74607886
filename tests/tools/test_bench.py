"""``ditmem bench`` against a live server: arrivals, the vllm-omni SLO rule, JSON fields."""

from __future__ import annotations

import json

from harness import running_server, toy_engine

from ditmem.cli import main as cli_main


def test_bench_workload_and_trace(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text(
        "Request(request_id='a', prompt='x', width=64, height=64, num_inference_steps=3, "
        "timestamp=0.0, slo_ms=60000)\n"
        "Request(request_id='b', prompt='fail-step', width=64, height=64, "
        "num_inference_steps=3, timestamp=0.05, slo_ms=60000)\n"
        "Request(request_id='c', prompt='y', width=32, height=32, num_inference_steps=2, "
        "timestamp=0.1, slo_ms=0.001)\n")
    with running_server(toy_engine()) as url:
        out = tmp_path / "trace.json"
        assert cli_main(["bench", "--url", url, "--trace", str(trace), "--json", str(out),
                         "--no-progress"]) == 0
        s = json.loads(out.read_text())["summary"]
        # a: success within SLO; b: failed (500) -> miss; c: success but slower than 1 us
        assert s["requests"] == 3 and s["failed"] == 1
        assert abs(s["slo_attainment"] - 1 / 3) < 1e-9
        assert s["http_status"] == {"200": 2, "500": 1}
        out2 = tmp_path / "mix.json"
        assert cli_main(["bench", "--url", url, "--workload", "seed-mix", "--rate", "50",
                         "--requests", "12", "--divisor", "16", "--endpoint", "chat",
                         "--profile", "cpu-tiny", "--json", str(out2), "--no-progress"]) == 0
        data = json.loads(out2.read_text())
        s2 = data["summary"]
        assert s2["requests"] == 12 and s2["failed"] == 0
        for key in ("slo_attainment", "p50_s", "p95_s", "p99_s", "mean_s", "per_priority"):
            assert key in s2
        assert sum(c["requests"] for c in s2["per_priority"].values()) == 12


def test_bench_random_sides_with_the_warmup_slo_rule(tmp_path):
    """--random-sides with --slo-rule warmup: the unit is the warm-up's latency per
    16x16 patch-step, each SLO 3 x unit x pixels/256 x steps (recomputed here from the
    JSON's own warm-up latency), arrivals seeded, nothing sent as slo_ms."""
    out = tmp_path / "warm.json"
    args = ["bench", "--random-sides", "32,64", "--steps", "3", "--requests", "10",
            "--rate", "40", "--slo-rule", "warmup", "--warmup-requests", "1",
            "--warmup-steps", "1", "--profile", "cpu-tiny", "--no-progress"]
    with running_server(toy_engine()) as url:
        assert cli_main([*args, "--url", url, "--json", str(out)]) == 0
        again = tmp_path / "again.json"
        assert cli_main([*args, "--url", url, "--json", str(again)]) == 0
    data = json.loads(out.read_text())
    warm = data["warmup"]
    assert warm["requests"] == 1 and warm["steps"] == 1 and len(warm["latencies_s"]) == 1
    rows = data["per_request"]
    first = rows[0]
    units_first_warm = first["width"] * first["height"] / 256 * 1  # 1 warm-up step
    assert abs(warm["unit_s"] - warm["latencies_s"][0] / units_first_warm) < 1e-12
    assert {(r["width"], r["height"]) for r in rows} <= {(32, 32), (64, 64)}
    for r in rows:
        expect = 3.0 * warm["unit_s"] * max(r["width"] * r["height"] / 256, 1) * r["steps"]
        assert abs(r["slo_s"] - expect) < 1e-9 * max(1.0, expect)
        assert r["met"] == (r["latency_s"] is not None and r["latency_s"] <= r["slo_s"])
    met = sum(r["met"] for r in rows) / len(rows)
    assert abs(data["summary"]["slo_attainment"] - met) < 1e-9
    rows2 = json.loads(again.read_text())["per_request"]
    assert [(r["arrival_s"], r["width"]) for r in rows2] == [
        (r["arrival_s"], r["width"]) for r in rows]


def test_bench_request_body_and_bad_options(capsys):
    from ditmem.scheduler.request import Request
    from ditmem.tools.bench import request_body

    r = Request("a", 0.0, "qwen-image", 64, 64, steps=3, deadline=2.0)
    assert request_body(r, "chat", send_slo=False)[1]["extra_body"].get("slo_ms") is None
    assert request_body(r, "chat")[1]["extra_body"]["slo_ms"] == 2000.0
    for bad, word in ((["--random-sides", "100,abc"], "--random-sides"),
                      (["--random-sides", "64", "--slo-rule", "warmup",
                        "--warmup-requests", "0"], "--warmup-requests"),
                      (["--random-sides", "64", "--steps", "0"], "--steps")):
        assert cli_main(["bench", "--url", "http://127.0.0.1:9", *bad, "--no-progress"]) == 2
        assert word in capsys.readouterr().err
