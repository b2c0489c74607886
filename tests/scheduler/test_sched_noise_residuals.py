"""Measured noise pools (``TimingNoise.residuals``) and their fit from a run's jobs."""

import math

import pytest

from ditmem.scheduler.noise import TimingNoise, fit_residuals


def _cycle(noise, n, kind, key=()):
    return [noise.draw(1.0, kind, key) for _ in range(n)]


def test_a_pool_is_drawn_in_measured_order_from_a_seeded_start_and_recentred():
    logs = [math.log(1.0), math.log(2.0), math.log(4.0)]  # mean of exp: 7/3
    noise = TimingNoise(0.0, 0.0, 5, residuals={"step": logs})
    got = _cycle(noise, 6, "step", ("256x256", "d1"))
    base = [v * 3 / 7 for v in (1.0, 2.0, 4.0)]
    start = base.index(pytest.approx(got[0]))
    assert got == pytest.approx([base[(start + i) % 3] for i in range(6)])  # wraps, in order
    assert sum(got[:3]) / 3 == pytest.approx(1.0)  # E[true] = predicted over the pool
    again = TimingNoise(0.0, 0.0, 5, residuals={"step": logs})
    assert _cycle(again, 6, "step", ("256x256", "d1")) == got  # same seed, same draws


def test_the_most_specific_pool_is_used_and_the_bias_stays():
    pools = {"step": [0.0, 0.0], "step:1024x1024": [0.0, 0.0],
             "step:256x256:d2": [math.log(1.0), math.log(3.0)]}
    noise = TimingNoise(0.0, 0.0, 0, bias_by={"step": 1.0}, residuals=pools)
    both = sorted(_cycle(noise, 2, "step", ("256x256", "d2")))
    assert both == pytest.approx([2 * 0.5, 2 * 1.5])  # the shape-and-degree pool, × (1 + 1.0)
    assert _cycle(noise, 2, "step", ("1024x1024", "d2")) == pytest.approx([2.0, 2.0])
    assert _cycle(noise, 1, "step", ("512x512", "d1")) == pytest.approx([2.0])  # the kind's
    assert noise.draw(3.0, "encode", "256x256") == 3.0  # no pool, sigma 0: exact
    assert not noise.exact and TimingNoise(0.0).exact


@pytest.mark.parametrize("pools, word", [({"stp": [0.1]}, "key"), ({"step:a:b:c": [0.1]}, "key"),
                                         ({"step": []}, "non-empty"),
                                         ({"move": [float("nan")]}, "finite")])
def test_bad_pools_are_refused_naming_the_key(pools, word):
    with pytest.raises(ValueError, match=word):
        TimingNoise(residuals=pools)


def test_fit_keeps_single_pieces_of_work_per_kind_and_per_class():
    rows = [["steps d2", "256x256", 1, 2.0, 1.0], ["steps d2", "256x256", 1, 1.0, 1.0],
            ["steps d1", "1024x1024", 1, 0.5, 1.0], ["steps d1", "1024x1024", 3, 9.0, 1.0],
            ["encodes", "512x512", 1, 3.0, 1.5], ["moves", "offload,restore", 1, 1.0, 2.0],
            ["decodes", "256x256", 1, 0.0, 1.0]]
    got = fit_residuals(rows, min_samples=2)
    assert got == {"step": pytest.approx([math.log(2), 0.0, math.log(0.5)]),
                   "step:256x256:d2": pytest.approx([math.log(2), 0.0])}  # one encode, move
    one = fit_residuals(rows, min_samples=1)
    assert one["encode"] == pytest.approx([math.log(2)])
    assert one["move"] == pytest.approx([math.log(0.5)])
    assert "step:1024x1024:d1" in one and "step:1024x1024:d1" not in got
    for count in (1, 3):  # an unknown stage is refused even on a row the fit skips
        with pytest.raises(ValueError, match="stage"):
            fit_residuals([["frobs", "", count, 1.0, 1.0]])
    with pytest.raises(ValueError, match="min_samples"):
        fit_residuals(rows, min_samples=0)
