"""Block-level preemption in the engine (tiny Wan): steps run as chunks of one block, and a
policy that switches request at every chunk boundary parks each part-done step (boundary
activations offloaded to the host) and resumes it later. Outputs equal each request run
alone through the generator, and every page comes back."""

from __future__ import annotations

import numpy as np
from test_engine_wan import wan_profile

from ditmem.engine.factory import EngineConfig, build_engine
from ditmem.memory import PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import Policy


class Alternate(Policy):
    """Runs, one chunk of one block at a time, a request other than the last one when
    there is one: every part-done step gets parked."""

    name = "alternate"
    fixed_chunk = 1

    def schedule(self, now, view):
        items = list(view.active) + list(view.waiting.iter_by("arrival", 4))
        fresh = [i for i in items if i.id not in view.last_batch]
        return self.plan_first_fit(view, fresh + [i for i in items if i not in fresh])


def _alone(gen, r):
    pool = PagePool(1024, 16 * 1024)
    s = gen.encode(r, pool)
    while not gen.is_done(s):
        gen.step([s])
    out = gen.decode(s)
    gen.release(s)
    return out


def test_parked_inside_steps_through_the_engine_equals_running_alone():
    engine = build_engine(EngineConfig(model="tiny-wan", pool_mb=16, page_kb=16,
                                       preemption="block"), cost=wan_profile())
    engine.policy = Alternate(engine.cost)
    reqs = [GenerationRequest(prompt=f"waves {i}", width=32, height=32, num_frames=5,
                              num_inference_steps=3, guidance_scale=4.0, seed=i,
                              request_id=f"v{i}") for i in range(2)]
    tickets = [engine.submit(r, priority=i) for i, r in enumerate(reqs)]
    engine.start()
    outs = [t.future.result(300).output for t in tickets]
    engine.drain(30)
    parks = engine.executor.blocks.parks
    assert parks >= 4  # each of the 3 steps of each request paused at block 1
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0
    for r, out in zip(reqs, outs, strict=True):
        assert np.array_equal(out, _alone(engine.gen, r))
