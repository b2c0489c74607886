"""TimingNoise: its statistics against the lognormal it claims (per kind and class of work
too), its seeding, and ``--bias``'s parsing."""

import math
import random
import re
import statistics

import pytest

from ditmem.scheduler.noise import TimingNoise, parse_bias, shape_class, step_class


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


# ---- drift by kind and class ----------------------------------------------------------------
DRIFT = {"encode": 0.29, "move": 1.42, "step:2048x2048": 0.1, "step:d2": -0.1,
         "decode:512x512": 0.5}


@pytest.mark.parametrize("kind,key,factor", [
    ("encode", "512x512", 1.29),                      # kind listed: replaces the plain bias
    ("move", "peer", 2.42),
    ("step", "512x512", 1.05),                        # unlisted class: the plain bias
    ("step", "2048x2048", 1.05 * 1.1),                # class on top of the kind's (plain)
    ("step", ("2048x2048", "d2"), 1.05 * 1.1 * 0.9),  # two classes: both apply
    ("step", ("1024x1024", "d2"), 1.05 * 0.9),
    ("decode", "512x512", 1.05 * 1.5),
    ("decode", "1024x1024", 1.05),
    (None, "2048x2048", 1.05),                        # no kind: the plain bias only
])
def test_mean_and_spread_per_kind_and_class_match_the_formula(kind, key, factor):
    noise = TimingNoise(sigma=0.03, bias=0.05, seed=11, bias_by=DRIFT)
    draws = [noise.draw(2.0, kind, key) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(2.0 * factor, rel=2e-3)
    logs = [math.log(d / (2.0 * factor)) for d in draws]
    assert statistics.pstdev(logs) == pytest.approx(0.03, rel=0.03)
    assert statistics.fmean(logs) == pytest.approx(-0.03**2 / 2, abs=5e-4)


def _old_draws(sigma, bias, seed, predicted):
    """The draw before ``bias_by`` existed (a reference implementation of the formula)."""
    rng = random.Random(seed)
    return [p if p <= 0 else p * (1.0 + bias) * math.exp(sigma * rng.gauss(0.0, 1.0) - sigma**2 / 2)
            for p in predicted]


def test_plain_bias_draws_are_bit_identical_to_before_whatever_kind_and_class():
    predicted = [0.5, 0.0, 3.25, 1e-3, 7.0] * 200
    kinds = [("step", ("2048x2048", "d2")), ("encode", "512x512"), (None, ()), ("move", "peer"),
             ("decode", "1024x1024")]
    noise = TimingNoise(0.03, 0.1, 4)
    new = [noise.draw(p, *kinds[i % len(kinds)]) for i, p in enumerate(predicted)]
    assert new == _old_draws(0.03, 0.1, 4, predicted)  # exact equality, not approx


def test_unlisted_kinds_draw_exactly_what_a_plain_noise_draws():
    """Listing encode and a step class changes nothing else: a decode and a 512² step keep
    the plain noise's values (same seed, same call order)."""
    calls = [("decode", "512x512"), ("step", "512x512"), ("move", "")] * 50
    plain, drift = TimingNoise(0.03, 0.1, 9), TimingNoise(0.03, 0.1, 9,
                                                         {"encode": 0.3, "step:1024x1024": 0.2})
    assert [drift.draw(1.5, *c) for c in calls] == [plain.draw(1.5, *c) for c in calls]


def test_drift_draws_repeat_exactly_for_a_seed():
    calls = [("step", ("2048x2048", "d2")), ("encode", "x"), ("move", "peer")] * 30
    a, b, c = (TimingNoise(0.03, 0.0, s, DRIFT) for s in (3, 3, 4))
    first = [a.draw(1.0, *k) for k in calls]
    assert first == [b.draw(1.0, *k) for k in calls]
    assert first != [c.draw(1.0, *k) for k in calls]


def test_no_spread_gives_the_factor_exactly_and_exact_needs_every_bias_zero():
    noise = TimingNoise(sigma=0.0, bias_by={"move": 1.42, "step:d2": -0.1})
    assert not noise.exact
    assert noise.draw(2.0, "move", "peer") == pytest.approx(4.84)
    assert noise.draw(2.0, "step", ("1024x1024", "d2")) == pytest.approx(1.8)
    assert noise.draw(2.0, "step", ("1024x1024", "d1")) == 2.0
    assert TimingNoise(sigma=0.0, bias_by={"move": 0.0}).exact


def test_shape_and_step_classes():
    from ditmem.scheduler import Request
    small = Request("a", 0.0, width=512, height=512)
    large = Request("b", 0.0, width=2048, height=2048)
    video = Request("c", 0.0, "wan2.2-a14b", 1280, 720, 81)
    assert shape_class(small) == "512x512" and shape_class(video) == "1280x720x81"
    assert step_class([small, large, small]) == "2048x2048"  # a packed step: its largest


@pytest.mark.parametrize("by,part", [
    ({"stp": 0.1}, "'stp'"), ({"step:": 0.1}, "'step:'"), ({"move": -1.0}, r"bias_by\['move'\]"),
    ({"encode": math.nan}, "'encode'"), ({"decode:1x1": "0.1"}, "'decode:1x1'"),
])
def test_bad_bias_by_names_the_key(by, part):
    with pytest.raises(ValueError, match=part):
        TimingNoise(bias_by=by)


def test_parse_bias_reads_a_number_or_kinds_and_classes():
    assert parse_bias("0.1") == (0.1, {})
    assert parse_bias(" -0.2 ") == (-0.2, {})
    assert parse_bias("move=1.42,encode=0.29,step:d2=-0.1") == (
        0.0, {"move": 1.42, "encode": 0.29, "step:d2": -0.1})
    assert parse_bias("0.05,step:2048x2048=0.1") == (0.05, {"step:2048x2048": 0.1})


@pytest.mark.parametrize("text,part", [
    ("", "--bias"), ("0.1,0.2", "'0.2'"), ("move=fast", "'fast'"), ("mov=0.1", "'mov'"),
    ("move=0.1,move=0.2", "'move' given twice"), ("step:d2=-1", "step:d2"), ("0.1,", "''"),
])
def test_parse_bias_names_the_bad_item(text, part):
    with pytest.raises(ValueError, match=part):
        parse_bias(text)


@pytest.mark.parametrize("key", ["step:2048X2048", "step:2048*2048", "step:d 2", "encode:d2",
                                 "decode:peer", "move:p2p", "move:1024x1024"])
def test_a_class_no_draw_can_name_is_refused_naming_the_key(key):
    """A class that no draw site passes would drift nothing, silently: a shape is
    ``WxH`` or ``WxHxF``, a degree ``dN`` (steps only), a move's kind one of the node's."""
    with pytest.raises(ValueError, match=re.escape(f"'{key}'")):
        TimingNoise(bias_by={key: 0.1})


def test_every_class_a_draw_site_passes_is_accepted():
    from ditmem.scheduler.node.cost import MOVE_KINDS

    by = {"step:1024x1024": 0.1, "step:1280x720x81": 0.1, "step:d2": -0.1,
          "encode:512x512": 0.2, "decode:1280x720x81": 0.1,
          **{f"move:{k}": 1.0 for k in MOVE_KINDS}}
    assert TimingNoise(bias_by=by).factor("move", "peer") == 2.0
