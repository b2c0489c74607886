"""The concurrent decode lane (processor sharing) and the profile's page size, by hand."""

from __future__ import annotations

import pytest
from sched_factories import PAGE, req, table_profile, tiled_cost, tiles_only

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.decode_lane import DecodeLane
from ditmem.scheduler.simulator import simulate

MP_512 = 512 * 512 / 1e6


def test_lane_shares_the_device_and_decodes_earliest_deadline_first():
    lane = DecodeLane(share=0.5)
    lane.push("late", deadline=10.0, seconds=2.0)
    # 1 s of step work beside it at half speed ends at t=2; "late" has 1 s left.
    end, done = lane.share(0.0, 1.0)
    assert end == pytest.approx(2.0) and done == []
    lane.push("early", deadline=5.0, seconds=0.5)
    # alone until the next decode ends: "early" jumps the queue and ends at 2.5
    t, done = lane.run_until(2.0, None)
    assert done == [("early", pytest.approx(2.5))] and t == pytest.approx(2.5)
    # an arrival at 3.0 stops the lane there with "late" at 0.5 s left
    t, done = lane.run_until(2.5, 3.0)
    assert t == pytest.approx(3.0) and done == []
    end, done = lane.share(3.0, 10.0)  # 0.5 s left ends at 4.0; then 9.5 s of work alone
    assert done == [("late", pytest.approx(4.0))] and end == pytest.approx(13.5)


def test_lane_with_a_small_share_leaves_the_step_loop_most_of_the_device():
    lane = DecodeLane(share=0.2)
    lane.push("a", deadline=1.0, seconds=1.0)
    end, done = lane.share(0.0, 4.0)  # 4 s of work at 0.8 -> 5 s; decode gets 1 s by then
    assert end == pytest.approx(5.0) and done == [("a", pytest.approx(5.0))]
    with pytest.raises(ValueError, match="share"):
        DecodeLane(share=1.0)


def _two_requests(cost):
    return [req("a", 0.0, steps=4, cost=cost), req("b", 0.0, steps=4, cost=cost)]


@pytest.mark.parametrize("decode, finish_a, finish_b", [
    ("inline", 5.0, 10.0),      # a: 4 steps + 1 s decode; b behind it
    ("concurrent", 6.0, 10.0),  # a's decode shares [4, 6] with b's steps at half speed
])
def test_fifo_schedule_by_hand(decode, finish_a, finish_b):
    cost = CostModel.from_dict(table_profile(decode_s_per_mp=1.0 / MP_512))
    result = simulate(_two_requests(cost), make_policy("fifo", cost), decode=decode)
    finished = {r.request.id: r.finished for r in result.records}
    assert finished == {"a": pytest.approx(finish_a), "b": pytest.approx(finish_b)}


def test_unknown_decode_mode_is_rejected():
    cost = CostModel.from_dict(table_profile())
    with pytest.raises(ValueError, match="decode must be one of"):
        simulate(_two_requests(cost), make_policy("fifo", cost), decode="sideways")


def test_simulator_uses_the_profiles_page_size():
    data = table_profile(device_bytes=4 * PAGE, state_bytes=PAGE)
    with pytest.raises(ValueError, match="no room for pages"):  # 64 MiB default pages
        simulate(_two_requests(CostModel.from_dict(data)),
                 make_policy("fifo", CostModel.from_dict(data)))
    data["page_bytes"] = {"value": PAGE, "source": "test"}
    cost = CostModel.from_dict(data)
    assert cost.page_bytes == PAGE
    result = simulate(_two_requests(cost), make_policy("srtf", cost))
    assert len(result.records) == 2


def test_cli_decode_flag_reaches_the_simulation(tmp_path):
    import json

    from ditmem.cli import build_parser

    rows = {}
    for mode in ("inline", "concurrent"):
        out = tmp_path / f"{mode}.json"
        parser, module = build_parser("sim")
        args = parser.parse_args(["sim", "--workload", "seed-mix", "--scale", "cpu",
                                  "--device", "cpu-tiny", "--policy", "fifo",
                                  "--requests", "60", "--decode", mode, "--json", str(out),
                                  "--quiet"])
        assert module.main(args) == 0
        rows[mode] = json.loads(out.read_text())[0]
    assert rows["concurrent"]["decode"] == "concurrent"
    # fifo's next request steps while the previous one decodes: a different schedule
    assert rows["concurrent"]["p50_s"] != rows["inline"]["p50_s"]


def test_tile_geometry_and_profile_validation():
    cost = tiled_cost()
    assert cost.decode_tiles(req("x", size=512)) == [0.5] * 4
    assert cost.decode_tiles(req("y", size=256)) == [pytest.approx(1.0 * 256 * 256 / 1e6)]
    edge = cost.decode_tiles(req("z", size=384))  # tiles of 256 and 128 px per side
    assert sorted(edge) == pytest.approx([0.125, 0.25, 0.25, 0.5])
    data = table_profile()
    data["models"]["qwen-image"]["decode_tile_px"] = {"value": 256, "source": "test"}
    with pytest.raises(ValueError, match="go together"):
        CostModel.from_dict(data)


@pytest.mark.parametrize("decode, finish_a, finish_b", [
    ("inline", 6.0, 12.0),   # b waits for a's whole decode and misses (due 10.7)
    ("tiled", 12.0, 10.5),   # a's decode yields to b's steps and decode after one tile
])
def test_tiled_decode_yields_to_an_earlier_deadline_by_hand(decode, finish_a, finish_b):
    cost = tiled_cost()  # 512²: 4 steps of 1 s, decode 4 tiles of 0.5 s
    a = req("a", 0.0, steps=4, cost=cost)            # due 18
    b = req("b", 4.2, steps=4, slo_ms=6500, cost=cost)  # due 10.7
    result = simulate([a, b], make_policy("fifo", cost), decode=decode)
    finished = {r.request.id: r.finished for r in result.records}
    assert finished == {"a": pytest.approx(finish_a), "b": pytest.approx(finish_b)}


# ---- late decodes: a share of the loop, so none waits for an idle device without bound ----


def test_late_decode_gets_its_share_between_steps_by_hand():
    """A decode already past its deadline (two 0.1-s tiles) against back-to-back 0.3-s steps
    due later. With ``late_share`` 0.1 it earns 0.3 · 0.1 / 0.9 = 1/30 s a step: its first
    tile runs at 0.9 s (after three steps), the second once 0.1 + 0.8 s more have passed
    and three more steps are done, at 1.9 s; it is done at 2.0 s — 0.2 of the 2.0 s. With
    share 0 (the rule before) it never runs while a step is planned."""
    from ditmem.scheduler.decode_lane import TiledDecodes

    for share, expect in ((0.1, [0.9, 1.9]), (0.0, [])):
        tiles = TiledDecodes(late_share=share)
        tiles.push("late", 0.0, [0.1, 0.1])
        now, ran = 0.0, []
        while now < 3.0 and len(tiles):
            rid = tiles.pick(now, 5.0)
            if rid is None:
                now += 0.3  # the planned step
                continue
            ran.append(round(now, 9))
            seconds, _ = tiles.run_one(rid)
            now += seconds
        assert ran == pytest.approx(expect)
    # an on-time decode due before the step still runs first, and nothing without decodes
    tiles = TiledDecodes()
    assert tiles.pick(0.0, 5.0) is None
    tiles.push("late", 0.0, [0.1])
    tiles.push("due", 4.0, [0.1])
    assert tiles.pick(1.0, 5.0) == "due"
    with pytest.raises(ValueError, match="late_share"):
        TiledDecodes(late_share=1.0)


def test_a_late_decode_is_not_starved_by_a_stream_of_urgent_work():
    """The issue's adversarial case for decodes: a 512² request (4 steps of 1 s, then 4
    decode tiles of 0.5 s) that is already late when its steps end, against a stream of
    256² one-step requests arriving as fast as the loop serves them (so the loop never
    idles until 60 s). Before, its decode waited for the stream to end; now it finishes
    within S / share + n · T of its last step (S = 2 s of tiles, n = 4, T the longest other
    piece of work: one small step or decode)."""
    cost = tiled_cost()
    big = req("big", 0.0, steps=4, slo_ms=3_000, cost=cost)
    probe = req("p", 0.0, size=256, steps=1, cost=cost)
    small_s = cost.standalone_time(probe)  # step + its one-tile decode
    t_max = max(cost.step_time("qwen-image", [cost.tokens(probe)]), cost.decode_time(probe))
    stream = [req(f"s{i}", 4.0 + i * small_s, size=256, steps=1, slo_ms=100_000, cost=cost)
              for i in range(int(56 / small_s))]
    finish = {}
    for share in (None, 0.1, 0.0):  # None: simulate's default (0.1)
        options = {} if share is None else {"late_share": share}
        result = simulate([big, *stream], make_policy("fifo", cost), decode="tiled", **options)
        finish[share] = next(r.finished for r in result.records if r.request.id == "big")
    assert finish[0.1] <= 4.0 + 2.0 / 0.1 + 4 * t_max + 1e-9
    assert finish[None] == finish[0.1]
    assert finish[0.0] >= stream[-1].arrival  # the rule before: only once the stream is done
    with pytest.raises(ValueError, match="late_share"):
        simulate([big], make_policy("fifo", cost), decode="tiled", late_share=1.0)


def test_a_decode_that_can_make_it_goes_before_late_work_by_hand():
    """Issue 13 (the demo at run speed): a late decode (due 1.0, two 0.5-s tiles) and one
    that can still make it (due 4.0, one 0.5-s tile) pending at t = 2. With no step planned
    the one that can make it runs first (before, the earliest deadline ran: the late one's
    whole second, then the other at 3.0 - and with longer late decodes the on-time one
    missed); then the late one. A planned step holds decodes to its earliest deadline
    still ahead (``step_deadline``): a step whose members are all past due holds back no
    decode that can make it; one with a member due at 3.0 still goes first."""
    from ditmem.scheduler.decode_lane import TiledDecodes, step_deadline

    assert step_deadline(2.0, []) is None
    assert step_deadline(2.0, [1.5]) == float("inf")
    assert step_deadline(2.0, [1.5, 3.0, 5.0]) == 3.0
    tiles = TiledDecodes()
    tiles.push("late", 1.0, [0.5, 0.5])
    tiles.push("due", 4.0, [0.5])
    assert tiles.pick(2.0, None) == "due"
    assert tiles.pick(2.0, step_deadline(2.0, [1.5])) == "due"
    assert tiles.pick(2.0, step_deadline(2.0, [1.5, 3.0])) is None
    assert tiles.run_one("due") == (0.5, True)
    assert tiles.pick(2.5, None) == "late"  # only late decodes left: the earliest deadline


def test_a_late_decode_runs_in_the_spare_time_the_plan_grants_by_hand():
    """Issue 13 (session 9): ``StepPlan.late_tiles_s`` — the seconds no on-time request
    needs — lets a late decode's tile run before the planned step without waiting for its
    ``late_share`` credit. L (512²: 4 steps of 1 s, decode 4 tiles of 0.5 s, due 3) runs
    alone from 0 and is late when its steps end at 4; B (the same shape, due 33.5) arrived
    at 3.5. slo (``late_tile_margin`` 0.2, an option) grants B's slack beyond 0.2 × its
    30-s window: at 4, 29.5 − 6 − 6 = 17.5 s >= 0.5, so L's tiles run 4 → 6 and B steps
    6 → 10 and decodes 10 → 12 (on time). Without the grant (``late_tile_margin=None``, the
    default) L's credit (1/9 s per s of loop) has not reached a tile when B's steps end at
    8: B decodes 8 → 10, then L 10 → 12. The picker's own rules: the tile must fit in the
    grant, a decode that can still make it goes first, and one that can make it but is due
    after the step keeps its time out of the grant (the policy does not see it)."""
    from ditmem.scheduler.decode_lane import TiledDecodes

    tiles = TiledDecodes()
    tiles.push("late", 0.0, [0.1, 0.1])
    assert tiles.pick(1.0, 5.0) is None  # no credit yet, nothing granted
    assert tiles.pick(1.0, 5.0, spare=0.05) is None  # the tile does not fit
    assert tiles.pick(1.0, 5.0, spare=0.1) == "late"
    tiles.push("due", 4.0, [0.1])
    assert tiles.pick(1.0, 5.0, spare=1.0) == "due"  # one that can make it goes first
    owed = TiledDecodes()  # a decode that can make it, due after the step: its time is owed
    owed.push("late", 0.0, [0.1])
    owed.push("later", 9.0, [0.1])
    assert owed.pick(1.0, 5.0, spare=0.15) is None  # 0.15 - 0.1 owed < the 0.1-s tile
    assert owed.pick(1.0, 5.0, spare=0.2) == "late"
    no_share = TiledDecodes(late_share=0.0)  # the grant does not depend on the share
    no_share.push("late", 0.0, [0.1])
    assert no_share.pick(1.0, 5.0) is None
    assert no_share.pick(1.0, 5.0, spare=0.1) == "late"

    # L is late on arrival (4 + 2 s > 3), so it is in the tail lane, and since session 18
    # the plans run a member's decode whole after its last step (``first_decodes``): L
    # 4 → 6 with or without the grant. The grant is for late decodes outside the lane, so
    # the plans' lists are emptied below to see it.
    cost = tiled_cost()
    late = req("L", 0.0, steps=4, slo_ms=3_000, cost=cost)
    ontime = req("B", 3.5, steps=4, slo_ms=30_000, cost=cost)
    finish, whole = {}, {}
    for margin in (0.2, None):
        pol = make_policy("slo", cost, forecast="off", late_tile_margin=margin)
        result = simulate([late, ontime], pol, decode="tiled")
        whole[margin] = {r.request.id: r.finished for r in result.records}
        pol = tiles_only(make_policy("slo", cost, forecast="off", late_tile_margin=margin))
        result = simulate([late, ontime], pol, decode="tiled")
        finish[margin] = {r.request.id: r.finished for r in result.records}
    assert whole[0.2] == whole[None] == {"L": pytest.approx(6.0), "B": pytest.approx(12.0)}
    assert finish[0.2] == {"L": pytest.approx(6.0), "B": pytest.approx(12.0)}
    assert finish[None] == {"L": pytest.approx(12.0), "B": pytest.approx(10.0)}
    with pytest.raises(ValueError, match="late_tile_margin"):
        make_policy("slo", cost, late_tile_margin=-0.1)
