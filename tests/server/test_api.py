"""The HTTP API against a live server (uvicorn on 127.0.0.1) over the toy generator:
outputs equal the generator's independent reference; bad input names the field; faults
leave no pages behind (read from /metrics)."""

from __future__ import annotations

import base64
import io
import time

import httpx
import numpy as np
import openai
import pytest
from harness import metric, running_server, toy_engine
from PIL import Image
from toy import ToyGenerator

from ditmem.models.common.request import GenerationRequest


def reference(width, height, steps, seed, frames=1):
    return ToyGenerator().reference(GenerationRequest(
        prompt="p", width=width, height=height, num_inference_steps=steps, seed=seed,
        num_frames=frames))


def png(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def decode_mp4(data: bytes) -> list[np.ndarray]:
    import av

    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def wait_metrics(url, until, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics").text
        if until(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server():
    with running_server(toy_engine()) as url:
        yield url


def test_images_openai_client_matches_reference(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    resp = client.images.generate(prompt="a cat", n=2, size="128x64", response_format="b64_json",
                                  extra_body={"seed": 7, "num_inference_steps": 3,
                                              "priority": "high", "slo_ms": 60000})
    assert len(resp.data) == 2
    for i, item in enumerate(resp.data):
        np.testing.assert_array_equal(png(item.b64_json), reference(128, 64, 3, 7 + i))
    timing = resp.model_extra["timing"]["requests"][0]
    assert timing["priority"] == 0 and timing["slo_ms"] == 60000 and timing["steps"] == 3
    assert {"queued_ms", "running_ms", "paused_ms", "preemptions"} <= set(timing)


def test_chat_completions_extra_body_both_forms(server):
    raw = httpx.post(f"{server}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "a dog"}],
        "extra_body": {"height": 32, "width": 48, "num_inference_steps": 2, "seed": 3}},
        timeout=30).json()
    url = raw["choices"][0]["message"]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    np.testing.assert_array_equal(png(url.split(",", 1)[1]), reference(48, 32, 2, 3))
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    sdk = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "a dog"}],
        extra_body={"height": 32, "width": 48, "num_inference_steps": 2, "seed": 3})
    assert sdk.choices[0].message.content is not None or sdk.choices[0].message.model_extra


def test_videos_poll_and_content(server):
    job = httpx.post(f"{server}/v1/videos", json={"prompt": "waves", "size": "32x32",
                                                  "num_frames": 5, "seed": 1,
                                                  "num_inference_steps": 3}).json()
    assert job["status"] in ("queued", "in_progress", "completed")
    for _ in range(500):
        job = httpx.get(f"{server}/v1/videos/{job['id']}").json()
        if job["status"] == "completed":
            break
        time.sleep(0.01)
    assert job["status"] == "completed" and job["timing"]["steps"] == 3
    content = httpx.get(f"{server}/v1/videos/{job['id']}/content")
    assert content.headers["content-type"] == "video/mp4"
    frames = decode_mp4(content.content)
    ref = reference(32, 32, 3, 1, frames=5)  # the toy's frames are latent-sized
    assert len(frames) == 5 and frames[0].shape == ref[0].shape
    assert httpx.get(f"{server}/v1/videos/nope").status_code == 404


@pytest.mark.parametrize("body,field", [
    ({"size": "64x64"}, "prompt"),
    ({"prompt": "  "}, "prompt"),
    ({"prompt": "x", "size": "big"}, "size"),
    ({"prompt": "x", "size": "8x64"}, "size"),
    ({"prompt": "x", "size": "0x64"}, "size"),
    ({"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
    ({"prompt": "x", "num_inference_steps": 10_000}, "num_inference_steps"),
    ({"prompt": "x", "num_inference_steps": "many"}, "num_inference_steps"),
    ({"prompt": "x", "priority": "urgent"}, "priority"),
    ({"prompt": "x", "priority": 3}, "priority"),
    ({"prompt": "x", "slo_ms": -5}, "slo_ms"),
    ({"prompt": "x", "slo_ms": "soon"}, "slo_ms"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "response_format": "url"}, "response_format"),
    ({"prompt": "x", "seed": -1}, "seed"),
])
def test_bad_input_names_the_field(server, body, field):
    r = httpx.post(f"{server}/v1/images/generations", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"]


def test_bad_json_and_chat_without_user_message(server):
    r = httpx.post(f"{server}/v1/images/generations", content=b"{nope",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(f"{server}/v1/chat/completions",
                   json={"messages": [{"role": "system", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_request_larger_than_pool_is_413():
    # 64 pages of 1 KiB; a toy 1024x1040 state is 4 ch x 64 x 65 x 4 B = 65 pages.
    with running_server(toy_engine(pages=64)) as url:
        r = httpx.post(f"{url}/v1/images/generations",
                       json={"prompt": "x", "size": "1024x1040"})
    assert r.status_code == 413 and r.json()["error"]["param"] == "size"
    assert "pages" in r.json()["error"]["message"]


def test_error_in_one_request_fails_only_that_one(server):
    with httpx.Client(timeout=30) as c:
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(2) as pool:
            bad = pool.submit(c.post, f"{server}/v1/images/generations",
                              json={"prompt": "fail-step please", "seed": 1})
            good = pool.submit(c.post, f"{server}/v1/images/generations",
                               json={"prompt": "fine", "seed": 2, "size": "64x64",
                                     "num_inference_steps": 4})
            bad, good = bad.result(), good.result()
    assert bad.status_code == 500 and "injected step failure" in bad.json()["error"]["message"]
    assert good.status_code == 200
    np.testing.assert_array_equal(png(good.json()["data"][0]["b64_json"]),
                                  reference(64, 64, 4, 2))
    for stage in ("fail-encode", "fail-decode"):
        r = httpx.post(f"{server}/v1/images/generations", json={"prompt": stage}, timeout=30)
        assert r.status_code == 500 and stage.split("-")[1] in r.json()["error"]["message"]
    text = wait_metrics(server, lambda t: metric(t, "ditmem_pages_used") == 0)
    assert metric(text, "ditmem_pages_used") == 0
    assert metric(text, "ditmem_requests_finished_total", 'outcome="failed"') >= 3


def test_health_and_metrics(server):
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    text = httpx.get(f"{server}/metrics").text
    for name in ("ditmem_queue_depth", "ditmem_running", "ditmem_paused", "ditmem_pages_free",
                 "ditmem_bytes_offloaded_total", "ditmem_preemptions_total",
                 "ditmem_step_seconds_bucket"):
        assert name in text
    assert metric(text, "ditmem_slo_total", 'priority="0",result="met"') >= 2


def test_api_key():
    with running_server(toy_engine(), api_key="sekret") as url:
        assert httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"}).status_code == 401
        bad = {"Authorization": "Bearer wrong"}
        assert httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"},
                          headers=bad).status_code == 401
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="sekret").images.generate(
            prompt="x", size="64x64", response_format="b64_json")
        assert len(ok.data) == 1
        assert httpx.get(f"{url}/health").status_code == 200


def test_queue_full_is_429_and_nothing_leaks():
    engine = toy_engine(max_queued=2)
    with running_server(engine, start_engine=False) as url:
        for _ in range(2):  # taken, then the client gives up (timeout) -> cancelled
            with httpx.Client(timeout=0.3) as c, pytest.raises(httpx.TimeoutException):
                c.post(f"{url}/v1/images/generations", json={"prompt": "x"})
        # the two cancels wait for an engine that is not running: both still count as queued
        wait_metrics(url, lambda t: metric(t, "ditmem_queue_depth") == 2)
        r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        engine.start()
        text = wait_metrics(url, lambda t: metric(
            t, "ditmem_requests_finished_total", 'outcome="cancelled"') == 2)
        assert metric(text, "ditmem_requests_finished_total", 'outcome="cancelled"') == 2
        assert metric(text, "ditmem_queue_depth") == 0
        assert metric(text, "ditmem_requests_finished_total", 'outcome="rejected"') == 1
        assert metric(text, "ditmem_pages_used") == 0


def test_client_disconnect_cancels_and_frees_pages():
    engine = toy_engine(step_sleep_s=0.02)
    with running_server(engine) as url:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/images/generations", timeout=0.5,
                       json={"prompt": "long", "num_inference_steps": 200, "size": "256x256"})
        text = wait_metrics(url, lambda t: metric(
            t, "ditmem_requests_finished_total", 'outcome="cancelled"') == 1)
        assert metric(text, "ditmem_requests_finished_total", 'outcome="cancelled"') == 1
        assert metric(text, "ditmem_requests_finished_total", 'outcome="completed"') == 0
        assert metric(text, "ditmem_pages_used") == 0
        assert engine.gen.steps_run < 200
