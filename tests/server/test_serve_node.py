"""``ditmem serve --devices 2``: the HTTP app over a live node (2 CPU device workers, gloo),
the node loop fed by live arrivals. One server for the module (the workers take ~15 s to
start); the killed-worker test runs last."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from harness import generate_alone, running_app
from PIL import Image

from ditmem import models
from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.node import NodeEngine
from ditmem.parallel.serving import NodeService
from ditmem.scheduler import CostModel

pytestmark = pytest.mark.timeout(300)

PROFILE = Path(__file__).parents[2] / "benchmarks/parallel/results/cpu-tiny-devices2.json"
PAGE = 1 << 14
STEPS = 3


@pytest.fixture(scope="module")
def generator():
    return models.load("tiny-qwen-image")


@pytest.fixture(scope="module")
def served(generator):
    cost = CostModel.from_dict(json.loads(PROFILE.read_text()))
    node = NodeEngine("tiny-qwen-image", 2, pool_pages=512, page_bytes=PAGE, host_pages=512,
                      start_timeout_s=240, command_timeout_s=120)
    service = NodeService(node, generator, cost, policy="slo")
    with running_app(service, model_name="tiny-qwen-image", default_size="64x64",
                     default_steps=STEPS) as (url, app):
        yield url, service


def _image(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _reference(generator, prompt: str, side: int, seed: int) -> np.ndarray:
    """The single-device generator alone (one torch thread, as a worker computes)."""
    return generate_alone(generator, GenerationRequest(
        prompt, width=side, height=side, num_inference_steps=STEPS, seed=seed,
        request_id=f"ref-{seed}"), PAGE)


def _state_mb(generator, prompt: str, side: int, seed: int) -> float:
    """MiB of pages one device's state of this request holds after a step (the reference
    engine's own page count)."""
    from ditmem.memory import PagePool

    state = generator.encode(GenerationRequest(prompt, width=side, height=side,
                                               num_inference_steps=STEPS, seed=seed,
                                               request_id=f"pages-{seed}"), PagePool(512, PAGE))
    generator.step([state])
    pages = int(state.num_pages)
    generator.release(state)
    return round(pages * PAGE / (1 << 20), 3)


def _pages(service) -> dict[int, int]:
    return {d: s.device_pages for d, s in service.node.stats().items()}


def test_concurrent_images_equal_the_single_device_reference(served, generator):
    """Tolerance: 1 uint8 level. The node runs each request at degree 1 or 2 (the policy
    picks; shards compute the same arithmetic on fewer rows and are bit-identical on this
    CPU, see tests/parallel/test_node_engine.py), batched with the others; a latent
    differing in its last bits could move a decoded pixel by one level on other BLAS."""
    url, service = served
    asks = [("a red cat", 64, 1), ("a lighthouse at dusk", 96, 2), ("a bowl of fruit", 64, 3),
            ("a mountain lake", 128, 4)]

    def ask(prompt, side, seed):
        r = httpx.post(f"{url}/v1/images/generations", timeout=120,
                       json={"prompt": prompt, "size": f"{side}x{side}", "seed": seed,
                             "num_inference_steps": STEPS})
        return r.status_code, r.json()

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda a: ask(*a), asks))
    for (prompt, side, seed), (status, body) in zip(asks, answers, strict=True):
        assert status == 200, body
        image = _image(body["data"][0]["b64_json"])
        expected = _reference(generator, prompt, side, seed)
        assert image.shape == expected.shape == (side, side, 3)
        assert np.abs(image.astype(int) - expected.astype(int)).max() <= 1
        (timing,) = body["timing"]["requests"]
        assert timing["steps"] == STEPS and timing["encode_ms"] > 0 and timing["decode_ms"] > 0
        # its state's pages summed over the devices holding a part: at degree 1 what one
        # device's state holds, at degree 2 up to twice that (text rows on both devices)
        alone = _state_mb(generator, prompt, side, seed)
        assert alone <= body["usage"]["peak_memory_mb"] <= 2 * alone + 1e-9, (alone, body)
        assert timing["encode_ms"] + timing["decode_ms"] < timing["running_ms"]
        assert timing["running_ms"] <= timing["latency_ms"] + 1e-3
    assert expected.std() > 1  # a real image, not a flat one
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and [d["device"] for d in health["devices"]] == [0, 1]


def test_bad_input_is_400_and_nothing_reaches_the_devices(served):
    url, service = served
    for body in ({"prompt": "x", "size": "64xabc"}, {"prompt": "x", "num_inference_steps": 0},
                 {"prompt": ""}, {"size": "64x64"}):
        r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"]
    assert service.stats().queued == 0 and service.stats().running == 0


def test_a_cancelled_request_leaves_no_pages_on_either_device(served):
    """A long request is started, its client goes away: its pages are freed on both devices
    (the policy runs a lone request at degree 2, so both hold a shard)."""
    url, service = served
    body = {"prompt": "a very long request", "size": "512x512", "num_inference_steps": 200}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/images/generations", json=body, timeout=3.0)
    deadline = time.monotonic() + 60
    while True:
        pages = _pages(service)
        if service.stats().running == 0 and pages == {0: 0, 1: 0}:
            break
        assert time.monotonic() < deadline, (pages, service.stats())
        time.sleep(0.2)
    assert service.stats().cancelled >= 1
    text = httpx.get(f"{url}/metrics").text
    assert 'ditmem_device_pages_used{device="1"} 0.0' in text


def test_a_killed_worker_fails_only_its_requests(served):
    """Device 1's worker is killed mid-request: that request fails (503, with the reason),
    /health says degraded, and the next requests are served on device 0."""
    url, service = served
    body = {"prompt": "on both devices", "size": "512x512", "num_inference_steps": 200,
            "seed": 5}
    with ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(httpx.post, f"{url}/v1/images/generations", json=body,
                             timeout=120)
        deadline = time.monotonic() + 60
        while service.node.device_pages[1] == 0:  # running, with a shard on device 1
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(service.node.pids[1], signal.SIGKILL)
        r = doomed.result()
    assert r.status_code == 503, r.text
    assert "device 1" in r.json()["error"]["message"]
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "degraded"
    assert health["devices"][1]["status"] == "lost" and health["devices"][0]["status"] == "ok"
    r = httpx.post(f"{url}/v1/images/generations", timeout=120,
                   json={"prompt": "after the loss", "size": "64x64", "seed": 6})
    assert r.status_code == 200, r.text
    assert service.node.device_pages[0] == 0


def test_more_devices_than_cores_is_a_clear_error():
    from ditmem.engine.factory import EngineConfig
    from ditmem.parallel.service_factory import build_node_service

    with pytest.raises(ValueError, match="exceeds the .* cores"):
        build_node_service(EngineConfig(profile=str(PROFILE)), (os.cpu_count() or 1) + 1)
