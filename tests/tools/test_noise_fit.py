"""benchmarks/parallel/noise_fit.py: the per-class figures of a run's measured jobs."""

import math

import pytest


@pytest.fixture(scope="module")
def noise_fit(load_benchmark):
    return load_benchmark("parallel/noise_fit.py")


def test_figures_of_hand_made_jobs(noise_fit):
    """Four single 256² steps at ratios 1, 2, 1, 2 (alternating: lag-1 autocorrelation −1;
    σ of the log ratio = log 2 / 2), one multi-step job left out, a decode on its own."""
    rows = [["steps d1", "256x256", 1, r, 1.0] for r in (1.0, 2.0, 1.0, 2.0)]
    rows += [["steps d1", "256x256", 5, 50.0, 1.0], ["decodes", "256x256", 1, 3.0, 2.0]]
    got = noise_fit.stats(rows)
    assert [(r["stage"], r["class"], r["jobs"]) for r in got] == [
        ("decodes", "256x256", 1), ("steps d1", "256x256", 4)]
    step = got[1]
    assert step["sigma"] == pytest.approx(math.log(2) / 2)
    assert step["lag1"] == pytest.approx(-1.0)
    assert step["median"] in (pytest.approx(1.0), pytest.approx(2.0))
    assert got[0]["median"] == pytest.approx(1.5) and got[0]["lag1"] == 0.0
