"""Profiles load with a source for every number, and the cost model reproduces calibration.md."""

import copy
import json
from importlib import resources

import pytest
from sched_factories import req, table_cost, table_profile

from ditmem.scheduler import PROFILE_NAMES, CostModel, ProfileError, Request, StepReport
from ditmem.scheduler.profiles import load_profile, parse_profile


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_shipped_profile_loads_and_every_number_has_a_source(name):
    raw = json.loads(
        resources.files("ditmem.scheduler").joinpath("profiles", f"{name}.json").read_text()
    )

    def walk(node, path):
        if isinstance(node, dict) and "value" in node:
            assert node.get("source", "").strip(), f"{name}: {path} has no source"
            return
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in ("format", "name", "description", "kind"):
                    walk(v, f"{path}.{k}")

    walk(raw, name)
    cost = CostModel.load(name)
    assert cost.name == name
    r = Request("x", 0.0, width=512, height=512, steps=28)
    assert cost.standalone_time(r) > 0


def test_missing_source_is_rejected_with_the_field_named():
    bad = table_profile()
    bad["models"]["qwen-image"]["encode_s"] = {"value": 0.1, "source": " "}
    with pytest.raises(ProfileError, match=r"models\.qwen-image\.encode_s"):
        parse_profile(bad, "p")
    bad2 = copy.deepcopy(table_profile())
    bad2["device_bytes"] = 5
    with pytest.raises(ProfileError, match="device_bytes"):
        parse_profile(bad2, "p")


def test_unknown_profile_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(ProfileError, match="unknown device profile 'h900'"):
        load_profile("h900")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.json")


def test_h100_class_step_times_match_calibration():
    cost = CostModel.load("h200")
    step = lambda px: cost.step_time("qwen-image", [cost.tokens(req("a", size=px))])  # noqa: E731
    # calibration.md: 0.07 / 0.28 / 1.7 s per step at ≈500 TFLOP/s, plus a 10-30 ms floor and
    # lower efficiency at small shapes.
    assert 0.07 < step(512) < 0.12
    assert 0.28 < step(1024) < 0.34
    assert 1.7 < step(2048) < 1.8
    wan = Request("w", 0.0, "wan2.2-a14b", 832, 480, 81, 40)
    assert cost.tokens(wan) == 32760
    assert 6.5 < cost.step_time(wan.model, [32760]) < 7.0  # calibration: 6.7 s
    # Batching: 4 × 512² gives +29.6 % throughput (SGLang anchor); 2 × 1024² almost nothing.
    t1 = cost.step_time("qwen-image", [1024])
    assert 4 * t1 / cost.step_time("qwen-image", [1024] * 4) == pytest.approx(1.296, rel=1e-3)
    t4k = cost.step_time("qwen-image", [4096])
    assert 2 * t4k / cost.step_time("qwen-image", [4096, 4096]) < 1.06


def test_slower_devices_scale_as_calibrated():
    h = CostModel.load("h100").step_time("qwen-image", [16384])
    a = CostModel.load("a100").step_time("qwen-image", [16384])
    n = CostModel.load("ascend-910b").step_time("qwen-image", [16384])
    assert a / h == pytest.approx(2.9, rel=0.05)
    assert 2.4 < n / h < 3.0


def test_table_profile_interpolates_and_batches_cost_the_sum_without_points():
    cost = table_cost(seconds_1024=1.0, seconds_4096=4.0)
    assert cost.step_time("qwen-image", [1024]) == pytest.approx(1.0)
    assert cost.step_time("qwen-image", [4096]) == pytest.approx(4.0)
    assert cost.step_time("qwen-image", [2048]) == pytest.approx(2.0)  # log-log, slope 1
    assert cost.step_time("qwen-image", [1024, 1024]) == pytest.approx(2.0)
    measured = table_cost(batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5}])
    assert measured.step_time("qwen-image", [1024, 1024]) == pytest.approx(1.5)


def test_cpu_tiny_matches_the_measured_tiny_model_timings():
    cost = CostModel.load("cpu-tiny")
    for tokens, secs in ((256, 0.006), (1024, 0.016), (4096, 0.145)):
        assert cost.step_time("qwen-image", [tokens]) == pytest.approx(secs)


def test_deadlines_pages_transfers_and_feedback():
    cost = table_cost(encode_s=0.5, decode_s_per_mp=1e6 / (512 * 512))  # decode 1 s at 512²
    r = req("a", 10.0, steps=4, cost=cost)
    assert r.standalone_s == pytest.approx(0.5 + 4 * 1.0 + 1.0)
    assert r.deadline == pytest.approx(10.0 + 3 * 5.5)
    fixed = req("b", 10.0, steps=4, slo_ms=2000, cost=cost)
    assert fixed.deadline == pytest.approx(12.0)
    assert cost.remaining_time(r, 2) == pytest.approx(2 * 1.0 + 1.0)
    assert cost.pages_for(r, 1 << 20) == 1 and cost.pages_for(r, 1 << 19) == 2
    assert cost.transfer_time(2e9) == pytest.approx(2.0)
    for _ in range(200):  # the device runs 2x slower than profiled: the model learns it
        cost.observe(StepReport(0.0, ["a"], "qwen-image", [1024], 2.0))
    assert cost.step_time("qwen-image", [1024]) == pytest.approx(2.0, rel=1e-3)


def test_request_validation_names_the_field():
    with pytest.raises(ValueError, match="priority"):
        Request("x", 0.0, priority=3)
    with pytest.raises(ValueError, match="width"):
        Request("x", 0.0, width=0)
    with pytest.raises(ValueError, match="unknown model"):
        table_cost().tokens(Request("x", 0.0, model="sdxl"))


def test_table_prices_unequal_batches_from_their_members():
    # batch 2 gains 25 % at equal sizes; 1024 tokens take 1 s alone, 4096 take 4 s
    cost = table_cost(batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5},
                                    {"tokens": 4096, "batch": 2, "seconds": 6.0}])
    assert cost.step_time("qwen-image", [1024, 1024]) == pytest.approx(1.5)  # measured
    assert cost.step_time("qwen-image", [4096, 4096]) == pytest.approx(6.0)
    mixed = cost.step_time("qwen-image", [4096, 1024])
    # never below the large member alone, nor below the batch-1 sum times the 25 % gain
    assert mixed >= 4.0 and mixed == pytest.approx(max(4.0, 0.75 * (4.0 + 1.0)))


def test_step_spread_starts_at_the_prior_and_learns_the_measured_error_per_class():
    """Issue 13 (session 21): ``step_spread`` is the relative sd of a step's time around
    its corrected prediction. Before any step: ``STEP_SPREAD_PRIOR``. Steps measured
    alternately 10 % over and under the profile (a 512² class, 1 s predicted): the
    correction stays near 1, the relative errors are ~±10 %, so the spread converges to
    ~0.10 for that class (and the model's), while exact steps of another class bring its
    own spread down towards 0 — from the model's, where it starts."""
    from ditmem.scheduler.cost import STEP_SPREAD_PRIOR

    cost = table_cost()
    tokens = cost.tokens(req("a"))
    assert cost.step_spread("qwen-image", tokens) == STEP_SPREAD_PRIOR
    for n in range(200):
        measured = 1.1 if n % 2 else 0.9
        cost.observe(StepReport(0.0, ["a"], "qwen-image", [tokens], measured))
    assert cost.step_spread("qwen-image", tokens) == pytest.approx(0.10, abs=0.01)
    other = cost.tokens(req("b", size=1024))
    first = cost.step_spread("qwen-image", other)  # unseen class: the model's
    assert first == pytest.approx(0.10, abs=0.01)
    for _ in range(100):
        cost.observe(StepReport(0.0, ["b"], "qwen-image", [other],
                                cost.step_time("qwen-image", [other])))
    assert cost.step_spread("qwen-image", other) < 0.001
    assert cost.step_spread("qwen-image", tokens) == pytest.approx(0.10, abs=0.01)
