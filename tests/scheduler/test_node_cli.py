"""``ditmem sim --devices D``: rows, JSON fields, load per device, clear errors."""

import json

import pytest

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.experiment import NodeScenario
from ditmem.scheduler.workloads import mean_standalone


def _sim(capsys, *argv):
    from ditmem.cli import build_parser

    parser, module = build_parser("sim")
    code = module.main(parser.parse_args(["sim", *argv]))
    return code, capsys.readouterr()


def test_rows_and_json_fields(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code, cap = _sim(
        capsys, "--workload", "seed-mix", "--devices", "4", "--policy", "fifo,slo",
        "--baseline-degree", "1,2", "--requests", "40", "--load", "0.5", "--json", str(out),
    )
    assert code == 0, cap.err
    rows = json.loads(out.read_text())
    assert [(r["policy"], r["baseline_degree"]) for r in rows] == [
        ("fifo", 1), ("fifo", 2), ("slo", None)
    ]
    for r in rows:
        assert r["devices"] == 4 and r["noise"] == 0.03 and r["requests"] == 40
        assert len(r["per_request"]) == 40
        steps = sum(sum(p["degrees"].values()) for p in r["per_request"])
        assert steps == sum(r["steps_by_degree"].values())
    assert set(rows[1]["steps_by_degree"]) == {"2"}
    assert "fifo d=2" in cap.out


def test_load_is_per_device():
    cost = CostModel.load("h200")
    sc = NodeScenario(cost, 8, "seed-mix", requests=2000, seeds=(0,))
    reqs = sc.requests_for(0.5, 0)
    rate = (len(reqs) - 1) / (reqs[-1].arrival - reqs[0].arrival)
    rho = rate * mean_standalone("seed-mix", cost) / 8
    assert rho == pytest.approx(0.5, rel=0.08)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "seed-mix", "--devices", "8", "--baseline-degree", "3"], "powers of two"),
        (["--workload", "seed-mix", "--devices", "2", "--baseline-degree", "4"], "powers of two"),
        (["--workload", "seed-mix", "--devices", "8", "--policy", "edf"], "unknown"),
        (["--workload", "seed-mix", "--devices", "0"], "--devices must be"),
        (["--workload", "seed-mix", "--baseline-degree", "2"], "needs --devices"),
        (["--workload", "seed-mix", "--devices", "8", "--device", "cpu-tiny"], "parallel"),
        (["--workload", "seed-mix", "--devices", "8", "--noise", "-1"], "sigma"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(capsys, argv, message):
    code, cap = _sim(capsys, *argv, "--requests", "5")
    assert code == 2
    assert message in cap.err
