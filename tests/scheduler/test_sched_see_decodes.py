"""``slo(see_decodes=True)``: tiled decodes pending on the loop take device time before the
deadlines after theirs. Hand case: a 1024² decode has 4 s of tiles left, due at 5 s; B
(512², 1 step + its 1-s decode: 2 s) is due at 5.5 s, E (the same work) at 20 s. The tiles
run first (due earlier than either step), so B can finish at 6 s at best: a miss. Blind to
the decode the policy starts B; seeing it, B is set aside and E runs."""

import pytest
from sched_factories import HandEngine, req, table_cost

from ditmem.scheduler import PendingDecode, make_policy
from ditmem.scheduler.decode_lane import TiledDecodes

MP_1024 = 1024 * 1024 / 1e6


def _view_and_cost():
    cost = table_cost(seconds_1024=1.0, decode_s_per_mp=4.0 / MP_1024)
    eng = HandEngine(cost)
    a = req("a", -10.0, size=1024, steps=1, slo_ms=15_000, cost=cost)  # its steps are done
    b = eng.arrive(req("b", 0.0, size=512, steps=1, slo_ms=5_500, cost=cost))
    e = eng.arrive(req("e", 0.0, size=512, steps=1, slo_ms=20_000, cost=cost))
    view = eng.view()
    view.decodes = (PendingDecode(a, tiles_left=2, tiles=2),)
    return cost, view, b, e


def test_the_priced_decode_is_the_cost_models():
    cost, view, _, _ = _view_and_cost()
    assert cost.decode_time(view.decodes[0].request) == pytest.approx(4.0)


def test_blind_to_the_decode_the_policy_starts_the_request_that_will_miss():
    cost, view, b, _ = _view_and_cost()
    assert make_policy("slo", cost).schedule(0.0, view).batch == [b.id]


def test_seeing_the_decode_it_sets_that_request_aside_and_runs_the_other():
    cost, view, _, e = _view_and_cost()
    assert make_policy("slo", cost, see_decodes=True).schedule(0.0, view).batch == [e.id]


def test_a_decode_that_will_miss_anyway_takes_nothing():
    # due at 3 s with 4 s left: it cannot make it, so its tiles do not run before steps
    cost, view, b, _ = _view_and_cost()
    late = req("a", -12.0, size=1024, steps=1, slo_ms=15_000, cost=cost)
    view.decodes = (PendingDecode(late, tiles_left=2, tiles=2),)
    assert make_policy("slo", cost, see_decodes=True).schedule(0.0, view).batch == [b.id]


def test_tiled_decodes_list_what_is_pending_by_deadline():
    tiles = TiledDecodes()
    tiles.push("x", 9.0, [1.0, 1.0, 1.0])
    tiles.push("y", 4.0, [2.0])
    tiles.run_one("x")
    assert tiles.pending() == [("y", 1, 1), ("x", 2, 3)]


def test_a_joiner_is_judged_with_the_decodes_due_before_the_deadline():
    # 512² steps 1 s, two packed 1.5 s, a 512²'s decode 0.5 s; a pending 1024² decode has
    # 2 s of tiles, due at 3.5 s: its tiles run first. a (2 steps, due 4.8 s) alone: 2 + 1
    # + 1 + 0.5 = 4.5 s, met; with b joining its first step: 2 + 1.5 + 1 + 0.5 = 5.0 s, a
    # miss. The decode is due before a's deadline but after 4.8 - 1.5 = 3.3 s, so it must
    # still count in the window left after the longer step.
    cost = table_cost(seconds_1024=1.0, decode_s_per_mp=2.0 / MP_1024,
                      batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5}])
    eng = HandEngine(cost)
    d = req("d", -10.0, size=1024, steps=1, slo_ms=13_500, cost=cost)
    a = eng.arrive(req("a", 0.0, size=512, steps=2, slo_ms=4_800, cost=cost))
    b = eng.arrive(req("b", 0.0, size=512, steps=2, slo_ms=20_000, cost=cost))
    view = eng.view()
    view.decodes = (PendingDecode(d, tiles_left=2, tiles=2),)
    assert cost.decode_time(d) == pytest.approx(2.0)
    assert make_policy("slo", cost).schedule(0.0, view).batch == [a.id, b.id]  # blind
    assert make_policy("slo", cost, see_decodes=True).schedule(0.0, view).batch == [a.id]
