"""Class drift in the simulators: true times biased by kind of work and by shape class (and a
node step's degree, a node move's kind), hand-computed on round-number profiles; plain-bias
simulations unchanged draw for draw; ``--bias KIND[:CLASS]=B`` on the ``sim`` command."""

import dataclasses
import json
import math

import pytest
from node_factories import node_cost
from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.node.device import Job, Move, VirtualDevices
from ditmem.scheduler.node.topology import Group
from ditmem.scheduler.noise import TimingNoise
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.workloads import workload


def _finish(r, cost, noise):
    res = simulate([r], make_policy("fifo", cost.fresh()), noise=noise, page_bytes=PAGE)
    return res.records[0].finished


def test_one_device_drift_by_kind_and_shape_hand_computed():
    """512² steps in 1 s, 1024² in 4 s; encodes 0.5 s; decodes 1 s per megapixel. The truth:
    1024² steps ×1.5, encodes ×2, 512² decodes ×4; the rest as the profile."""
    cost = table_cost(encode_s=0.5, decode_s_per_mp=1.0)
    noise = lambda: TimingNoise(0.0, 0.0, 0, {"step:1024x1024": 0.5, "encode": 1.0,  # noqa: E731
                                              "decode:512x512": 3.0})
    large = req("L", size=1024, steps=3, cost=cost)
    small = req("S", size=512, steps=3, cost=cost)
    assert _finish(large, cost, noise()) == pytest.approx(2 * 0.5 + 3 * 4 * 1.5 + 1.048576)
    assert _finish(small, cost, noise()) == pytest.approx(2 * 0.5 + 3 * 1.0 + 4 * 0.262144)


class _Reference(TimingNoise):
    """The draw as it was before kinds and classes (reference implementation)."""

    def draw(self, predicted, kind=None, key=()):
        if (self.sigma == 0 and self.bias == 0) or predicted <= 0:
            return predicted
        z = self._rng.gauss(0.0, 1.0) if self.sigma else 0.0
        return predicted * (1.0 + self.bias) * math.exp(self.sigma * z - self.sigma**2 / 2)


@pytest.mark.parametrize("preemption,decode", [("step", "inline"), ("block", "tiled"),
                                               ("step", "concurrent")])
def test_plain_bias_simulations_are_unchanged_draw_for_draw(preemption, decode):
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, load=0.9, requests=80, seed=3)
    out = []
    for noise in (TimingNoise(0.03, 0.1, 5), _Reference(0.03, 0.1, 5)):
        res = simulate([dataclasses.replace(r) for r in reqs], make_policy("slo", cost.fresh()),
                       preemption=preemption, decode=decode, noise=noise)
        out.append([(r.request.id, r.finished, r.preemptions) for r in res.records])
    assert out[0] == out[1]


def test_node_step_drifts_by_shape_and_degree_and_moves_by_kind():
    """Node test profile: 1024² steps in 4 s at degree 1, 2 s at degree 2; a peer copy of
    the state PAGE / 1e9 s. Truth: 1024² ×1.5, degree 2 ×0.9, peer moves ×2.42."""
    nc = node_cost()
    drift = {"step:1024x1024": 0.5, "step:d2": -0.1, "move:peer": 1.42}
    q, p = req("q", size=1024), req("p", size=512)
    devices = VirtualDevices(nc, TimingNoise(0.0, 0.0, 0, drift), 4)
    devices.launch(Job(0, Group(2, 0), [q], 1), 0.0)
    devices.launch(Job(1, Group(1, 2), [q], 1), 0.0)
    devices.launch(Job(2, Group(1, 3), [p], 1, [Move(p, Group(1, 2), Group(1, 3), "peer")]),
                   0.0)
    done = {}
    while len(done) < 3:
        done.update({c.job.job_id: c for c in devices.wait(None)})
    assert done[0].timings.step_s == pytest.approx(2 * 1.5 * 0.9)
    assert done[1].timings.step_s == pytest.approx(4 * 1.5)
    assert done[2].timings.step_s == pytest.approx(1.0)  # 512² at degree 1: as the profile
    assert done[2].timings.move_s == [pytest.approx(2.42 * PAGE / 1e9)]


def _cli(capsys, *argv):
    from ditmem.cli import build_parser

    parser, module = build_parser("sim")
    code = module.main(parser.parse_args(["sim", *argv]))
    return code, capsys.readouterr()


def test_sim_bias_by_kind_and_class_reaches_the_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code, cap = _cli(capsys, "--workload", "seed-mix", "--policy", "fifo", "--requests", "30",
                     "--bias", "0.05,step:2048x2048=0.1,move=1.42", "--json", str(out),
                     "--quiet")
    assert code == 0, cap.err
    row = json.loads(out.read_text())[0]
    assert row["bias"] == 0.05 and row["bias_by"] == {"step:2048x2048": 0.1, "move": 1.42}
    node = tmp_path / "node.json"
    code, cap = _cli(capsys, "--workload", "seed-mix", "--devices", "2", "--policy", "slo",
                     "--requests", "20", "--bias", "move=1.42,encode=0.29,step:d2=-0.1",
                     "--json", str(node))
    assert code == 0, cap.err
    row = json.loads(node.read_text())[0]
    assert row["bias"] == 0.0 and row["bias_by"] == {"move": 1.42, "encode": 0.29,
                                                     "step:d2": -0.1}
    plain = tmp_path / "plain.json"
    code, cap = _cli(capsys, "--workload", "seed-mix", "--policy", "fifo", "--requests", "20",
                     "--bias", "0.1", "--json", str(plain), "--quiet")
    assert code == 0, cap.err
    row = json.loads(plain.read_text())[0]
    assert row["bias"] == 0.1 and row["bias_by"] == {}


def test_sim_bad_bias_is_a_usage_error_naming_the_part(capsys):
    with pytest.raises(SystemExit) as exc:
        _cli(capsys, "--workload", "seed-mix", "--bias", "stp:2048x2048=0.1")
    assert exc.value.code == 2
    assert "'stp:2048x2048'" in capsys.readouterr().err
    code, cap = _cli(capsys, "--workload", "seed-mix", "--replicas", "2", "--bias", "move=1")
    assert code == 2 and "--replicas" in cap.err
