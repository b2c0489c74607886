"""The rebalancer's rule (routing.plan_moves): which parked requests move, and where, with
fake replicas and hand-computed schedules (times in seconds, all reports made at 0)."""

from ditmem.scheduler.routing import RouteRequest, RoutingBook, load_of, plan_moves


def load(name, items=()):
    """A report of live requests ``(priority, deadline, remaining_s)`` made at 0."""
    return load_of(name, list(items), 100, 100, 0.0, ids=[])


def parked(rid, work, deadline, priority=1):
    return RouteRequest(rid, work, 1, priority, deadline)


# Replica "a" holds a big request "b" (8 s left, due at 10) and the parked "p" (4 s left):
# run earliest deadline first, p finishes at 12.
def here(p_deadline):
    return load("a", [(1, 10.0, 8.0), (1, p_deadline, 4.0)])


def test_a_request_late_here_moves_where_it_is_comfortably_on_time():
    moves = plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [load("c")], RoutingBook(), 0.0,
                       move_s=0.5)
    assert moves == [("p", "c")]  # idle c: done at 4, deadline 11 - 0.5 for the move


def test_a_request_on_time_here_stays():
    assert plan_moves(here(12.0), [parked("p", 4.0, 12.0)], [load("c")], RoutingBook(),
                      0.0) == []


def test_a_request_late_everywhere_stays():
    busy = load("c", [(1, 5.0, 10.0)])  # 10 s due first: p would finish at 14 there
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [busy], RoutingBook(),
                      0.0) == []


def test_a_move_that_pushes_another_request_late_is_not_made():
    # c's request (7 s, due at 10.9) is due after p's deadline less the move (10.5): p runs
    # first there and finishes at 4, pushing it to 11 > 10.9
    other = load("c", [(1, 10.9, 7.0)])
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [other], RoutingBook(), 0.0,
                      move_s=0.5) == []
    roomy = load("c", [(1, 11.5, 7.0)])  # it still makes it (done at 11): the move is made
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [roomy], RoutingBook(), 0.0,
                      move_s=0.5) == [("p", "c")]


def test_the_move_time_counts_against_the_deadline():
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [load("c")], RoutingBook(), 0.0,
                      move_s=7.5) == []  # on time at 4, but not by 11 - 7.5
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [load("c")], RoutingBook(), 0.0,
                      move_s=6.5) == [("p", "c")]


def test_earliest_deadline_first_and_each_move_is_booked():
    a = load("a", [(1, 10.0, 8.0), (1, 11.0, 4.0), (1, 11.5, 4.0)])  # p done 12, q 16
    moves = [parked("q", 4.0, 11.5), parked("p", 4.0, 11.0)]
    assert plan_moves(a, moves, [load("c"), load("d")], RoutingBook(), 0.0) == [("p", "c")]
    both = plan_moves(a, moves, [load("c"), load("d")], RoutingBook(), 0.0, limit=2)
    assert both == [("p", "c"), ("q", "d")]  # c holds p now: d has less work


def test_the_replicas_speed_prices_the_move():
    slow = load_of("c", [], 100, 100, 0.0, speed=2.0)  # 4 s of work take 8 s there
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [slow], RoutingBook(), 0.0,
                      move_s=3.5) == []  # done at 8 > 11 - 3.5
    assert plan_moves(here(11.0), [parked("p", 4.0, 11.0)], [slow], RoutingBook(), 0.0,
                      move_s=2.5) == [("p", "c")]
