"""The replica routing rule and its baselines, with fake replicas and hand-computed stats."""

import pytest

from ditmem.scheduler.routing import (
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


def load(name, backlog=(0.0, 0.0, 0.0), slack=(None, None, None), free=100, ongoing=0, at=0.0):
    return ReplicaLoad(name, tuple(backlog), tuple(slack), free, 100, ongoing, at)


def req(work, deadline, priority=1, pages=1, rid="r"):
    return RouteRequest(rid, work, pages, priority, deadline)


def test_estimate_ages_the_report_highest_priority_first():
    est = estimate(load("a", backlog=(2.0, 3.0, 5.0), at=10.0), [], now=14.0)
    assert est.backlog_s == [0.0, 1.0, 5.0]


def test_estimate_adds_what_was_sent_after_the_report_and_drops_older():
    book = RoutingBook()
    book.record("a", req(4.0, 100.0, priority=2, pages=7), now=1.0)   # before the report
    book.record("a", req(3.0, 100.0, priority=0, pages=5), now=6.0)   # after it
    sent = book.since("a", reported_at=5.0)
    assert [s.request.work_s for s in sent] == [3.0]
    est = estimate(load("a", backlog=(0.0, 2.0, 0.0), at=5.0, free=20, ongoing=1), sent,
                   now=7.0)
    # 5 -> 6: one second of the priority-1 work; then 3 s of priority 0 arrive; 6 -> 7: one
    # second of those.
    assert est.backlog_s == [2.0, 1.0, 0.0]
    assert est.free_pages == 15 and est.ongoing == 2
    assert book.since("a", reported_at=6.5) == []


def test_short_backlog_wins_when_every_replica_meets_the_deadline():
    loads = [load("a", backlog=(0.0, 10.0, 0.0)), load("b", backlog=(0.0, 2.0, 0.0))]
    ranked = rank_replicas(req(1.0, 100.0), loads, RoutingBook(), now=0.0)
    assert [s.replica for s in ranked] == ["b", "a"]
    assert [s.tier for s in ranked] == [0, 0]


def test_deadline_beats_backlog_size():
    # a: 10 s of low-priority work (slack 5 s), nothing at priority 1 -> a priority-1
    # request of 1 s finishes at 1.0 there; b: 2 s of priority-1 work -> finishes at 3.0.
    loads = [load("a", backlog=(0.0, 0.0, 10.0), slack=(None, None, 5.0)),
             load("b", backlog=(0.0, 2.0, 0.0), slack=(None, 4.0, None))]
    ranked = rank_replicas(req(1.0, deadline=2.5), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("a", 0), ("b", 2)]
    assert ranked[0].finish == pytest.approx(1.0)
    assert ranked[1].finish == pytest.approx(3.0)


def test_pushing_another_request_past_its_deadline_ranks_below_a_clean_placement():
    # On a, the new high-priority request jumps a priority-2 request with 0.5 s of slack
    # (it would miss by 0.5 s); on b it meets and hurts no one, though b is busier.
    loads = [load("a", backlog=(0.0, 0.0, 1.0), slack=(None, None, 0.5)),
             load("b", backlog=(2.0, 0.0, 0.0), slack=(30.0, None, None))]
    ranked = rank_replicas(req(1.0, deadline=10.0, priority=0), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("b", 0), ("a", 1)]
    assert ranked[1].key == pytest.approx(0.5)


def test_a_lower_class_already_late_is_not_counted_as_harm():
    loads = [load("a", backlog=(0.0, 0.0, 1.0), slack=(None, None, -3.0)),
             load("b", backlog=(0.0, 5.0, 0.0))]
    ranked = rank_replicas(req(1.0, deadline=10.0, priority=0), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("a", 0), ("b", 0)]


def test_when_every_replica_misses_the_least_total_work_wins():
    # A late request waits behind its replica's on-time work (the slo policy's late lane):
    # b has the least work of all priorities (6 s), though c has the least at priority <= 1.
    loads = [load("a", backlog=(0.0, 9.0, 0.0)), load("b", backlog=(0.0, 3.0, 3.0)),
             load("c", backlog=(0.0, 2.0, 5.0))]
    ranked = rank_replicas(req(1.0, deadline=2.0), loads, RoutingBook(), now=0.0)
    assert [s.replica for s in ranked] == ["b", "c", "a"]
    assert {s.tier for s in ranked} == {2}
    assert [s.key for s in ranked] == pytest.approx([7.0, 8.0, 10.0])


def test_missing_pages_mean_waiting_for_the_whole_backlog():
    # a has little priority-1 work but too few free pages: the request waits for its whole
    # backlog (1 + 8 s) -> finish 10 > deadline; b has room and finishes at 5.
    loads = [load("a", backlog=(0.0, 1.0, 8.0), free=2), load("b", backlog=(0.0, 4.0, 0.0))]
    ranked = rank_replicas(req(1.0, deadline=6.0, pages=10), loads, RoutingBook(), 0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("b", 0), ("a", 2)]
    assert ranked[1].finish == pytest.approx(10.0)


def test_what_the_router_sent_since_the_last_report_counts():
    # Both replicas reported idle at t=0; without the book every request would go to a.
    loads = [load("a"), load("b")]
    book = RoutingBook()
    picks = [choose_ditmem(req(w, 100.0, rid=str(i)), loads, book, now=0.0)
             for i, w in enumerate([8.0, 1.0, 1.0, 1.0, 6.0])]
    # a: 8; b: 1, 2, 3, then the 6 s request: a would hold 14, b 9.
    assert picks == ["a", "b", "b", "b", "b"]


def test_a_slower_replica_counts_the_request_longer():
    # b reports less backlog but runs 3x slower than the profile: the 2 s request takes
    # 6 s there and finishes at 1 + 6 = 7, past the 6.5 s deadline; on a at 4 + 2 = 6.
    loads = [load("a", backlog=(0.0, 4.0, 0.0)),
             ReplicaLoad("b", (0.0, 1.0, 0.0), (None, None, None), 100, 100, 1, 0.0, 3.0)]
    ranked = rank_replicas(req(2.0, deadline=6.5), loads, RoutingBook(), now=0.0)
    assert [(s.replica, s.tier) for s in ranked] == [("a", 0), ("b", 2)]
    assert ranked[1].finish == pytest.approx(7.0)


def test_on_a_node_a_request_alone_still_takes_its_one_device_time():
    # An idle 8-device node drains 8 device-seconds per second (speed 1/8), but one 8 s
    # request alone is not 8 x faster: it finishes at 8 s at best, past a 5 s deadline;
    # the single device with 1 s of backlog finishes it at 9 s. Behind 16 device-seconds
    # of others' work on the node (2 s), it is queued 2 s, then runs 8 s.
    node = ReplicaLoad("node", (0.0, 0.0, 0.0), (None,) * 3, 100, 100, 0, 0.0, 1 / 8, 8)
    busy = ReplicaLoad("busy", (0.0, 2.0, 0.0), (None,) * 3, 100, 100, 2, 0.0, 1 / 8, 8)
    one = load("one", backlog=(0.0, 1.0, 0.0))
    ranked = rank_replicas(req(8.0, deadline=5.0), [one, node, busy], RoutingBook(), 0.0)
    assert {s.replica: s.finish for s in ranked} == \
        pytest.approx({"node": 8.0, "one": 9.0, "busy": 10.0})
    # All three miss: the least total work after placement ranks first (node 1 s, busy
    # 2 + 1 s, one 1 + 8 s).
    assert [s.replica for s in ranked] == ["node", "busy", "one"]
    # It adds its 8 device-seconds (1 s of the node) to the backlog others wait behind.
    book = RoutingBook()
    book.record("node", req(8.0, deadline=50.0), now=0.0)
    assert estimate(node, book.since("node", 0.0), now=0.0).backlog_s == [0.0, 1.0, 0.0]


def test_round_robin_ignores_load():
    loads = [load("a", backlog=(0.0, 50.0, 0.0)), load("b"), load("c")]
    rr, book = RoundRobin(), RoutingBook()
    assert [rr.choose(req(1.0, 9.0), loads, book, 0.0) for _ in range(5)] == \
        ["a", "b", "c", "a", "b"]


def test_power_of_two_counts_requests_not_seconds():
    # Two replicas: both are always sampled; a holds one huge request, b three small ones.
    loads = [load("a", backlog=(0.0, 100.0, 0.0), ongoing=1),
             load("b", backlog=(0.0, 3.0, 0.0), ongoing=3)]
    p2, book = PowerOfTwo(seed=1), RoutingBook()
    assert p2.choose(req(1.0, 9.0), loads, book, 0.0) == "a"
    assert p2.choose(req(1.0, 9.0), loads, book, 0.0) == "a"
    # a now holds 3 (1 reported + 2 routed), b 3: a tie either way, then the other one.
    third = p2.choose(req(1.0, 9.0), loads, book, 0.0)
    fourth = p2.choose(req(1.0, 9.0), loads, book, 0.0)
    assert {third, fourth} == {"a", "b"}


def test_load_of_runs_the_backlog_in_priority_then_deadline_order():
    # (priority, deadline, remaining) run as: p0 (deadline 5) ends 11, p1 (deadline 12)
    # ends 13, p1 (deadline 20) ends 14, p2 (deadline 40) ends 18.
    items = [(1, 20.0, 1.0), (0, 5.0, 1.0), (2, 40.0, 4.0), (1, 12.0, 2.0)]
    rep = load_of("a", items, free_pages=7, total_pages=9, now=10.0)
    assert rep.backlog_s == (1.0, 3.0, 4.0)
    assert rep.slack_s == (-6.0, -1.0, 22.0)
    assert rep.earliest_slack_s == -6.0
    assert (rep.free_pages, rep.total_pages, rep.ongoing, rep.reported_at) == (7, 9, 4, 10.0)
    assert ReplicaLoad.from_dict(rep.as_dict()) == rep


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
