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
