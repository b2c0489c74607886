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


def test_gaps_set_each_jobs_loop_span_beside_its_stages(noise_fit):
    """Two 256² step jobs (spans 10 and 12 ms, stages 8 and 9 ms) and one last step with its
    decode (span 1.0 s, stages 0.2 + 0.79 s), each row with its job's launch and end."""
    rows = [["steps d1", "256x256", 1, 0.008, 0.007, 0.0, 0.010],
            ["steps d1", "256x256", 1, 0.009, 0.007, 0.02, 0.032],
            ["steps d1", "256x256", 1, 0.2, 0.2, 1.0, 2.0],
            ["decodes", "256x256", 1, 0.79, 0.8, 1.0, 2.0]]
    got = noise_fit.gaps({"policy": "slo", "job_timings": {"rows": rows}})
    assert [(g["jobs"], g["n"]) for g in got] == [("steps d1 256x256", 2),
                                                  ("steps d1 256x256 +dec", 1)]
    steps, last = got
    assert steps["span_s"] == pytest.approx(0.022) and steps["stages_s"] == pytest.approx(0.017)
    assert steps["gap_s"] == pytest.approx(0.005) and steps["gap_median_s"] == pytest.approx(0.0025)
    assert steps["gap_p95_s"] == pytest.approx(0.003)
    assert last["gap_s"] == pytest.approx(0.01)
