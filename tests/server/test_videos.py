"""Video jobs: MP4 (H.264) at the requested fps, encoded once at completion; GIF as an
option; DELETE removes and frees (404 afterwards, the running request cancelled); the store
keeps results within its byte budget and TTL and never evicts a running job; a flood of
full-size video jobs keeps the process's memory within the budget."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import pytest
from harness import metric, running_app, toy_engine
from PIL import Image
from toy import ToyGenerator

from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import CostModel, make_policy
from ditmem.server import outputs
from ditmem.server.limits import Limits

MIB = 2**20


def decode_mp4(data: bytes):
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return frames, stream.average_rate, stream.codec_context.name


def wait_status(url, vid, want=("completed", "failed"), timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        job = httpx.get(f"{url}/v1/videos/{vid}").json()
        if job.get("status") in want or time.monotonic() > deadline:
            return job
        time.sleep(0.01)


def test_mp4_bytes_round_trip():
    t = np.linspace(0, 1, 9)[:, None, None, None]
    y = np.linspace(0, 1, 48)[None, :, None, None]
    x = np.linspace(0, 1, 64)[None, None, :, None]
    frames = (255 * (0.5 * x + 0.3 * y + 0.2 * t) * np.ones((1, 1, 1, 3))).astype(np.uint8)
    decoded, rate, codec = decode_mp4(outputs.mp4_bytes(frames, fps=12))
    assert codec == "h264" and rate == 12 and len(decoded) == 9
    err = np.abs(np.stack(decoded).astype(int) - frames.astype(int)).mean()
    assert err < 3.0, err
    odd = outputs.mp4_bytes(frames[:, :47, :63], fps=5)  # 4:2:0 pads odd sides
    assert decode_mp4(odd)[0][0].shape == (48, 64, 3)
    with pytest.raises(ValueError, match="fps"):
        outputs.mp4_bytes(frames, fps=0)


def test_mp4_at_the_requested_fps_encoded_once(monkeypatch):
    calls = []
    real = outputs.mp4_bytes
    monkeypatch.setattr(outputs, "mp4_bytes", lambda f, fps: calls.append(fps) or real(f, fps))
    with running_app(toy_engine()) as (url, app):
        job = httpx.post(f"{url}/v1/videos", json={"prompt": "waves", "size": "128x96",
                                                   "num_frames": 7, "fps": 8, "seed": 3,
                                                   "num_inference_steps": 3}).json()
        job = wait_status(url, job["id"])
        assert job["status"] == "completed" and job["fps"] == 8
        assert job["stage_durations"]["denoise"] >= 0 and job["peak_memory_mb"] > 0
        first = httpx.get(f"{url}/v1/videos/{job['id']}/content")
        second = httpx.get(f"{url}/v1/videos/{job['id']}/content")
        assert first.content == second.content and calls == [8]
        frames, rate, codec = decode_mp4(first.content)
        assert codec == "h264" and rate == 8 and len(frames) == 7
        ref = ToyGenerator().reference(GenerationRequest(
            prompt="waves", width=128, height=96, num_inference_steps=3, seed=3,
            num_frames=7))
        assert frames[0].shape == ref[0].shape
        gif = httpx.post(f"{url}/v1/videos", json={"prompt": "w", "size": "64x64",
                                                   "num_frames": 3, "output_format": "gif",
                                                   "num_inference_steps": 2}).json()
        wait_status(url, gif["id"])
        r = httpx.get(f"{url}/v1/videos/{gif['id']}/content")
        assert r.headers["content-type"] == "image/gif"
        assert Image.open(io.BytesIO(r.content)).n_frames == 3


def test_delete_removes_frees_and_cancels():
    engine = toy_engine(step_sleep_s=0.02)
    with running_app(engine) as (url, app):
        done = httpx.post(f"{url}/v1/videos", json={"prompt": "a", "size": "32x32",
                                                    "num_frames": 3,
                                                    "num_inference_steps": 2}).json()
        wait_status(url, done["id"])
        held = app.state.videos.bytes_held
        assert held > 0
        assert metric(httpx.get(f"{url}/metrics").text, "ditmem_video_store_bytes") == held
        r = httpx.delete(f"{url}/v1/videos/{done['id']}")
        assert r.status_code == 200 and r.json()["deleted"] is True
        for path in (f"/v1/videos/{done['id']}", f"/v1/videos/{done['id']}/content"):
            assert httpx.get(f"{url}{path}").status_code == 404
        assert httpx.delete(f"{url}/v1/videos/{done['id']}").status_code == 404
        running = httpx.post(f"{url}/v1/videos", json={"prompt": "b", "size": "64x64",
                                                       "num_frames": 3,
                                                       "num_inference_steps": 200}).json()
        wait_status(url, running["id"], want=("in_progress",))
        assert httpx.get(f"{url}/v1/videos/{running['id']}/content").status_code == 409
        assert httpx.delete(f"{url}/v1/videos/{running['id']}").status_code == 200
        assert httpx.get(f"{url}/v1/videos/{running['id']}").status_code == 404
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = httpx.get(f"{url}/metrics").text
            if metric(text, "ditmem_requests_finished_total", 'outcome="cancelled"') == 1:
                break
            time.sleep(0.02)
        assert metric(text, "ditmem_pages_used") == 0
        assert engine.gen.steps_run < 200
        assert app.state.videos.bytes_held == 0


def test_budget_never_evicts_running_jobs_and_ttl_expires():
    # each job reserves 3 x 64 x 64 x 3 = 36,864 raw bytes; the budget holds two
    limits = Limits(video_store_bytes=80_000, video_ttl_s=60)
    engine = toy_engine(step_sleep_s=0.02)
    body = {"prompt": "x", "size": "64x64", "num_frames": 3, "num_inference_steps": 100}
    with running_app(engine, limits=limits, start_engine=False) as (url, app):
        store = app.state.videos
        a = httpx.post(f"{url}/v1/videos", json=body).json()
        b = httpx.post(f"{url}/v1/videos", json=body).json()
        full = httpx.post(f"{url}/v1/videos", json=body)
        assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
        assert store.bytes_held <= limits.video_store_bytes
        engine.start()
        for job in (a, b):  # neither was evicted while running
            assert wait_status(url, job["id"])["status"] == "completed"
        c = httpx.post(f"{url}/v1/videos", json=dict(body, num_inference_steps=2)).json()
        wait_status(url, c["id"])
        # the encoded results are small: all three fit, nothing was evicted
        assert all(httpx.get(f"{url}/v1/videos/{j['id']}").status_code == 200
                   for j in (a, b, c))
        now = [time.monotonic()]
        store.clock = lambda: now[0] + 61  # past the TTL
        for job in (a, b, c):
            assert httpx.get(f"{url}/v1/videos/{job['id']}").status_code == 404
        assert store.bytes_held == 0


class FullSizeToy(ToyGenerator):
    """Decodes to full-size frames (the toy's latents repeated 16x16), as a real VAE."""

    def decode(self, state):
        out = super().decode(state)
        return np.repeat(np.repeat(out, 16, axis=-3), 16, axis=-2)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
def test_a_flood_of_video_jobs_stays_within_the_budget():
    budget = 48 * MIB
    cost = CostModel.from_dict(__import__("toy").table_profile())
    engine = Engine(FullSizeToy(), make_policy("slo", cost), cost, PagePool(4096, 4096),
                    HostPool(4096, 4096))
    body = {"prompt": "flood", "size": "512x512", "num_frames": 33,
            "num_inference_steps": 2}  # 26 MB of raw frames each, MP4 of noise ~10 MB
    limits = Limits(video_store_bytes=budget, max_frames=64)
    with running_app(engine, limits=limits) as (url, app):
        store = app.state.videos
        before, peak_held, accepted, refused, at_8 = rss_bytes(), 0, 0, 0, 0
        deadline = time.monotonic() + 240
        with httpx.Client(base_url=url, timeout=60) as client:
            while accepted < 24 and time.monotonic() < deadline:
                r = client.post("/v1/videos", json=dict(body, seed=accepted))
                if r.status_code == 429:
                    refused += 1
                    time.sleep(0.05)
                    continue
                assert r.status_code == 200, r.text
                accepted += 1
                peak_held = max(peak_held, store.bytes_held)
                if accepted == 8:
                    at_8 = rss_bytes()
        assert accepted == 24, (accepted, refused)
        grown, after = rss_bytes() - before, rss_bytes()
    raw_total = 24 * 33 * 512 * 512 * 3  # ~620 MB: what keeping results by count held
    assert peak_held <= budget
    # the store holds at most the budget; the rest of the growth is one job's working set
    # (decoded frames, the encoder's buffers) and the allocator's retained arenas, which do
    # not grow with the number of jobs: jobs 9-24 (416 MB of raw frames) add < one budget
    assert after - at_8 < budget, ((after - at_8) / MIB, raw_total / MIB)
    assert grown < 2 * budget + 64 * MIB, (grown / MIB, raw_total / MIB)
