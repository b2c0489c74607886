"""Timing error in the simulator and the cost model's online correction: the simulated device
draws its times around the profile (``TimingNoise``), and the policy's cost model learns a
biased device per shape class, for steps, encodes, decodes and transfers."""

import pytest
from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import CostModel, StepReport, make_policy
from ditmem.scheduler.noise import TimingNoise
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.workloads import workload


def _fifo_busy(reqs, cost, noise):
    return simulate(reqs, make_policy("fifo", cost), noise=noise, page_bytes=PAGE).busy_s


def test_a_biased_device_is_slower_by_the_bias_and_the_policy_learns_it():
    cost = table_cost(encode_s=0.5, decode_s_per_mp=2.0)
    reqs = [req(f"r{i}", 10.0 * i, steps=4, cost=cost) for i in range(60)]
    standalone = sum(r.standalone_s for r in reqs)  # fifo, batch 1: busy = Σ true times
    assert _fifo_busy(reqs, cost, None) == pytest.approx(standalone, rel=1e-12)
    policy = make_policy("fifo", cost)
    res = simulate(reqs, policy, noise=TimingNoise(sigma=0.0, bias=0.25), page_bytes=PAGE)
    # exactly 1.25x: the truth is a separate model, not the policy's (corrected) one
    assert res.busy_s == pytest.approx(1.25 * standalone, rel=1e-12)
    # the policy's own cost model converged to the device for every kind of time
    probe = req("p", 0.0, steps=4)
    assert policy.cost.step_time("qwen-image", [1024]) == pytest.approx(1.25, rel=1e-3)
    assert policy.cost.encode_time(probe) == pytest.approx(0.625, rel=1e-3)
    assert policy.cost.decode_time(probe) == pytest.approx(1.25 * 2.0 * 0.262144, rel=1e-3)
    assert policy.cost.standalone_time(probe) == pytest.approx(
        1.25 * table_cost(encode_s=0.5, decode_s_per_mp=2.0).standalone_time(probe), rel=1e-3
    )


def test_noise_is_unbiased_seeded_and_changes_every_duration():
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, requests=300, seed=2, load=0.5)
    exact = _fifo_busy(reqs, cost, None)
    a = _fifo_busy(reqs, cost, TimingNoise(sigma=0.03, seed=1))
    b = _fifo_busy(reqs, cost, TimingNoise(sigma=0.03, seed=1))
    c = _fifo_busy(reqs, cost, TimingNoise(sigma=0.03, seed=2))
    assert a == b != c
    # ~8,400 steps of 3 % spread: the sum is within 0.5 % of the exact one, but not equal
    assert a != exact and a == pytest.approx(exact, rel=5e-3)


def test_step_corrections_are_per_shape_class_and_fall_back_to_the_model():
    cost = table_cost()
    small, large = [1024], [4096]
    for _ in range(200):  # the device is 2x slower than the profile at 4,096 tokens only
        cost.observe(StepReport(0.0, ["a"], "qwen-image", large, 8.0))
        cost.observe(StepReport(0.0, ["b"], "qwen-image", small, 1.0))
    assert cost.step_time("qwen-image", large) == pytest.approx(8.0, rel=1e-6)
    assert cost.step_time("qwen-image", small) == pytest.approx(1.0, rel=1e-6)
    # a class never measured (16,384 tokens) uses the model's factor over all classes
    model = cost.correction("qwen-image")
    assert 1.0 < model < 2.0
    assert cost.step_time("qwen-image", [16384]) == pytest.approx(
        table_cost().step_time("qwen-image", [16384]) * model
    )


def test_encode_decode_and_transfer_corrections_use_what_was_timed():
    cost = table_cost(encode_s=1.0, decode_s_per_mp=1.0, link=1e9)
    r256, r1024 = req("s", size=256), req("l", size=1024)
    for _ in range(300):
        cost.observe(StepReport(0.0, [], "qwen-image", [], 0.0, encode_s=3.0,
                                encoded=[r256, r1024]))  # 1.5 s each, profile says 1 s
        cost.observe(StepReport(0.0, [], "qwen-image", [], 0.0, decode_s=0.5 * 1.048576,
                                decoded=[r1024]))  # half the profile's decode at 1024²
        cost.observe(StepReport(0.0, [], "qwen-image", [], 0.0, transfer_s=0.3,
                                transfer_bytes=1e8))  # 3x the profile's 0.1 s
        # a time nobody attributed (no requests, no bytes) teaches nothing
        cost.observe(StepReport(0.0, [], "qwen-image", [], 0.0, encode_s=99.0, decode_s=99.0,
                                transfer_s=99.0))
    assert cost.encode_time(r256) == pytest.approx(1.5, rel=1e-6)
    assert cost.decode_time(r1024) == pytest.approx(0.5 * 1.048576, rel=1e-6)
    assert cost.decode_time(r256) == pytest.approx(0.065536)  # another class: not measured
    assert cost.transfer_time(1e8) == pytest.approx(0.3, rel=1e-6)
    assert set(cost.corrections()) >= {"encode qwen-image", "transfer", "step qwen-image"}


def test_policy_misses_more_on_an_unseen_slow_device_only_until_it_learns():
    # deadlines come from the profile; the device is 20 % slower; slo still runs everything
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, requests=300, seed=0, load=0.6)
    policy = make_policy("slo", cost)
    res = simulate(reqs, policy, noise=TimingNoise(sigma=0.03, bias=0.2, seed=0))
    assert len(res.records) == 300
    assert policy.cost.correction("qwen-image") == pytest.approx(1.2, rel=0.03)
