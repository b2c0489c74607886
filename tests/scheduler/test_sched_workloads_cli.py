"""Workloads, arrivals at a target load, trace parsing, and the ``ditmem sim`` CLI."""

import json
import statistics

import pytest
from sched_factories import table_cost

from ditmem.scheduler import CostModel
from ditmem.scheduler.traces import TraceError, dump_jsonl, parse_trace
from ditmem.scheduler.workloads import mean_standalone, workload


def test_seed_mix_shares_priorities_and_load():
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, load=0.8, requests=4000, seed=0)
    share = lambda w: sum(r.width == w for r in reqs) / len(reqs)  # noqa: E731
    assert share(512) == pytest.approx(0.6, abs=0.03) and share(2048) == pytest.approx(
        0.1, abs=0.02
    )
    assert sum(r.priority == 0 for r in reqs) / len(reqs) == pytest.approx(0.2, abs=0.03)
    assert all(r.steps == 28 for r in reqs)
    rate = len(reqs) / (reqs[-1].arrival - reqs[0].arrival)
    assert rate * mean_standalone("seed-mix", cost) == pytest.approx(0.8, rel=0.06)
    for r in reqs:
        assert r.deadline == pytest.approx(r.arrival + 3.0 * r.standalone_s)


def test_gamma_arrivals_have_the_requested_burstiness_and_cpu_scale_halves_shapes():
    cost = CostModel.load("h200")
    reqs = workload("omni-mix", cost, requests=3000, arrival="gamma:3", seed=1)
    gaps = [b.arrival - a.arrival for a, b in zip(reqs, reqs[1:], strict=False)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(3.0, rel=0.2)
    cpu = workload("seed-mix", CostModel.load("cpu-tiny"), requests=50, scale="cpu")
    assert {r.width for r in cpu} <= {256, 512, 1024}
    with pytest.raises(ValueError, match="gamma:CV"):
        workload("seed-mix", cost, arrival="gamma:0")
    with pytest.raises(ValueError, match="unknown workload"):
        workload("nope", cost)


def test_cpu_scaled_seed_mix_keeps_a_20x_latency_spread():
    cost = CostModel.load("cpu-tiny")
    reqs = workload("seed-mix", cost, requests=300, scale="cpu")
    sizes = [r.standalone_s for r in reqs]
    assert max(sizes) / min(sizes) >= 20


def test_omni_preempt_is_the_vllm_omni_trace_in_file_order():
    cost = CostModel.load("h200")
    reqs = workload("omni-preempt", cost, load=0.8)
    assert len(reqs) == 40
    assert reqs[0].id == "req-0001" and (reqs[0].width, reqs[0].steps) == (1536, 70)
    assert reqs[-1].id == "req-0040" and reqs[-1].steps == 20
    assert all(r.priority == 1 for r in reqs)
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)


def test_video_workloads_build():
    cost = CostModel.load("h200")
    wan = workload("wan-mix", cost, requests=20)
    assert {r.model for r in wan} == {"wan2.2-a14b"} and {r.frames for r in wan} == {81}
    mix = workload("video-image-mix", cost, requests=50)
    assert {r.frames for r in mix} <= {121, 81, 1}


def test_trace_parsing_both_formats_and_round_trip():
    text = (
        "# a comment\n"
        "Request(request_id='a', prompt='x', width=512, height=512, num_inference_steps=20, "
        "timestamp=0.5, slo_ms=9000, priority=0, negative_prompt='ignored')\n"
        '{"request_id": "b", "width": 832, "height": 480, "num_inference_steps": 40, '
        '"num_frames": 81, "model": "wan2.2-a14b", "timestamp": 1.0}\n'
    )
    trace = parse_trace(text, "t.txt")
    assert trace.has_timestamps
    a, b = trace.requests
    assert (a.id, a.arrival, a.slo_ms, a.priority, a.steps) == ("a", 0.5, 9000.0, 0, 20)
    assert (b.frames, b.model, b.priority) == (81, "wan2.2-a14b", 1)
    again = parse_trace(dump_jsonl(trace.requests)).requests
    assert [(r.id, r.arrival, r.width, r.frames, r.priority) for r in again] == [
        (r.id, r.arrival, r.width, r.frames, r.priority) for r in trace.requests
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ("Request(request_id='a', width=512, height=512", "t.txt:2: not a Request"),
        ("Request(request_id='a', width=512, num_inference_steps=4)", "t.txt:2: missing field"),
        ("Request(request_id='a', width='big', height=5, num_inference_steps=4)", "width must"),
        (
            "Request(request_id='a', width=512, height=512, num_inference_steps=4, priority=7)",
            "t.txt:2: .*priority",
        ),
        ("Request(request_id='r0', width=512, height=512, num_inference_steps=4)", "duplicate"),
        ('{"request_id": "a", "width": 512', "t.txt:2: invalid JSON"),
        ("Generate(request_id='a')", "t.txt:2: expected Request"),
        (
            "Request(request_id='a', width=512, height=512, num_inference_steps=4, timestamp=2)",
            "t.txt:1: timestamp missing",
        ),
    ],
)
def test_bad_trace_lines_name_the_line(line, message):
    good = "Request(request_id='r0', width=512, height=512, num_inference_steps=4)\n"
    with pytest.raises(TraceError, match=message):
        parse_trace(good + line + "\n", "t.txt")


def _cli(*argv):
    from ditmem.cli import build_parser

    parser, module = build_parser("sim")
    args = parser.parse_args(["sim", *argv])
    return module.main(args)


def test_cli_json_has_the_fixed_fields(tmp_path, capsys):
    out = tmp_path / "o.json"
    rc = _cli(
        "--workload",
        "seed-mix",
        "--policy",
        "fifo,slo",
        "--requests",
        "120",
        "--device",
        "h100",
        "--seed",
        "2",
        "--json",
        str(out),
        "--quiet",
    )
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["fifo", "slo"]
    for r in rows:
        for key in (
            "policy",
            "workload",
            "load",
            "device",
            "requests",
            "slo_attainment",
            "p50_s",
            "p95_s",
            "p99_s",
            "mean_s",
            "preemptions",
            "per_priority",
        ):
            assert key in r, key
        assert (r["workload"], r["load"], r["device"], r["requests"]) == (
            "seed-mix",
            0.8,
            "h100",
            120,
        )
        assert set(r["per_priority"]) == {"0", "1", "2"}
        for cls in r["per_priority"].values():
            assert {"slo_attainment", "p95_s", "p99_s"} <= set(cls)
    printed = capsys.readouterr().out
    assert "fifo" in printed and "slo" in printed


def test_cli_trace_without_timestamps_and_errors(tmp_path, capsys):
    trace = tmp_path / "t.txt"
    trace.write_text(
        "Request(request_id='a', width=512, height=512, num_inference_steps=20)\n"
        "Request(request_id='b', width=1024, height=1024, num_inference_steps=20)\n"
    )
    assert _cli("--trace", str(trace), "--policy", "srtf", "--quiet") == 0
    bad = tmp_path / "bad.txt"
    bad.write_text("Request(request_id='a', width=512)\n")
    assert _cli("--trace", str(bad), "--quiet") == 2
    assert "bad.txt:1: missing field" in capsys.readouterr().err
    assert _cli("--workload", "seed-mix", "--policy", "lifo", "--quiet") == 2
    assert _cli("--workload", "seed-mix", "--device", "tpu", "--quiet") == 2


def test_cli_sweep_writes_a_plot_and_goodput(tmp_path, capsys, monkeypatch):
    from ditmem.scheduler import cli

    monkeypatch.setattr(cli, "SWEEP_LOADS", (0.3, 0.9))
    png = tmp_path / "s.png"
    assert (
        _cli(
            "--workload",
            "omni-preempt",
            "--policy",
            "fifo,slo",
            "--sweep",
            "--plot",
            str(png),
            "--quiet",
        )
        == 0
    )
    assert png.stat().st_size > 1000
    out = capsys.readouterr().out
    assert "goodput fifo:" in out and "goodput slo:" in out


def test_table_cost_cli_profile_path(tmp_path):
    prof = tmp_path / "measured.json"
    from sched_factories import table_profile

    prof.write_text(json.dumps(table_profile()))
    assert (
        _cli("--workload", "omni-preempt", "--device", str(prof), "--policy", "slo", "--quiet") == 0
    )
    assert table_cost().name == "test-table"


def test_highest_load_bisects_to_the_edge_and_handles_both_ends():
    from ditmem.scheduler.experiment import highest_load

    calls = []

    def below(edge):
        def holds(load):
            calls.append(load)
            return load <= edge
        return holds

    got = highest_load(below(0.63), 0.05, 1.2, 0.01)
    assert 0.62 <= got <= 0.63
    assert highest_load(below(0.01), 0.05, 1.2, 0.01) == 0.0
    assert highest_load(below(5.0), 0.05, 1.2, 0.01) == 1.2
