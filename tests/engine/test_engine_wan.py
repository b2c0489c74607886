"""The engine on the real tiny Wan generator (video): the output of a request run next to
another one equals the stock ``WanPipeline`` output (``generator.reference``)."""

from __future__ import annotations

import numpy as np
from toy import table_profile

from ditmem.engine.factory import EngineConfig, build_engine
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import CostModel


def wan_profile() -> CostModel:
    data = table_profile(step_s=0.01)
    data["models"] = {"wan2.2-a14b": data["models"]["qwen-image"]}
    return CostModel.from_dict(data)


def test_tiny_wan_videos_through_the_engine():
    engine = build_engine(EngineConfig(model="tiny-wan", policy="slo", pool_mb=16, page_kb=16),
                          cost=wan_profile()).start()
    reqs = [GenerationRequest(prompt=f"waves {i}", width=32, height=32, num_frames=5,
                              num_inference_steps=3, seed=i, request_id=f"v{i}")
            for i in range(2)]
    tickets = [engine.submit(r, priority=i) for i, r in enumerate(reqs)]
    outs = [t.future.result(300).output for t in tickets]
    engine.drain(30)
    assert engine.pool.num_used_pages == 0
    for r, out in zip(reqs, outs, strict=True):
        ref = engine.gen.reference(GenerationRequest(
            prompt=r.prompt, width=32, height=32, num_frames=5, num_inference_steps=3,
            seed=r.seed))
        assert out.shape == ref.shape and out.ndim == 4 and out.shape[-1] == 3
        assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1
