"""The request shapes the vllm-omni diffusion benchmark client sends, written out byte for
byte by our own code (raw bodies, not a client library's encoding), against a live server:
chat completions with a literal ``extra_body``, images with ``size`` and a Bearer key,
videos as urlencoded form fields (every value as text, what its form class sends without a
file) and as multipart with an ``input_reference`` image; then the fields that client reads
back (``stage_durations``, ``peak_memory_mb``) and its poll / content / delete sequence."""

from __future__ import annotations

import io
import json
import time
from urllib.parse import quote_plus

import httpx
import pytest
from harness import running_server, toy_engine
from PIL import Image

from ditmem.server.limits import ModelRules

BOUNDARY = "a1b2c3d4e5f6"


def urlencoded(fields: dict) -> bytes:
    return "&".join(f"{quote_plus(k)}={quote_plus(str(v))}" for k, v in fields.items()).encode()


def multipart(fields: dict, files: dict | None = None) -> bytes:
    out = []
    for k, v in fields.items():
        out.append(f'--{BOUNDARY}\r\nContent-Type: text/plain; charset=utf-8\r\n'
                   f'Content-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    for k, (name, kind, data) in (files or {}).items():
        out.append(f'--{BOUNDARY}\r\nContent-Type: {kind}\r\nContent-Disposition: form-data; '
                   f'name="{k}"; filename="{name}"\r\n\r\n'.encode() + data + b"\r\n")
    out.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(out)


@pytest.fixture(scope="module")
def server():
    wan_like = ModelRules(size_multiple=16, frame_step=4)
    with running_server(toy_engine(), rules=wan_like, model_name="Wan-AI/Wan2.2") as url:
        yield url


def test_chat_extra_body_shape(server):
    body = json.dumps({"model": "Qwen/Qwen-Image", "messages": [
        {"role": "user", "content": "a cat wearing sunglasses"}],
        "extra_body": {"height": 480, "width": 854, "num_inference_steps": 3, "seed": 42}})
    r = httpx.post(f"{server}/v1/chat/completions", content=body.encode(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    out = r.json()
    first = out["choices"][0]["message"]["content"][0]
    assert first["image_url"]["url"].startswith("data:image/png;base64,")
    assert first["stage_durations"]["denoise"] > 0 and first["peak_memory_mb"] > 0
    assert out["metrics"]["stage_durations"] and out["metrics"]["peak_memory_mb"] > 0
    assert any("848x480" in w for w in out["warnings"])  # the client's 854 rounded down


def test_images_size_shape(server):
    body = json.dumps({"model": "Qwen/Qwen-Image", "prompt": "a cat", "n": 1,
                       "size": "854x480", "response_format": "b64_json", "seed": 7,
                       "num_inference_steps": 3, "slo_ms": 60000.0})
    r = httpx.post(f"{server}/v1/images/generations", content=body.encode(), timeout=60,
                   headers={"Content-Type": "application/json",
                            "Authorization": "Bearer EMPTY"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["peak_memory_mb"] > 0
    assert r.json()["data"][0]["b64_json"]


def run_video_job(server, content: bytes, kind: str) -> tuple[dict, bytes]:
    """POST, poll until completed/failed, fetch content, delete: the client's sequence."""
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.post("/v1/videos", content=content, headers={"Content-Type": kind})
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["id"] and job["status"]
        for _ in range(3000):
            job = c.get(f"/v1/videos/{job['id']}").json()
            if job["status"] in ("completed", "failed"):
                break
            time.sleep(0.01)
        assert job["status"] == "completed", job
        data = c.get(f"/v1/videos/{job['id']}/content").content
        assert c.delete(f"/v1/videos/{job['id']}").status_code == 200
        return job, data


VIDEO_FIELDS = {"prompt": "waves at sunset", "height": 480, "width": 854, "num_frames": 8,
                "num_inference_steps": 3, "seed": 0, "fps": 16, "guidance_scale": 4.0}


def test_videos_urlencoded_shape(server):
    job, data = run_video_job(server, urlencoded(VIDEO_FIELDS),
                              "application/x-www-form-urlencoded")
    assert data[4:8] == b"ftyp"  # an MP4 file
    assert job["stage_durations"]["denoise"] > 0 and job["peak_memory_mb"] > 0
    assert job["size"] == "848x480" and job["num_frames"] == 9 and job["fps"] == 16
    assert len(job["warnings"]) == 2  # 854 -> 848, 8 -> 9 frames (diffusers' rounding)


def test_videos_multipart_shape(server):
    kind = f"multipart/form-data; boundary={BOUNDARY}"
    job, data = run_video_job(server, multipart(VIDEO_FIELDS), kind)
    assert data[4:8] == b"ftyp" and job["num_frames"] == 9
    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(png, format="PNG")
    r = httpx.post(f"{server}/v1/videos", headers={"Content-Type": kind},
                   content=multipart(VIDEO_FIELDS, {"input_reference": (
                       "ref.png", "image/png", png.getvalue())}))
    assert r.status_code == 400, r.text  # read, then refused: the model is text-to-video
    assert r.json()["error"]["param"] == "input_reference"
