"""The fixed cost of a node job besides its stages (``links.job_latency_s``): parsed and
validated with the links, priced by ``NodeCost`` once per job a policy launches, paid by
``VirtualDevices`` before each job's stages. Hand-computed on the node test profile: 512²
steps in 1 s at degree 1, no encode or decode time."""

import json
import math

import pytest
from node_factories import node_cost, node_profile, run
from sched_factories import req

from ditmem.scheduler.node.device import Job, VirtualDevices
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.speedup import NodeProfileError, parse_links
from ditmem.scheduler.node.topology import Group, Node
from ditmem.scheduler.noise import TimingNoise


# ---- the profile's field ----------------------------------------------------------------
def test_a_profile_with_job_latency_round_trips():
    links = parse_links(node_profile(job_latency=0.002, move_latency=0.15))
    assert links.job_latency_s == 0.002
    assert links.move_latency_s == 0.15
    again = parse_links({"name": "x", "links": json.loads(json.dumps(links.to_dict()))})
    assert again == links
    assert parse_links(node_profile()).job_latency_s == 0.0  # absent: no fixed cost


@pytest.mark.parametrize("bad", [-0.001, math.inf, math.nan, "0.1", True, None])
def test_a_bad_job_latency_names_the_field(bad):
    prof = node_profile()
    prof["links"]["job_latency_s"] = bad
    with pytest.raises(NodeProfileError, match="links.job_latency_s"):
        parse_links(prof)


# ---- the price ----------------------------------------------------------------------------
def test_remaining_pays_the_latency_once_per_job():
    nc, plain = node_cost(job_latency=0.01), node_cost()
    r = req("r", size=512, steps=5)
    assert plain.remaining(r, 0) == pytest.approx(5.0)
    assert nc.remaining(r, 0) == pytest.approx(5.0 + 0.01)  # one job (run to completion)
    assert nc.remaining(r, 0, 1, 1) == pytest.approx(5.0 + 5 * 0.01)  # a job per step
    assert nc.remaining(r, 2, 1, 1) == pytest.approx(3.0 + 3 * 0.01)
    assert nc.remaining(r, 0, 1, 2) == pytest.approx(5.0 + 3 * 0.01)  # jobs of 2, 2, 1 steps
    assert nc.standalone(r) == pytest.approx(5.01)
    assert nc.standalone(r, 1, 1) == pytest.approx(5.05)
    # step times stay in the profile's units (a packing gain is judged without it)
    assert nc.step_time("qwen-image", [1024]) == plain.step_time("qwen-image", [1024]) == 1.0
    assert nc.alone_step(r) == 1.0
    with pytest.raises(ValueError, match="steps_per_job"):
        nc.remaining(r, 0, 1, 0)


def test_each_policy_prices_its_own_jobs():
    """slo and srtf launch a job per step, fifo and elastic-np one per request."""
    nc = node_cost(job_latency=0.01)
    node = Node(2, nc.links)
    assert make_node_policy("fifo", nc, node).steps_per_job is None
    assert make_node_policy("elastic-np", nc, node).steps_per_job is None
    assert make_node_policy("srtf", nc, node).steps_per_job == 1
    slo = make_node_policy("slo", nc, node)
    assert slo.steps_per_job == 1
    r = req("r", size=512, steps=5, cost=nc.cost)
    assert slo._cand(r, r, 0, None, 0.0).rem(0) == pytest.approx(5 * 1.01)
    assert slo._cand(r, r, 3, None, 0.0).rem(0) == pytest.approx(2 * 1.01)


# ---- the truth pays it ----------------------------------------------------------------------
def _two_jobs(latency: float) -> list[float]:
    truth = node_cost(job_latency=latency)
    devices = VirtualDevices(truth, TimingNoise(0.0), 2)
    ends, now = [], 0.0
    for i in range(2):
        job = Job(i, Group(1, 0), [req(f"r{i}", size=512, steps=1)], 1)
        devices.launch(job, now)
        (done,) = devices.wait(None)
        assert done.timings.launch_s == latency
        assert done.finished - done.started == pytest.approx(done.timings.total)
        now = done.finished
        ends.append(now)
    return ends


def test_two_one_step_jobs_back_to_back_pay_it_twice():
    plain, slow = _two_jobs(0.0), _two_jobs(0.01)
    assert plain == pytest.approx([1.0, 2.0])
    assert slow[0] - plain[0] == pytest.approx(0.01, abs=1e-12)
    assert slow[1] - plain[1] == pytest.approx(0.02, abs=1e-12)


def test_a_noisy_launch_draws_from_its_own_kind():
    truth = node_cost(job_latency=0.01)
    noise = TimingNoise(0.0, 0.0, 0, bias_by={"launch": 1.0})  # launches take twice as long
    devices = VirtualDevices(truth, noise, 1)
    devices.launch(Job(0, Group(1, 0), [req("r", size=512, steps=1)], 1), 0.0)
    (done,) = devices.wait(None)
    assert done.timings.launch_s == pytest.approx(0.02)
    assert done.finished == pytest.approx(1.02)  # the step itself: no launch bias


@pytest.mark.parametrize(("policy", "jobs"), [("fifo", 1), ("slo", 4)])
def test_a_lone_request_ends_one_latency_later_per_job(policy, jobs):
    """One 4-step request alone: fifo runs it as one job, slo as a job per step."""
    plain, slow = node_cost(), node_cost(job_latency=0.01)
    ends = []
    for nc in (plain, slow):
        r = req("r", size=512, steps=4, cost=nc.cost)
        result = run([r], policy, 2, nc)
        assert result.jobs == jobs
        ends.append(result.records[0].finished)
    assert ends[1] - ends[0] == pytest.approx(jobs * 0.01, abs=1e-9)


def test_a_latency_leaves_the_other_draws_as_they_were():
    """Common random numbers: the steps draw the same seconds with and without launches."""
    steps = []
    for latency in (0.0, 0.01):
        devices = VirtualDevices(node_cost(job_latency=latency), TimingNoise(0.03, 0.0, 7), 1)
        now, got = 0.0, []
        for i in range(5):
            devices.launch(Job(i, Group(1, 0), [req(f"r{i}", size=512, steps=1)], 1), now)
            (done,) = devices.wait(None)
            now = done.finished
            got.append(done.timings.step_s)
            assert (done.timings.launch_s > 0) == (latency > 0)
        steps.append(got)
    assert steps[0] == steps[1]
    assert len(set(steps[0])) == 5  # jittered
