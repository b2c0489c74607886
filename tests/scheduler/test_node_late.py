"""``slo``'s ``late_fill`` (off by default), hand-computed on two devices of the round-number
profile (``node_factories``: a 512² step 1 s at any degree, a 1024² step 4 s at degree 1 and
2 s at degree 2; encode and decode free). ``decode_guard`` and ``spare`` are off to isolate
the rule (L's window below is shorter than its work, which would make the decode guard hold
every last step back).

L, a 512² of 4 steps, is late on arrival (SLO 1 s for 4 s of work); B1 and B2, 1024² of 4
steps each, have 100 s and 102 s. Both large ones present, each runs at degree 1 and they
take both devices.

* default: L waits behind the on-time work: it starts at 12 s, after three of their steps;
* ``late_fill``: with L holding one device for its 4 s (× 1.1 margin), B1 and B2 still fit
  before their deadlines (16 + 16 device-seconds of 2 × 100 − 4.4), so L runs first: L 0–4 s
  on one device, B1 0–16 s on the other, B2 three steps 4–16 s on L's device and its last
  at degree 2, 16–18 s.
"""

import pytest
from node_factories import by_id, run
from sched_factories import req


def _records(b_slo_ms: float, **options) -> dict:
    trace = [req("b1", 0.0, size=1024, steps=4, slo_ms=b_slo_ms),
             req("b2", 0.0, size=1024, steps=4, slo_ms=b_slo_ms + 2_000),
             req("l", 0.0, size=512, steps=4, slo_ms=1_000)]
    return by_id(run(trace, "slo", 2, forecast=False, decode_guard=False, spare=False,
                     **options))


def test_by_default_a_late_request_waits_behind_on_time_work():
    out = _records(100_000)
    assert out["l"].started == pytest.approx(12.0, abs=0.05)
    assert out["l"].finished > 16.0


def test_late_fill_runs_it_while_every_on_time_request_stays_feasible():
    out = _records(100_000, late_fill=True)
    assert (out["l"].started, out["l"].finished) == pytest.approx((0.0, 4.0), abs=1e-6)
    assert out["b1"].finished == pytest.approx(16.0, abs=1e-6)
    assert (out["b2"].started, out["b2"].finished) == pytest.approx((4.0, 18.0), abs=0.01)
    assert out["b2"].degrees == {1: 3, 2: 1}


def _three(deadline_ms: float, **options) -> dict:
    """B1–B3 (1024², 4 steps, 16 s each at degree 1) due at ``deadline_ms``, and L; no
    parallel targets (``longest=0``) and not urgent (slack 10 s of 26 > 0.35 × 26), so at
    t = 0 both devices are free when step 5 asks ``_fill``."""
    trace = [req(f"b{i}", 0.0, size=1024, steps=4, slo_ms=deadline_ms) for i in (1, 2, 3)]
    trace.append(req("l", 0.0, size=512, steps=4, slo_ms=1_000))
    return by_id(run(trace, "slo", 2, forecast=False, decode_guard=False, spare=False,
                     longest=0, **options))


def test_late_fill_keeps_it_behind_when_the_on_time_ones_would_not_fit():
    """Due at 26 s: 3 × 16 = 48 device-seconds of on-time work against 2 × 26 − 4.4 = 47.6
    with L holding a device: ``_fits`` is False, L is not filled and the run is the
    default's to the last request. Due at 27 s: 54 − 4.4 = 49.6 >= 48, L goes first."""
    fill, default = _three(26_000, late_fill=True), _three(26_000)
    for rid in ("b1", "b2", "b3", "l"):
        assert (fill[rid].started, fill[rid].finished) == pytest.approx(
            (default[rid].started, default[rid].finished))
    assert fill["l"].started > 10.0
    assert _three(27_000, late_fill=True)["l"].started == pytest.approx(0.0)
    assert _three(27_000)["l"].started > 10.0


def _ride(**options) -> dict:
    """One device. B, a 1024² of 4 steps (100 s), and L, a 512² of 4 steps, late on arrival.
    The profile prices the pair's step at 4 s (a batch-2 point: 4 s at 2,560 tokens, a 0.8
    gain), the same as B alone: L joining B's step costs B nothing. ``aging`` 100 SLO windows:
    L does not starve here (with 10 it would go first at 11 s and B join its step)."""
    from node_factories import node_cost

    nc = node_cost(batch_points=[{"tokens": 2560, "batch": 2, "seconds": 4.0}])
    trace = [req("b", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("l", 0.0, size=512, steps=4, slo_ms=1_000)]
    return by_id(run(trace, "slo", 1, nc, forecast=False, decode_guard=False, aging=100.0,
                     **options))


def test_by_default_a_late_request_rides_a_larger_step():
    """L joins B's 4-s steps: both 0–16 s (each of L's steps takes 4 s, not its own 1 s)."""
    out = _ride()
    assert (out["b"].finished, out["l"].finished) == pytest.approx((16.0, 16.0))


def test_late_ride_keeps_it_off_a_step_more_than_twice_its_own():
    """``late_ride=2``: 4 s > 2 × 1 s, no ride: B 0–16 s, then L alone 16–20 s; a step of
    at most 4 × its own is ridden as by default."""
    out = _ride(late_ride=2.0)
    assert (out["b"].finished, out["l"].finished) == pytest.approx((16.0, 20.0))
    out = _ride(late_ride=4.0)
    assert (out["b"].finished, out["l"].finished) == pytest.approx((16.0, 16.0))
    with pytest.raises(ValueError, match="late_ride"):
        _ride(late_ride=0.5)


def test_a_request_that_cannot_make_it_alone_does_not_hold_back_the_others_last_steps():
    """The decode guard holds a last step back when it would leave no device for the tightest
    slack seen. A request whose SLO window is shorter than its work alone (L: 1 s for 4 s;
    a client may send such an ``slo_ms``) has no slack to protect: it must not make the guard
    hold back B1's and B2's last steps (defaults on; ``aging`` 100 windows so that L does not
    starve by 11 s and go first by that rule). Without L they end at 16 s; with it, the same,
    and L (late) runs after them (before the fix their last steps were held back at 12 s, L
    took both devices, and they ended at 18 and 20 s)."""
    trace = [req("b1", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("b2", 0.0, size=1024, steps=4, slo_ms=100_000)]
    alone = by_id(run(list(trace), "slo", 2, forecast=False, aging=100.0))
    both = by_id(run(trace + [req("l", 0.0, size=512, steps=4, slo_ms=1_000)], "slo", 2,
                     forecast=False, aging=100.0))
    assert alone["b1"].finished == pytest.approx(16.0)
    assert alone["b2"].finished == pytest.approx(16.0)
    assert both["b1"].finished == pytest.approx(16.0)
    assert both["b2"].finished == pytest.approx(16.0)
    assert both["l"].started >= 16.0 - 1e-9
