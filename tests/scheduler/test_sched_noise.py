"""TimingNoise: its statistics against the lognormal it claims, and its seeding."""

import math
import statistics

import pytest

from ditmem.scheduler.noise import TimingNoise


def test_mean_and_spread_match_the_lognormal():
    noise = TimingNoise(sigma=0.03, bias=0.1, seed=7)
    draws = [noise.draw(2.0) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(2.2, rel=2e-3)
    logs = [math.log(d / 2.2) for d in draws]
    assert statistics.pstdev(logs) == pytest.approx(0.03, rel=0.03)
    assert statistics.fmean(logs) == pytest.approx(-0.03**2 / 2, abs=5e-4)


def test_same_seed_same_draws_other_seed_other_draws():
    a = [TimingNoise(seed=1).draw(1.0) for _ in range(3)]
    b1, b2 = TimingNoise(seed=1), TimingNoise(seed=2)
    assert [b1.draw(1.0) for _ in range(3)] != a  # new object per draw above: all first draws
    assert len(set(a)) == 1
    assert [TimingNoise(seed=1).draw(1.0)] == [a[0]]
    assert b2.draw(1.0) != a[0]


def test_zero_noise_is_exact_and_zero_durations_stay_zero():
    assert TimingNoise(sigma=0.0).draw(1.25) == 1.25
    assert TimingNoise(sigma=0.0).exact
    assert TimingNoise(sigma=0.5, bias=0.2).draw(0.0) == 0.0
    assert TimingNoise(sigma=0.0, bias=0.5).draw(2.0) == pytest.approx(3.0)


@pytest.mark.parametrize("kw,name", [({"sigma": -0.1}, "sigma"), ({"sigma": math.nan}, "sigma"),
                                     ({"bias": -1.0}, "bias"), ({"bias": math.inf}, "bias")])
def test_bad_settings_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        TimingNoise(**kw)
