"""Experiment runs are independent of one another: a policy's online corrections stay in its
own simulation (they once leaked into the shared cost model, so results and later traces'
deadlines depended on which policies ran first)."""

from __future__ import annotations

from ditmem.scheduler import CostModel
from ditmem.scheduler.experiment import Scenario, run_point


def _scenario(cost):
    return Scenario(cost=cost, workload="seed-mix", requests=120, seeds=(0, 1), noise=0.05,
                    bias=0.2)


def test_a_run_does_not_depend_on_what_ran_before():
    alone = run_point(_scenario(CostModel.load("h200")), "slo", 0.8)
    shared = _scenario(CostModel.load("h200"))
    run_point(shared, "fifo", 0.8)
    run_point(shared, "srtf", 0.8)
    after = run_point(shared, "slo", 0.8)
    assert after == alone


def test_the_scenario_cost_model_learns_nothing():
    cost = CostModel.load("h200")
    before = cost.standalone_time(_scenario(cost).requests_for(0.8, 0)[0])
    run_point(_scenario(cost), "slo", 0.8)
    assert cost.standalone_time(_scenario(cost).requests_for(0.8, 0)[0]) == before
