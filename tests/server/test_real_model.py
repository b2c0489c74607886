"""A short mixed load through a live server on the real tiny Qwen-Image: every request
succeeds, outputs match the stock diffusers pipeline (1-level uint8 tolerance, see
``ditmem.models.qwen.generate``), and the pool is empty afterwards."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import io

import httpx
import numpy as np
import openai
import pytest
from harness import metric, running_server
from PIL import Image

from ditmem.engine.factory import EngineConfig, build_engine
from ditmem.models.common.request import GenerationRequest


@pytest.mark.slow
def test_mixed_load_real_tiny_qwen():
    engine = build_engine(EngineConfig(policy="slo", pool_mb=16, page_kb=16))
    jobs = [(64 * (1 + i % 2), 3 + i % 3, i % 3, i) for i in range(8)]
    with running_server(engine, model_name="tiny-qwen-image") as url:
        def post(job):
            side, steps, prio, seed = job
            return httpx.post(f"{url}/v1/images/generations", timeout=300, json={
                "prompt": f"mixed load {seed}", "size": f"{side}x{side}", "seed": seed,
                "num_inference_steps": steps, "priority": prio})

        with cf.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(post, jobs))
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="x").images.generate(
            prompt="mixed load 0", size="64x64", response_format="b64_json",
            extra_body={"seed": 0, "num_inference_steps": 3})
        text = httpx.get(f"{url}/metrics").text
    assert [r.status_code for r in responses] == [200] * len(jobs)
    assert metric(text, "ditmem_pages_used") == 0
    assert metric(text, "ditmem_requests_finished_total", 'outcome="completed"') == 9
    gen = engine.gen
    for (side, steps, _prio, seed), r in list(zip(jobs, responses, strict=True))[:3]:
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(
            r.json()["data"][0]["b64_json"]))).convert("RGB"))
        ref = gen.reference(GenerationRequest(prompt=f"mixed load {seed}", width=side,
                                              height=side, num_inference_steps=steps,
                                              seed=seed))
        assert np.abs(img.astype(int) - ref.astype(int)).max() <= 1
    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(sdk.data[0].b64_json))))
    ref0 = np.asarray(Image.open(io.BytesIO(base64.b64decode(
        responses[0].json()["data"][0]["b64_json"]))))
    np.testing.assert_array_equal(first, ref0)  # same request, same bytes
