"""Node groups and the node cost model: degrees, re-sharding and moves, hand-computed."""

import pytest
from node_factories import node_cost
from sched_factories import PAGE, req

from ditmem.scheduler.node.cost import reshard_fraction
from ditmem.scheduler.node.device import Job, Move, VirtualDevices
from ditmem.scheduler.node.topology import Group, Node


def test_eight_devices_have_15_aligned_groups_created_once():
    node = Node(8)
    assert [len(node.groups(d)) for d in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert len(node.groups()) == 15
    assert node.groups(4) is node.groups(4)
    assert list(Group(4, 1).devices) == [4, 5, 6, 7]
    assert Group(2, 1).mask == 0b1100
    assert node.parent(Group(1, 5)) == Group(2, 2)
    assert node.parent(Group(8, 0)) is None
    assert node.group_of(6, 4) == Group(4, 1)
    # Free devices 0, 1, 2 and 3: the quad 0-3, pairs 0-1 and 2-3; nothing at 8.
    assert node.free_groups(0b00001111, 4) == [Group(4, 0)]
    assert node.free_groups(0b00001111, 2) == [Group(2, 0), Group(2, 1)]
    assert node.free_groups(0b00001111, 8) == []
    with pytest.raises(ValueError, match="degree 3"):
        node.groups(3)
    with pytest.raises(ValueError, match="devices"):
        Node(0)


def test_non_power_of_two_node_keeps_aligned_groups():
    node = Node(6)
    assert node.degrees == (1, 2, 4)
    assert node.groups(4) == (Group(4, 0),)
    assert len(node.groups(2)) == 3


@pytest.mark.parametrize(
    "src, dst, fraction",
    [
        (Group(1, 0), Group(1, 0), 0.0),  # stays
        (Group(1, 0), Group(2, 0), 0.5),  # device 1 gets its half, device 0 has it
        (Group(2, 0), Group(1, 1), 0.5),  # device 1 held the second half, needs the first
        (Group(2, 0), Group(1, 0), 0.5),
        (Group(1, 0), Group(1, 1), 1.0),  # a peer copy of everything
        (Group(2, 0), Group(4, 0), 0.25),  # devices 2, 3 get a quarter each
        # device 0 needs [0, .5) and holds [0, .25): gets .25; device 1 needs [.5, 1) and
        # holds [.25, .5): gets .5 (the largest receiver sets the time)
        (Group(4, 0), Group(2, 0), 0.5),
        (Group(2, 1), Group(2, 0), 0.5),  # disjoint pairs: each receives its half
    ],
)
def test_reshard_fraction_by_hand(src, dst, fraction):
    assert reshard_fraction(src, dst) == pytest.approx(fraction)


def test_step_time_at_a_degree_divides_by_the_speed_up():
    nc = node_cost()
    big, small = req("b", size=1024), req("s", size=512)
    assert nc.step_time("qwen-image", [4096], 1) == pytest.approx(4.0)
    assert nc.step_time("qwen-image", [4096], 2) == pytest.approx(2.0)
    assert nc.step_time("qwen-image", [4096], 4) == pytest.approx(1.25)
    assert nc.step_time("qwen-image", [1024], 4) == pytest.approx(1.0)
    assert nc.remaining(big, 1, 2) == pytest.approx(3 * 2.0)
    assert nc.standalone(small) == pytest.approx(4.0)


def test_move_costs_by_hand():
    nc = node_cost(peer=1e9, host=1e8)
    r = req("r", size=512)
    nbytes = PAGE  # state of one request in the test profile
    assert nc.move_time(r, None, Group(2, 0)) == (pytest.approx(nbytes / 2 / 1e8), "restore")
    assert nc.move_time(r, Group(1, 0), Group(1, 0)) == (0.0, "none")
    assert nc.move_time(r, Group(1, 0), Group(1, 1)) == (pytest.approx(nbytes / 1e9), "peer")
    assert nc.move_time(r, Group(2, 0), Group(4, 0)) == (pytest.approx(nbytes / 4 / 1e9), "peer")
    assert nc.offload_time(r, Group(2, 0)) == pytest.approx(nbytes / 2 / 1e8)
    # When the peer link is slower than going through the host, the host path is chosen.
    slow = node_cost(peer=1e6, host=1e8)
    secs, kind = slow.move_time(r, Group(1, 0), Group(1, 1))
    assert kind == "host" and secs == pytest.approx(2 * nbytes / 1e8)


def test_job_timings_on_virtual_devices_by_hand():
    nc = node_cost(peer=1e9, host=1e8)
    a, b = req("a", size=1024), req("b", size=1024)
    job = Job(0, Group(2, 0), [a], steps=3, moves=[Move(a, Group(1, 1), Group(2, 0)),
                                                   Move(b, Group(1, 0), None)])
    t = VirtualDevices(nc).timings(job)
    assert t.transfer_s == pytest.approx(PAGE * 0.5 / 1e9 + PAGE / 1e8)
    assert t.step_s == pytest.approx(3 * 2.0)
    assert t.encode_s == 0.0 and t.decode_s == 0.0


def test_correction_learns_a_slow_device_at_any_degree():
    nc = node_cost()
    for _ in range(100):
        nc.observe_step("qwen-image", [4096], 2, 3, 3 * 2.0 * 1.2)  # 20 % slower
    assert nc.correction("qwen-image") == pytest.approx(1.2, 1e-3)
    assert nc.step_time("qwen-image", [4096], 4) == pytest.approx(1.25 * 1.2, 1e-3)
