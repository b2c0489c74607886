"""A decode spread over its job's spare devices, tile by tile (``split_decodes``).
Hand-computed.

Profile (node_factories) plus a tile geometry: 512-px tiles with a 512-px stride, 1 s a
tile, so a 1024² decodes as 2 × 2 tiles of 1 s (4 s on one device) and a 512² as one tile
(whole; its per-megapixel time is 0 here). A 1024² steps in 4 s at degree 1, 2 s at degree
2; a 512² in 1 s. Host link 1.2 GB/s, 1 ms per command.
"""

import pytest
from node_factories import by_id, node_profile, run
from sched_factories import _v, req

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.cost import NodeCost, split_tiles
from ditmem.scheduler.node.device import decode_devices, decode_ends
from ditmem.scheduler.node.topology import Group

HOST = 1.2e9
LATENCY = 0.001
#: the blend of a 1024² split over two devices: the second device's half of the pixels (12
#: bytes each) over the host link, and three commands
BLEND = 1024 * 1024 * 0.5 * 12 / HOST + 3 * LATENCY


def _cost() -> NodeCost:
    prof = node_profile(host=HOST, move_latency=LATENCY)
    model = prof["models"]["qwen-image"]
    model.update(decode_tile_px=_v(512), decode_stride_px=_v(512), decode_tile_s=_v(1.0))
    return NodeCost(CostModel.from_dict(prof))


def test_tiles_round_robin_and_each_decode_gets_its_spare_devices():
    assert split_tiles(25, 2) == [list(range(0, 25, 2)), list(range(1, 25, 2))]
    assert split_tiles(1, 4) == [[0]]
    assert split_tiles(3, 4) == [[0], [1], [2]]
    four = Group(4, 0)
    assert decode_devices(four, 1, True) == [(0, 1, 2, 3)]
    assert decode_devices(four, 2, True) == [(0, 2), (1, 3)]
    assert decode_devices(four, 3, True) == [(0, 3), (1,), (2,)]
    assert decode_devices(four, 4, True) == [(0,), (1,), (2,), (3,)]
    assert decode_devices(four, 2, False) == [(0,), (1,)]


def test_decode_parts_and_ends_by_hand():
    nc = _cost()
    big = req("big", 0, size=1024, steps=4, cost=nc.cost)
    small = req("small", 0, size=512, steps=4, cost=nc.cost)
    assert nc.decode_parts(big, 1) == ([4.0], 0.0)
    parts, blend = nc.decode_parts(big, 2)
    assert parts == [2.0, 2.0] and blend == pytest.approx(BLEND)
    assert nc.decode_parts(big, 4) == ([1.0] * 4, pytest.approx(1024**2 * 0.75 * 12 / HOST
                                                                 + 3 * LATENCY))
    assert nc.decode_parts(small, 4) == ([0.0], 0.0)  # one tile: whole, on its lane
    # device 0 blends after its own tiles; device 1 is done with its tiles
    ends, devices = decode_ends(Group(2, 0), [(parts, blend)], split=True)
    assert ends == [pytest.approx(2.0 + BLEND)]
    assert devices == {0: pytest.approx(2.0 + BLEND), 1: 2.0}
    # two decodes on four devices: each on a pair; device 3's tiles end at 0.5
    ends, devices = decode_ends(Group(4, 0), [([1.0, 1.5], 0.25), ([3.0, 0.5], 0.25)], True)
    assert ends == [1.75, 3.25]
    assert devices == {0: 1.75, 1: 3.25, 2: 1.5, 3: 0.5}
    # without the split: lanes, whole decodes in order
    ends, devices = decode_ends(Group(2, 0), [([4.0], 0.0)], split=False)
    assert ends == [4.0] and devices == {0: 4.0, 1: 0.0}


def test_split_decode_ends_of_whole_and_short_parts_by_hand():
    """``decode_ends`` with ``split`` on the parts ``decode_parts`` gives besides a full
    split: a one-tile decode on a pair (``([whole], 0.0)``: not one entry per device) runs
    whole on its lane, its spare idle; 3 tiles on 4 devices leave the fourth idle; three
    decodes on four devices: a pair, then two lanes alone."""
    ends, devices = decode_ends(Group(2, 0), [([0.75], 0.0)], split=True)
    assert ends == [0.75] and devices == {0: 0.75, 1: 0.0}
    ends, devices = decode_ends(Group(4, 0), [([1.0, 2.0, 0.5], 0.25)], split=True)
    assert ends == [2.25] and devices == {0: 2.25, 1: 2.0, 2: 0.5, 3: 0.0}
    ends, devices = decode_ends(Group(4, 0), [([1.0, 1.5], 0.25), ([2.0], 0.0),
                                              ([0.5], 0.0)], split=True)
    assert ends == [1.75, 2.0, 0.5] and devices == {0: 1.75, 1: 2.0, 2: 0.5, 3: 1.5}
    with pytest.raises(ValueError, match="parts"):  # more parts than the decode's devices
        decode_ends(Group(2, 0), [([1.0, 1.0, 1.0], 0.0)], split=True)


def _split_and_whole(small_at: float):
    """A lone 1024² (4 steps) and a 512² (1 step) arriving at ``small_at``, run by slo on 2
    devices with split decodes (no yield) and without: their records by id, each run."""
    nc = _cost()
    rs = [req("big", 0, size=1024, steps=4, cost=nc.cost),
          req("small", small_at, size=512, steps=1, cost=nc.cost)]
    split = by_id(run(rs, "slo", 2, _cost(), forecast=False, split_decodes=True,
                      split_yield=False))
    whole = by_id(run(rs, "slo", 2, _cost(), forecast=False, split_decodes=False))
    return split, whole


def test_lone_1024_decodes_on_both_devices_and_the_second_goes_back_with_its_tiles():
    """A lone 1024² (4 steps at degree 2: 8 s) then its decode: split, 2 s of tiles on
    each device, then the blend on device 0: done at 10 s + blend; unsplit: 8 + 4 s. A
    512² arriving at 10 s runs on device 1 at once with the split (device 1's tiles ended
    at 10 s): done at 11 s; unsplit device 1 is free from 8 s too: also 11 s."""
    split, whole = _split_and_whole(small_at=10.0)
    assert split["big"].degrees == {2: 4} and whole["big"].degrees == {2: 4}
    assert split["big"].finished == pytest.approx(10.0 + BLEND)
    assert whole["big"].finished == pytest.approx(12.0)
    assert split["small"].degrees == {1: 1}
    assert split["small"].finished == pytest.approx(11.0)
    assert whole["small"].finished == pytest.approx(11.0)


def test_a_small_request_waits_for_the_spare_device_until_its_tiles_end():
    """The same 1024² and a 512² arriving at 9 s: with the split both devices decode until
    10 s (device 1 back at 10 s, device 0 after the blend), so the 512² starts at 10 s and
    is done at 11 s; unsplit, device 1 is free from 8 s: done at 10 s. (The split trades
    the small request's second for the large one's two.)"""
    split, whole = _split_and_whole(small_at=9.0)
    assert split["small"].finished == pytest.approx(11.0)
    assert split["big"].finished == pytest.approx(10.0 + BLEND)
    assert whole["small"].finished == pytest.approx(10.0)
    assert whole["big"].finished == pytest.approx(12.0)


def test_one_tile_decodes_are_unchanged_by_the_split():
    """512² requests decode whole (one tile): the split changes nothing, noise on."""
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import simulate_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.noise import TimingNoise

    prof = node_profile(host=HOST, move_latency=LATENCY, decode_s_per_mp=4.0)
    nc = NodeCost(CostModel.from_dict(prof))
    rs = [req(f"r{i}", 0.7 * i, size=512, steps=3, cost=nc.cost) for i in range(12)]
    out = []
    for split in (False, True):
        nc = NodeCost(CostModel.from_dict(prof))
        node = Node(2, nc.links)
        pol = make_node_policy("slo", nc, node, split_decodes=split)
        res = simulate_node(rs, pol, node, noise=TimingNoise(sigma=0.03, seed=1))
        out.append([(r.request.id, r.finished, r.degrees) for r in res.records])
    assert out[0] == out[1]


def test_split_ends_by_hand():
    """Two devices, 2 tiles of 1 s each; the spare taken back at 0.5 s ends its tile at
    1 s and its second tile runs on the lane after the lane's two: 3 s, then the blend."""
    from ditmem.scheduler.node.device import split_ends

    assert split_ends([[1.0, 1.0], [1.0, 1.0]], 0.25) == (2.25, [2.25, 2.0])
    assert split_ends([[1.0, 1.0], [1.0, 1.0]], 0.25, {1: 0.5}) == (3.25, [3.25, 1.0])
    # taken back in its last tile, or after its tiles: nothing changes
    assert split_ends([[1.0, 1.0], [1.0, 1.0]], 0.25, {1: 1.5}) == (2.25, [2.25, 2.0])
    assert split_ends([[1.0, 1.0], [1.0, 1.0]], 0.25, {1: 7.0}) == (2.25, [2.25, 2.0])
    # the lane idle by then (its own tiles done at 1 s): the tiles left start when the
    # spare's tile in progress ends (2 s), not when it was taken back (1.5 s)
    assert split_ends([[1.0], [1.0, 1.0, 1.0]], 0.0, {1: 1.5}) == (3.0, [3.0, 2.0])
    # two spares taken: their tiles reach the lane as each one's tile in progress ends
    # (spare 2's at 0.8 s, spare 1's at 1.5 s), in that order, not in the order taken:
    # the lane runs spare 2's tile 0.8-1.8 s, then spare 1's 1.8-2.8 s
    assert split_ends([[0.5], [1.5, 1.0], [0.8, 1.0]], 0.0, {1: 0.5, 2: 0.6}) == (
        pytest.approx(2.8), [pytest.approx(2.8), 1.5, 0.8])
    with pytest.raises(ValueError, match="taken"):
        split_ends([[1.0], [1.0]], 0.0, {0: 0.5})
    with pytest.raises(ValueError, match="tiles"):  # one device: a whole decode
        split_ends([[1.0, 1.0]], 0.0)


def test_a_small_request_takes_the_spare_device_back_between_tiles():
    """The lone 1024² (steps end at 8 s; tiles 0, 2 on device 0, 1, 3 on device 1, 1 s
    each) and a 512² (1 s alone) arriving at 8.5 s with a deadline 1.6 s after it (10.1 s).
    Split alone: device 1 is back at 10 s, the 512² done at 11 s (missed). With
    ``split_yield``: device 1 is taken back after tile 1 (9 s), the 512² runs 9-10 s (met);
    tile 3 runs on device 0 after its own two (10-11 s), the 1024² done at 11 s + blend."""
    nc = _cost()
    rs = [req("big", 0, size=1024, steps=4, cost=nc.cost),
          req("small", 8.5, size=512, steps=1, cost=nc.cost, scale=1.6)]
    assert rs[1].deadline == pytest.approx(10.1)
    split = by_id(run(rs, "slo", 2, _cost(), forecast=False, split_decodes=True,
                    split_yield=False))
    taken = by_id(run(rs, "slo", 2, _cost(), forecast=False, split_decodes=True,
                      split_yield=True))
    assert split["small"].finished == pytest.approx(11.0) and not split["small"].met
    assert split["big"].finished == pytest.approx(10.0 + BLEND)
    assert taken["small"].finished == pytest.approx(10.0) and taken["small"].met
    assert taken["small"].degrees == {1: 1}
    assert taken["big"].finished == pytest.approx(11.0 + BLEND)


def test_no_take_back_for_a_request_that_makes_it_anyway():
    """The same, the 512²'s deadline 3 s after its arrival (11.5 s): it meets it on device 1
    once the spare's tiles end, so the spare is not taken back (the same schedule)."""
    nc = _cost()
    rs = [req("big", 0, size=1024, steps=4, cost=nc.cost),
          req("small", 8.5, size=512, steps=1, cost=nc.cost)]
    taken = by_id(run(rs, "slo", 2, _cost(), forecast=False, split_decodes=True,
                      split_yield=True))
    assert taken["small"].finished == pytest.approx(11.0) and taken["small"].met
    assert taken["big"].finished == pytest.approx(10.0 + BLEND)


def test_measured_decodes_teach_the_decode_factor_per_shape_class():
    """``observe_decode`` (EWMA α 0.1): a whole 1024² decode measured at 8 s against 4 s
    → factor 1.1; split over 2, measured at the blend + 3 s against 2 s of tiles → 1.1 +
    0.1 × (1.5 − 1.1) = 1.14. The 512² class is untouched; the decode's price follows."""
    nc = _cost()
    big = req("big", 0, size=1024, steps=4, cost=nc.cost)
    small = req("small", 0, size=512, steps=4, cost=nc.cost)
    nc.observe_decode(big, 1, 8.0)
    assert nc.decode_correction(big) == pytest.approx(1.1)
    assert nc.decode_time(big) == pytest.approx(4.4)
    assert nc.decode_parts(big, 2)[0] == [pytest.approx(2.2), pytest.approx(2.2)]
    nc.observe_decode(big, 2, BLEND + 3.0)
    assert nc.decode_correction(big) == pytest.approx(1.14)
    assert nc.decode_correction(small) == 1.0


def test_the_loop_reports_each_decode_to_the_policy():
    """The lone 1024² on a truth whose tiles take 2 s (the policy's model: 1 s): its split
    decode is measured at 4 s + blend (2 tiles of 2 s on each device), the policy's factor
    for the class becomes 1 + 0.1 × (2 − 1) = 1.1; unsplit, 8 s against 4 s: also 1.1."""
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import simulate_node
    from ditmem.scheduler.node.topology import Node

    prof = node_profile(host=HOST, move_latency=LATENCY)
    prof["models"]["qwen-image"].update(decode_tile_px=_v(512), decode_stride_px=_v(512),
                                        decode_tile_s=_v(2.0))
    slow = NodeCost(CostModel.from_dict(prof))
    for split in (True, False):
        nc = _cost()
        rs = [req("big", 0, size=1024, steps=4, cost=nc.cost)]
        node = Node(2, nc.links)
        pol = make_node_policy("slo", nc, node, forecast=False, split_decodes=split)
        simulate_node(rs, pol, node, truth=slow)
        assert nc.decode_correction(rs[0]) == pytest.approx(1.1)


def test_two_split_decodes_of_one_job_draw_their_own_tile_jitter():
    """A degree-4 job finishing two 1024² (split over devices (0, 2) and (1, 3)), noise
    10 %: each decode's tiles are its factor times the job's stream's jitter, so the two
    decodes' tile times must not be proportional tile for tile (the same jitter, reseeded
    for each decode, made them so)."""
    from ditmem.scheduler.node.device import Job, VirtualDevices
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.noise import TimingNoise

    nc = _cost()
    a, b = (req(r, 0, size=1024, steps=4, cost=nc.cost) for r in "ab")
    devices = VirtualDevices(nc, TimingNoise(0.1, 0.0, 3), 4)
    job = Job(0, Node(4, nc.links).groups(4)[0], [a, b], 1, [], [], [a, b],
              split_decodes=True)
    devices.launch(job, 0.0)
    first, second = (sp.tiles for sp in devices._splits[0].decodes)
    ratios = [x / y for xs, ys in zip(first, second, strict=True)
              for x, y in zip(xs, ys, strict=True)]
    assert len(ratios) == 4 and max(ratios) - min(ratios) > 1e-3
