"""The iteration order written once (``scheduler.loop.run_stages``), the node job's use of
it (``node.device.run_job``) and the block-preemption rules both engines share
(``block_step.plan_chunk``): each against a hand-written sequence of calls."""

from __future__ import annotations

import pytest

from ditmem.scheduler import Request, RequestStatus
from ditmem.scheduler.block_step import BlockPlanError, plan_chunk
from ditmem.scheduler.loop import mid_step, preempted, run_stages
from ditmem.scheduler.node.device import Job, JobStages, Move, run_job
from ditmem.scheduler.node.topology import Group


class Recorder:
    """A ``Stages`` that records every call; ``done`` says whose last step a step runs."""

    def __init__(self, done=()):
        self.calls: list[tuple] = []
        self.done = list(done)

    def start_offload(self, rid):
        self.calls.append(("start_offload", rid))
        return f"off:{rid}"

    def finish_offload(self, handle):
        self.calls.append(("finish_offload", handle))

    def start_restore(self, rid):
        self.calls.append(("start_restore", rid))
        return None if rid == "gone" else f"res:{rid}"

    def finish_restore(self, handle):
        self.calls.append(("finish_restore", handle))

    def encode(self, rids):
        self.calls.append(("encode", tuple(rids)))

    def step(self, rids, steps, blocks):
        self.calls.append(("step", tuple(rids), steps, blocks))
        return [r for r in rids if r in self.done]

    def decode(self, rids):
        self.calls.append(("decode", tuple(rids)))


def test_offloads_finish_before_restores_and_admits_that_may_need_their_pages():
    st = Recorder(done=["b"])
    out = run_stages(st, offload=["o1", "o2"], restore=["b", "p"], admit=["n"],
                     batch=["b", "n"])
    assert out == ["b"]
    assert st.calls == [
        ("start_offload", "o1"), ("start_offload", "o2"),
        ("finish_offload", "off:o1"), ("finish_offload", "off:o2"),
        ("start_restore", "b"), ("finish_restore", "res:b"),  # b steps now: before the step
        ("start_restore", "p"),                               # p does not: after it
        ("encode", ("n",)),
        ("step", ("b", "n"), 1, None),
        ("decode", ("b",)),
        ("finish_restore", "res:p"),
    ]


def test_offloads_alone_overlap_the_step_and_its_decodes():
    st = Recorder(done=["a"])
    run_stages(st, offload=["o"], batch=["a"], blocks=3)
    assert st.calls == [
        ("start_offload", "o"),
        ("step", ("a",), 1, 3),
        ("decode", ("a",)),
        ("finish_offload", "off:o"),
    ]


def test_a_plan_without_a_batch_still_reaches_the_step_stage_and_skips_a_lost_restore():
    st = Recorder()
    assert run_stages(st, restore=["gone"]) == []
    assert st.calls == [("start_restore", "gone"), ("step", (), 1, None)]


def test_a_preemption_is_a_request_that_stepped_last_time_is_still_started_and_did_not_now():
    # c finished (no longer started), b steps again, a and d wait
    assert preempted(("a", "b", "c", "d"), ["b", "e"], {"a", "b", "d", "e"}) == ["a", "d"]
    assert preempted((), ["x"], {"x"}) == []


def _req(rid: str, steps: int = 4) -> Request:
    return Request(id=rid, arrival=0.0, model="qwen-image", width=512, height=512, steps=steps)


class JobRecorder(JobStages, Recorder):
    def __init__(self, job):
        JobStages.__init__(self, job)
        Recorder.__init__(self)

    def step(self, rids, steps, blocks):
        self.calls.append(("step", tuple(rids), steps, blocks))
        return [r.id for r in self.job.decodes]


def test_a_node_job_runs_in_the_single_device_order():
    pair, single = Group(2, 0), Group(1, 3)
    parked, migrant, new, old = _req("parked"), _req("migrant"), _req("new"), _req("old")
    job = Job(7, pair, [migrant, new, parked], steps=3,
              moves=[Move(old, pair, None), Move(migrant, single, pair), Move(parked, None, pair)],
              encodes=[new], decodes=[migrant])
    st = JobRecorder(job)
    run_job(job, st)
    # JobStages' transfers are synchronous: finishing them is a no-op, not recorded
    assert st.calls == [
        ("start_offload", "old"),
        ("start_restore", "migrant"), ("start_restore", "parked"),
        ("encode", ("new",)),
        ("step", ("migrant", "new", "parked"), 3, None),
        ("decode", ("migrant",)),
    ]


def _part_done(rid: str, group: tuple[str, ...], blocks: int = 10) -> RequestStatus:
    s = RequestStatus(_req(rid), started_at=0.0, pages=1)
    s.blocks_done, s.step_group = blocks, group
    return s


def test_plan_chunk_parks_every_part_done_step_the_batch_leaves_out():
    a, b = _part_done("a", ("a", "b")), _part_done("b", ("a", "b"))
    c = _part_done("c", ("c",))
    fresh = RequestStatus(_req("f"), started_at=0.0, pages=1)
    to_park, resumed = plan_chunk([a, b, c, fresh], [c], parked=set())
    assert resumed == ("c",)
    assert [(g, [s.id for s in group]) for g, group in to_park] == [(("a", "b"), ["a", "b"])]
    # already parked: nothing to do; a new step parks both part-done ones
    assert plan_chunk([a, b, c, fresh], [c], parked={("a", "b")}) == ([], ("c",))
    to_park, resumed = plan_chunk([a, b, c, fresh], [fresh], parked=set())
    assert resumed is None and [g for g, _ in to_park] == [("a", "b"), ("c",)]


def test_plan_chunk_keys_a_group_by_its_live_members():
    # b was cancelled: a's step continues as the group ("a",) (the engine re-keys its park)
    a = _part_done("a", ("a", "b"))
    assert plan_chunk([a], [a], parked=set()) == ([], ("a",))


def test_plan_chunk_refuses_a_batch_that_splits_a_part_done_step_and_blocks_below_one():
    a, b = _part_done("a", ("a", "b")), _part_done("b", ("a", "b"))
    fresh = RequestStatus(_req("f"), started_at=0.0, pages=1)
    with pytest.raises(BlockPlanError, match="exactly the part-done step"):
        plan_chunk([a, b, fresh], [a, fresh], parked=set())
    with pytest.raises(BlockPlanError, match="exactly the part-done step"):
        plan_chunk([a, b], [a], parked=set())
    with pytest.raises(BlockPlanError, match="plan.blocks must be >= 1"):
        plan_chunk([a, b], [a, b], parked=set(), blocks=0)


def test_mid_step_only_while_every_member_of_the_last_batch_is_inside_its_step():
    a, b = _part_done("a", ("a", "b")), _part_done("b", ("a", "b"))
    whole = RequestStatus(_req("w"), started_at=0.0, pages=1)
    assert mid_step([a, b])
    assert not mid_step([])          # no step ran
    assert not mid_step([a, None])   # a member left: the step is not continued as it was
    assert not mid_step([whole])     # its step ended with the last chunk
