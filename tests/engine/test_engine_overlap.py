"""Transfers overlap compute in step mode: a restore planned while another request steps
runs on the copier (a slow fake copy on a worker thread here, the copy stream on a GPU)
while the step computes, and the restored pages are not read before the copy has ended.
Each transfer is charged its own copy time, not the step's."""

from __future__ import annotations

import threading
import time

import numpy as np
from toy import ToyGenerator, table_profile

from ditmem.engine.factory import make_policy_and_cost
from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.ops import copy_blocks
from ditmem.scheduler import CostModel, StepPlan

COPY_S, STEP_S = 0.4, 0.4


class Script:
    """A policy that returns the given plans in order (then: nothing to do)."""

    def __init__(self, plans):
        self.plans = list(plans)

    def schedule(self, now, view):
        return self.plans.pop(0) if self.plans else StepPlan()


class Recorder(ToyGenerator):
    """The toy generator, logging when each step starts and ends and whose pages it read."""

    def __init__(self):
        super().__init__(step_sleep_s=STEP_S)
        self.log = []

    def step(self, states):
        t0 = time.perf_counter()
        super().step(states)
        self.log.append(("step", [s.request_id for s in states], t0, time.perf_counter()))


def req(i, steps=3):
    return GenerationRequest(prompt="p", width=64, height=64, num_inference_steps=steps,
                             seed=i, request_id=f"r{i}")


def test_restore_overlaps_the_step_and_pages_wait_for_the_copy():
    gen = Recorder()
    _, cost = make_policy_and_cost("fifo", CostModel.from_dict(table_profile()))
    plans = [StepPlan(admit=["r0", "r1"]),
             StepPlan(offload=["r1"], batch=["r0"]),   # r1 goes to the host
             StepPlan(restore=["r1"], batch=["r0"]),   # r1 comes back while r0 steps
             StepPlan(batch=["r0", "r1"]),
             StepPlan(batch=["r1"]), StepPlan(batch=["r1"])]
    engine = Engine(gen, Script(plans), cost, PagePool(64, 1024), HostPool(64, 1024),
                    offload_mode="thread")
    copies = []

    def slow_copy(src, dst, mapping):
        t0 = time.perf_counter()
        time.sleep(COPY_S)
        copy_blocks(src, dst, mapping)
        copies.append((threading.current_thread().name, t0, time.perf_counter()))

    engine.executor.offloader._copy_fn = slow_copy
    tickets = [engine.submit(req(0)), engine.submit(req(1))]
    reports = []
    engine.policy.observe = reports.append
    for _ in range(len(plans)):
        engine.executor.iterate()
    results = [t.future.result(10) for t in tickets]

    (_, off0, off1), (thread, rs0, rs1) = copies
    assert thread.startswith("ditmem-offload")
    step_during = next(e for e in gen.log if e[1] == ["r0"] and e[2] > off1)
    # the restore and r0's step ran at the same time ...
    assert rs0 < step_during[3] and step_during[2] < rs1
    # ... and the wall time of that iteration was about max(copy, step), not their sum
    assert step_during[3] - min(rs0, step_during[2]) < COPY_S + STEP_S - 0.15
    # r1's pages were first read by the step after the copy had ended
    first_r1 = next(e for e in gen.log if "r1" in e[1] and e[2] > rs0)
    assert first_r1[2] >= rs1
    # each transfer was charged its own copy time; the step its own
    restore_report = reports[2]
    assert abs(restore_report.transfer_s - (rs1 - rs0)) < 0.05
    assert abs(restore_report.step_s - STEP_S) < 0.15
    for i, r in enumerate(results):  # and the outputs are those of uninterrupted runs
        np.testing.assert_array_equal(r.output, ToyGenerator().reference(req(i)))
    assert engine.pool.num_free_pages == engine.pool.num_pages
    engine.executor.close()
