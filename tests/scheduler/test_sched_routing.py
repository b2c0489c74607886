"""The replica routing rule and its baselines, with fake replicas and hand-computed stats."""

import pytest

from ditmem.scheduler.routing import (
    MAX_DUE,
    PowerOfTwo,
    ReplicaLoad,
    RoundRobin,
    RouteRequest,
    RoutingBook,
    choose_ditmem,
    estimate,
    load_of,
    make_router,
    rank_replicas,
)


def load(name, items=(), free=100, at=0.0, speed=1.0, devices=1):
    """A report of live requests ``(priority, deadline, remaining_s)`` at ``at``."""
    return load_of(name, list(items), free, 100, at, speed, devices)


def req(work, deadline, priority=1, pages=1, rid="r"):
    return RouteRequest(rid, work, pages, priority, deadline)


def test_estimate_ages_the_report_earliest_deadline_first():
    rep = load("a", [(0, 50.0, 2.0), (2, 20.0, 3.0), (1, 90.0, 5.0)], at=10.0)
    est = estimate(rep, [], now=14.0)
    # deadline order 20 (3 s), 50 (2 s), 90 (5 s): 4 s of work take the first and 1 s of
    # the second
    assert est.due == [[50.0, 1.0, 0], [90.0, 5.0, 1]]
    assert est.total_s == 6.0


def test_estimate_adds_what_was_sent_after_the_report_and_drops_older():
    book = RoutingBook()
    book.record("a", req(4.0, 100.0, priority=2, pages=7), now=1.0)   # before the report
    book.record("a", req(3.0, 30.0, priority=0, pages=5), now=6.0)    # after it
    sent = book.since("a", reported_at=5.0)
    assert [s.request.work_s for s in sent] == [3.0]
    est = estimate(load("a", [(1, 60.0, 2.0)], at=5.0, free=20), sent, now=7.0)
    # 5 -> 6: one second of the deadline-60 work; 3 s due at 30 arrive; 6 -> 7: one
    # second of those (earlier deadline)
    assert est.due == [[30.0, 2.0, 0], [60.0, 1.0, 1]]
    assert est.free_pages == 15 and est.ongoing == 2
    assert book.since("a", reported_at=6.5) == []


def test_a_request_in_transit_when_its_replica_reported_still_counts():
    # Sent at 4.0, reported at 5.0 without it (it had not reached the engine yet): with a
    # transit allowance the book keeps it until a report lists it among its live ids.
    book = RoutingBook(transit_s=10.0)
    book.record("a", req(40.0, 100.0, rid="big"), now=4.0)
    book.record("a", req(1.0, 100.0, rid="old"), now=-20.0)  # older than any transit
    assert [s.request.id for s in book.since("a", 5.0)] == ["big"]
    busy = load("a", at=5.0)
    ranked = rank_replicas(req(1.0, 100.0, rid="small"), [busy, load("b", at=5.0)], book, 5.0)
    assert ranked[0].replica == "b"
    # A later report that lists it covers it: no double count.
    listed = load_of("a", [(1, 100.0, 39.0)], 100, 100, 6.0, ids=["big"])
    assert listed.live == frozenset({"big"})
    assert book.since("a", 6.0, listed.live) == []
    # Without the allowance (the simulator: replicas receive a request when it is routed)
    # every report covers what was sent before it.
    plain = RoutingBook()
    plain.record("a", req(40.0, 100.0, rid="big"), now=4.0)
    assert plain.since("a", 5.0) == []


def test_live_ids_survive_the_stats_round_trip():
    rep = load_of("a", [(0, 50.0, 2.0)], 10, 100, 1.0, ids=["x", "y"])
    assert ReplicaLoad.from_dict(rep.as_dict()).live == frozenset({"x", "y"})


def test_comfortably_on_time_everywhere_means_the_least_total_work_wins():
    # a: 10 s due at 50 runs first, the request finishes at 11 (89 s to spare of 100);
    # b: 20 s due at 190, the request runs first and finishes at 1: both comfortable, and
    # a holds less work.
    loads = [load("a", [(1, 50.0, 10.0)]), load("b", [(1, 190.0, 20.0)])]
    ranked = rank_replicas(req(1.0, 100.0), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier, s.finish) for s in ranked] == [("a", 0, 11.0), ("b", 0, 1.0)]


def test_an_idle_replica_that_measured_itself_slow_still_gets_work():
    # slow: idle, last measured 5x the profile; fast: 1 s of work. Deadline 100: on time
    # with room on both, and the idle one holds no work.
    loads = [load("fast", [(1, 50.0, 1.0)]), load("slow", speed=5.0)]
    ranked = rank_replicas(req(1.0, 100.0), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier, s.finish) for s in ranked] == [("slow", 0, 5.0),
                                                                ("fast", 0, 2.0)]


def test_when_time_is_tight_the_earliest_finish_wins():
    # Deadline 10: a finishes at 6 (4 s to spare of 10: tight), b at 8; a wins though it
    # holds more work in all.
    loads = [load("a", [(1, 5.0, 5.0), (2, 99.0, 20.0)]), load("b", [(1, 5.0, 7.0)])]
    ranked = rank_replicas(req(1.0, 10.0), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier, s.finish) for s in ranked] == [("a", 1, 6.0), ("b", 1, 8.0)]


def test_work_due_later_does_not_count_as_ahead():
    # a holds 10 s due at 60 (it has slack 50): a 1 s request due at 2.5 runs first there
    # (finish 1.0) and the 10 s one still finishes at 11 <= 60; b holds 2 s due at 2.2,
    # which runs first: the request finishes at 3.0 > 2.5, though b has less work.
    loads = [load("a", [(2, 60.0, 10.0)]), load("b", [(1, 2.2, 2.0)])]
    ranked = rank_replicas(req(1.0, deadline=2.5), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("a", 0), ("b", 3)]
    assert [s.finish for s in ranked] == pytest.approx([1.0, 3.0])


def test_a_tie_on_finish_goes_to_the_replica_with_less_work():
    loads = [load("a", [(1, 60.0, 10.0)]), load("b", [(1, 60.0, 3.0)])]
    ranked = rank_replicas(req(1.0, deadline=5.0), loads, RoutingBook(), now=0.0)
    assert [s.replica for s in ranked] == ["b", "a"]
    assert ranked[0].finish == ranked[1].finish == 1.0


def test_pushing_another_request_past_its_deadline_ranks_below_a_clean_placement():
    # a: the new request (due 5) runs first (finish 1), then a priority-2 request of 5 s
    # due at 5.5 ends at 6 instead of 5: late by 0.5 (weight 1). b: it waits 2 s behind
    # work due at 3 and finishes at 3 <= 5 (2 s to spare of 5: tier 1), hurting no one.
    loads = [load("a", [(2, 5.5, 5.0)]), load("b", [(0, 3.0, 2.0)])]
    ranked = rank_replicas(req(1.0, deadline=5.0, priority=0), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("b", 1), ("a", 2)]
    assert ranked[1].key == pytest.approx(0.5)


def test_harm_is_weighted_by_the_priority_of_who_is_hurt():
    loads = [load("a", [(0, 5.5, 5.0)]), load("b", [(2, 5.5, 5.0)])]
    ranked = rank_replicas(req(1.0, deadline=2.0), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier, s.key) for s in ranked] == [("b", 2, 0.5), ("a", 2, 1.5)]


def test_a_request_already_late_is_not_counted_as_harm():
    loads = [load("a", [(2, 3.0, 5.0)]), load("b", [(1, 0.5, 5.0)])]
    ranked = rank_replicas(req(1.0, deadline=2.0, priority=0), loads, RoutingBook(), 0.0)
    # a: the 5 s request due at 3 ends at 5 anyway (late before and after): tier 0
    assert ranked[0].replica == "a" and ranked[0].tier == 0


def test_when_every_replica_misses_the_least_total_work_wins():
    # A late request waits behind its replica's on-time work (the slo policy's late lane):
    # b has the least work in all (6 s) though c has the least due before the deadline.
    loads = [load("a", [(1, 1.0, 9.0)]), load("b", [(1, 1.0, 3.0), (2, 90.0, 3.0)]),
             load("c", [(1, 1.0, 2.0), (2, 90.0, 5.0)])]
    ranked = rank_replicas(req(1.0, deadline=2.0), loads, RoutingBook(), now=0.0)
    assert [s.replica for s in ranked] == ["b", "c", "a"]
    assert {s.tier for s in ranked} == {3}
    assert [s.key for s in ranked] == pytest.approx([7.0, 8.0, 10.0])


def test_missing_pages_mean_waiting_for_the_whole_backlog():
    # a has little urgent work but too few free pages: the request waits for its whole
    # backlog (1 + 8 s) -> finish 10 > deadline; b has room and finishes at 5.
    loads = [load("a", [(1, 3.0, 1.0), (2, 90.0, 8.0)], free=2), load("b", [(1, 5.0, 4.0)])]
    ranked = rank_replicas(req(1.0, deadline=6.0, pages=10), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("b", 1), ("a", 3)]
    assert ranked[1].finish == pytest.approx(10.0)


def test_a_slower_replica_counts_the_request_longer():
    # b reports less work but runs 3x slower than the profile: the 2 s request takes 6 s
    # there and finishes at 1 + 6 = 7, past the 6.5 s deadline; on a at 4 + 2 = 6.
    loads = [load("a", [(1, 5.0, 4.0)]), load("b", [(1, 5.0, 1.0)], speed=3.0)]
    ranked = rank_replicas(req(2.0, deadline=6.5), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("a", 1), ("b", 3)]
    assert ranked[1].finish == pytest.approx(7.0)


def test_on_a_node_a_request_alone_still_takes_its_one_device_time():
    # An idle 8-device node drains 8 device-seconds a second (speed 1/8), but one 8 s
    # request alone is not 8 x faster: it finishes at 8 s at best, past a 5 s deadline.
    # All three miss, so the least total work after placement ranks first (node 1 s,
    # busy 2 + 1 s, one 1 + 8 s).
    node = load("node", speed=1 / 8, devices=8)
    busy = load("busy", [(1, 1.0, 2.0)], speed=1 / 8, devices=8)
    one = load("one", [(1, 1.0, 1.0)])
    ranked = rank_replicas(req(8.0, deadline=5.0), [one, node, busy], RoutingBook(), 0.0)
    assert {s.replica: s.finish for s in ranked} == \
        pytest.approx({"node": 8.0, "one": 9.0, "busy": 10.0})
    assert [s.replica for s in ranked] == ["node", "busy", "one"]
    # It adds its 8 device-seconds (1 s of the node) to the work others wait behind.
    book = RoutingBook()
    book.record("node", req(8.0, deadline=50.0), now=0.0)
    assert estimate(node, book.since("node", 0.0), now=0.0).total_s == 1.0


def test_what_the_router_sent_since_the_last_report_counts():
    # Both replicas reported idle at t=0; without the book every request would go to a.
    loads = [load("a"), load("b")]
    book = RoutingBook()
    picks = [choose_ditmem(req(w, 100.0, rid=str(i)), loads, book, now=0.0)
             for i, w in enumerate([8.0, 1.0, 1.0, 1.0, 6.0])]
    # a: 8 s; b: 1, 2, 3 s, then the 6 s request finishes at 14 on a, 9 on b.
    assert picks == ["a", "b", "b", "b", "b"]


def test_round_robin_ignores_load():
    loads = [load("a", [(1, 60.0, 50.0)]), load("b"), load("c")]
    rr, book = RoundRobin(), RoutingBook()
    assert [rr.choose(req(1.0, 9.0), loads, book, 0.0) for _ in range(5)] == \
        ["a", "b", "c", "a", "b"]


def test_power_of_two_counts_requests_not_seconds():
    # Two replicas: both are always sampled; a holds one huge request, b three small ones.
    loads = [load("a", [(1, 900.0, 100.0)]),
             load("b", [(1, 9.0, 1.0), (1, 9.0, 1.0), (1, 9.0, 1.0)])]
    p2, book = PowerOfTwo(seed=1), RoutingBook()
    assert p2.choose(req(1.0, 9.0), loads, book, 0.0) == "a"
    assert p2.choose(req(1.0, 9.0), loads, book, 0.0) == "a"
    # a now holds 3 (1 reported + 2 routed), b 3: a tie either way, then the other one.
    third = p2.choose(req(1.0, 9.0), loads, book, 0.0)
    fourth = p2.choose(req(1.0, 9.0), loads, book, 0.0)
    assert {third, fourth} == {"a", "b"}


def test_load_of_orders_the_backlog_by_deadline():
    # (priority, deadline, remaining) run as: deadline 5 (p0) ends 11, 12 (p1) ends 13,
    # 20 (p1) ends 14, 40 (p2) ends 18.
    items = [(1, 20.0, 1.0), (0, 5.0, 1.0), (2, 40.0, 4.0), (1, 12.0, 2.0)]
    rep = load_of("a", items, free_pages=7, total_pages=9, now=10.0)
    assert rep.backlog_s == (1.0, 3.0, 4.0)
    assert rep.slack_s == (-6.0, -1.0, 22.0)
    assert rep.earliest_slack_s == -6.0
    assert rep.due == ((5.0, 1.0, 0), (12.0, 2.0, 1), (20.0, 1.0, 1), (40.0, 4.0, 2))
    assert (rep.free_pages, rep.total_pages, rep.ongoing, rep.reported_at) == (7, 9, 4, 10.0)
    assert ReplicaLoad.from_dict(rep.as_dict()) == rep


def test_a_long_backlog_is_reported_in_bounded_size_never_less_urgent():
    items = [(1, float(d), 1.0) for d in range(1, MAX_DUE + 11)]
    rep = load_of("a", items, 1, 1, 0.0)
    assert len(rep.due) == MAX_DUE
    assert rep.due[-1] == (float(MAX_DUE), 11.0, 1)   # the last 11, due at the earliest
    assert sum(w for _, w, _ in rep.due) == len(items)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="priority"):
        req(1.0, 2.0, priority=5)
    with pytest.raises(ValueError, match="missing field 'free_pages'"):
        ReplicaLoad.from_dict({"replica": "a", "backlog_s": [0, 0, 0],
                               "slack_s": [None] * 3, "total_pages": 1, "ongoing": 0,
                               "reported_at": 0})
    with pytest.raises(ValueError, match="one entry per"):
        ReplicaLoad.from_dict({"replica": "a", "backlog_s": [0, 0], "slack_s": [None] * 3,
                               "free_pages": 1, "total_pages": 1, "ongoing": 0,
                               "reported_at": 0})
    with pytest.raises(ValueError, match="router"):
        make_router("least-loaded")
    with pytest.raises(ValueError, match="no replica"):
        choose_ditmem(req(1.0, 2.0), [], RoutingBook(), 0.0)
