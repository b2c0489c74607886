"""The profile's parallel table from measured rows, and ``ditmem profile --devices``
argument checks (pure; the measurement itself runs in test_node_engine)."""

from argparse import Namespace

import pytest

from ditmem.parallel.speedup import degrees_of, speedup_table
from ditmem.scheduler.node.speedup import parse_table
from ditmem.tools.profile_devices import check_device_arguments


def _row(tokens, degree, wall, cpu):
    return {"side": 0, "tokens": tokens, "degree": degree, "speedup": wall, "cpu_speedup": cpu}


def test_table_is_ascending_degree_one_exact_and_loads_in_the_scheduler():
    rows = [_row(1024, 1, 1.0, 1.0), _row(1024, 2, 3.0, 1.57),
            _row(256, 1, 1.0, 1.0), _row(256, 2, 0.7, 1.11)]
    table = speedup_table(rows, "measured here")
    assert table == {"tokens": [256, 1024], "speedup": {"1": [1.0, 1.0], "2": [1.11, 1.57]},
                     "source": "measured here"}
    assert speedup_table(rows, "x", clock="wall")["speedup"]["2"] == [0.7, 3.0]
    parsed = parse_table(table, "parallel.qwen-image")
    assert parsed.speedup(512, 2) == pytest.approx(1.11 + 0.5 * (1.57 - 1.11))
    with pytest.raises(ValueError, match="clock"):
        speedup_table(rows, "x", clock="gpu")


def test_degrees_and_argument_checks():
    assert degrees_of(1) == [1] and degrees_of(2) == [1, 2] and degrees_of(6) == [1, 2, 4]
    ok = Namespace(devices=2, model="tiny-qwen-image", parallel_sides="256,512")
    assert check_device_arguments(ok, device_count=2) is None
    assert "exceeds" in check_device_arguments(Namespace(**{**vars(ok), "devices": 3}), 2)
    assert ">= 1" in check_device_arguments(Namespace(**{**vars(ok), "devices": 0}), 2)
    assert check_device_arguments(Namespace(**{**vars(ok), "model": "tiny-wan"}), 2) is None
    bad = Namespace(**{**vars(ok), "parallel_sides": "256,100"})
    assert "multiples of 16" in check_device_arguments(bad, 2)


# --------------------------------------------------------------- plausibility and redo
from concurrent.futures import Future  # noqa: E402

from ditmem.parallel import commands as cmd  # noqa: E402
from ditmem.parallel.speedup import (  # noqa: E402
    CalibrationError,
    calibrate,
    check_speedups,
    measure_speedups,
    spread,
)


def _checked(tokens, degree, s, spread_=0.02, inflation=1.1):
    return {"side": 0, "tokens": tokens, "degree": degree, "speedup": s, "cpu_speedup": s,
            "process_speedup": s, "spread": spread_, "work_inflation": inflation,
            "rounds": 5}


def test_spread_is_the_medians_confidence_half_width():
    assert spread([1.7]) == 0.0 and spread([1.8, 1.8, 1.8]) == 0.0
    # 5 values: P(B(5, 1/2) < 2) = 6/32 > 5 %, so the range: (5 - 1) / 2 / median 3
    assert spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2 / 3)
    # 15 values: P(B(15, 1/2) < 4) = 576/32768 = 1.8 %, < 5 = 5.9 %: x_(4) .. x_(12)
    xs = [float(v) for v in range(1, 16)]
    assert spread(xs) == pytest.approx((12 - 4) / 2 / 8)
    # one wild round among 15 barely moves it (the range would)
    assert spread([1.8] * 14 + [0.6]) == 0.0


def test_plausible_table_passes_and_each_rule_names_its_point():
    good = [_checked(256, 1, 1.0), _checked(256, 2, 0.9, inflation=2.2),
            _checked(4096, 1, 1.0), _checked(4096, 2, 1.82)]
    assert check_speedups(good) == []  # slower at the smallest size is allowed
    slower = [_checked(256, 2, 0.7), _checked(4096, 2, 0.95, inflation=1.2)]
    (p,) = check_speedups(slower)
    assert "degree 2 at 4096 tokens" in p and "slower than degree 1" in p
    (p,) = check_speedups([_checked(4096, 2, 2.3)])
    assert "above the degree" in p
    (p,) = check_speedups([_checked(1024, 2, 1.6, spread_=0.3), _checked(4096, 2, 1.8)])
    assert "1024 tokens" in p and "+-30 %" in p
    # the demo's run 4: 0.67 / 0.93 / 1.40 at degree 2 — each rank slower per unit of work
    run4 = [_checked(256, 2, 0.67, inflation=3.0), _checked(1024, 2, 0.93, inflation=2.1),
            _checked(4096, 2, 1.40, inflation=1.43)]
    (p,) = check_speedups(run4)
    assert "4096 tokens" in p and "1.43 x degree 1's CPU time" in p
    assert check_speedups(run4, "wall") == []  # inflation is a busy-time rule only
    # or one core slower than the other: the slow rank set the step
    lopsided = [dict(_checked(4096, 2, 1.40, inflation=1.2), imbalance=1.4)]
    (p,) = check_speedups(lopsided)
    assert "one rank used 1.40 x the other's" in p
    assert check_speedups([dict(_checked(4096, 2, 1.8), imbalance=1.1)]) == []
    # busy time says x1.82, wall time x1.08 (measured here at load 2.8): ranks waited
    waited = [dict(_checked(4096, 2, 1.82), speedup=1.08)]
    (p,) = check_speedups(waited)
    assert "x1.82 on cpu time but x1.08 on wall time" in p
    assert check_speedups(waited, "wall") == []
    assert check_speedups([dict(_checked(4096, 2, 1.82), speedup=1.6)]) == []
    with pytest.raises(ValueError, match="clock"):
        check_speedups(good, "gpu")


class FakeNode:
    """A node engine answering step commands with scripted worker timings: degree-1 steps
    take ``base`` s of CPU; each rank of a degree-2 step ``shard(attempt, round)`` s."""

    num_devices = 2
    command_timeout_s = 5.0

    def __init__(self, base, shard):
        self.base, self.shard = base, shard
        self.attempt, self.round, self.held = 0, 0, {}
        self.released = []

    def encode(self, request, device):
        self.held[request.request_id] = (device,)
        self.attempt += request.width == min(self.sizes)
        self.round = 0
        return True

    def move(self, rid, group):
        self.held[rid] = group
        self.round += len(group) == 2  # rounds counted by moves onto the pair

    def submit(self, commands):
        out = {}
        for d, c in commands.items():
            assert isinstance(c, cmd.Step) and self.held[c.request_ids[0]] == c.devices
            secs = self.base if len(c.devices) == 1 else self.shard(self.attempt, self.round)
            fut = Future()
            fut.set_result(cmd.Reply(d, True, seconds=secs, cpu_seconds=secs,
                                     process_cpu_seconds=secs))
            out[d] = fut
        return out

    def release(self, rid):
        self.released.append(rid)
        del self.held[rid]


def test_calibrate_measures_again_and_refuses_what_stays_implausible():
    quiet = lambda attempt, r: 0.055  # noqa: E731  (x1.82, ranks' work x1.1)
    contended = lambda attempt, r: 0.075  # noqa: E731  (x1.33, ranks' work x1.5)
    node = FakeNode(0.1, quiet)
    node.sizes = [64, 128]
    lines = []
    rows = calibrate(node, [64, 128], 3, report=lines.append)
    assert node.attempt == 1 and not any("implausible" in x for x in lines)
    d2 = [r for r in rows if r["degree"] == 2]
    assert [r["cpu_speedup"] for r in d2] == pytest.approx([0.1 / 0.055] * 2)
    assert all(r["rounds"] == 3 and r["work_inflation"] == pytest.approx(1.1) for r in d2)
    assert all(r["imbalance"] == pytest.approx(1.0) for r in d2)
    assert sorted(node.released) == ["speedup-128", "speedup-64"]

    node = FakeNode(0.1, lambda attempt, r: 0.075 if attempt == 1 else 0.055)
    node.sizes = [64, 128]
    lines = []
    rows = calibrate(node, [64, 128], 3, report=lines.append)
    assert node.attempt == 2
    assert any("1/2 is implausible" in x and "measuring again" in x for x in lines)
    assert max(r["cpu_speedup"] for r in rows) == pytest.approx(0.1 / 0.055)

    node = FakeNode(0.1, contended)
    node.sizes = [64, 128]
    lines = []
    with pytest.raises(CalibrationError, match="after 2 measurements") as err:
        calibrate(node, [64, 128], 3, report=lines.append)
    assert any("2/2 is implausible" in x and "refusing it" in x for x in lines)
    assert not err.value.waited_only


class WaitingNode(FakeNode):
    """Degree-2 ranks busy 0.055 s of CPU but 0.09 s of wall time (waiting for cores)."""

    def submit(self, commands):
        out = super().submit(commands)
        if len(commands) == 2:
            for fut in out.values():
                fut.result().seconds = 0.09
        return out


def test_a_table_failing_only_for_waits_says_so():
    node = WaitingNode(0.1, lambda attempt, r: 0.055)
    node.sizes = [64]
    with pytest.raises(CalibrationError, match="on wall time") as err:
        calibrate(node, [64], 3, report=lambda _: None)
    assert err.value.waited_only  # cpu x1.82 vs wall x1.11: only the wall-gap rule
    rows = calibrate(node, [64], 3, clock="wall", report=lambda _: None)
    assert rows[1]["speedup"] == pytest.approx(0.1 / 0.09)


def test_rounds_go_on_while_ratios_spread_up_to_the_cap():
    # round 0 is warm-up; kept rounds alternate 0.08 / 0.05 s per rank: ratios 1.25 / 2.0
    noisy = lambda attempt, r: 0.05 if r % 2 else 0.08  # noqa: E731
    node = FakeNode(0.1, noisy)
    node.sizes = [64]
    (d1, d2) = measure_speedups(node, [64], 3, max_rounds=7)
    assert d2["rounds"] == 7 and d2["spread"] > 0.10
    assert d2["ratios"][:2] == pytest.approx([1.25, 2.0])
    steady = FakeNode(0.1, lambda attempt, r: 0.05)
    steady.sizes = [64]
    (_, d2) = measure_speedups(steady, [64], 3, max_rounds=7)
    assert d2["rounds"] == 3 and d2["spread"] == 0.0
