"""Hostile input against a live server (toy engine): every case of the probe that gave a
500 before now gets a 4xx naming the field (or a 200 with a warning where the request is
rounded as diffusers does), on ONE keep-alive connection that stays usable throughout;
bodies past the byte cap are cut off; a 10 MB prompt never stalls /health."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from harness import running_server, toy_engine

from ditmem.server.limits import Limits, ModelRules

IMAGES, CHAT, VIDEOS = "/v1/images/generations", "/v1/chat/completions", "/v1/videos"
NINES = "9" * 5000


def chat(content, **extra):
    return {"messages": [{"role": "user", "content": content}], **extra}


# (path, raw JSON text or dict, expected status, field named in the error)
CASES = [
    (IMAGES, {"prompt": "x", "size": NINES + "x64"}, 400, "size"),
    (IMAGES, '{"prompt": "x", "size": ' + NINES + '}', 400, "body"),
    (IMAGES, '{"prompt": "x", "width": ' + NINES + '}', 400, "body"),
    (IMAGES, {"prompt": "x", "width": "--64"}, 400, "width"),
    (IMAGES, {"prompt": "x", "width": "²"}, 400, "width"),
    (IMAGES, {"prompt": "x", "width": NINES}, 400, "width"),
    (IMAGES, {"prompt": "x", "height": "٣٢"}, 400, "height"),
    (IMAGES, {"prompt": "x", "num_inference_steps": "--64"}, 400, "num_inference_steps"),
    (IMAGES, {"prompt": "x", "num_inference_steps": "²"}, 400, "num_inference_steps"),
    (IMAGES, {"prompt": "x", "num_inference_steps": NINES}, 400, "num_inference_steps"),
    (IMAGES, {"prompt": "x", "num_inference_steps": True}, 400, "num_inference_steps"),
    (IMAGES, '{"prompt": "\\ud800 lone surrogate"}', 400, "prompt"),
    (IMAGES, '{"prompt": "x", "negative_prompt": "\\udfff"}', 400, "negative_prompt"),
    (IMAGES, "[" * 100_000, 400, "body"),
    (IMAGES, '{"prompt": "x", "slo_ms": NaN}', 400, "slo_ms"),
    (IMAGES, '{"prompt": "x", "guidance_scale": Infinity}', 400, "guidance_scale"),
    (IMAGES, {"prompt": "x", "seed": 2**64}, 400, "seed"),
    (IMAGES, {"prompt": "x", "n": 5}, 400, "n"),
    (IMAGES, {"prompt": "x", "num_frames": 9}, 400, "num_frames"),
    (IMAGES, [1, 2], 400, "body"),
    (CHAT, chat([{"type": "text", "text": 5}]), 400, "messages.0.content.0.text"),
    (CHAT, chat([{"type": "text", "text": {"a": 1}}]), 400, "messages.0.content.0.text"),
    (CHAT, chat([{"type": "text", "text": ["x"]}]), 400, "messages.0.content.0.text"),
    (CHAT, chat(7), 400, "messages.0.content"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, chat("x", model="m" * 10_000), 400, "model"),
    (CHAT, chat("x", extra_body=[1]), 400, "extra_body"),
    (CHAT, chat("x", extra_body={"width": "--64"}), 400, "extra_body.width"),
    (CHAT, chat([{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text",
                                                                         "text": "x"}]),
     400, "messages.0.content"),
    (VIDEOS, {"prompt": "x", "num_frames": 0}, 400, "num_frames"),
    (VIDEOS, {"prompt": "x", "num_frames": NINES}, 400, "num_frames"),
    (VIDEOS, {"prompt": "x", "fps": 0}, 400, "fps"),
    (VIDEOS, {"prompt": "x", "n": 2}, 400, "n"),
    (VIDEOS, {"prompt": "x", "output_format": "avi"}, 400, "output_format"),
]


@pytest.fixture(scope="module")
def server():
    with running_server(toy_engine(), limits=Limits(max_body_bytes=2**20)) as url:
        yield url


def post(client, path, body, **kw):
    if isinstance(body, str):
        return client.post(path, content=body.encode("utf-8", "surrogatepass"),
                           headers={"content-type": "application/json"}, **kw)
    return client.post(path, json=body, **kw)


def test_hostile_cases_name_the_field_on_one_connection(server):
    with httpx.Client(base_url=server, timeout=30) as client:
        for path, body, status, field in CASES:
            r = post(client, path, body)
            assert r.status_code == status, (path, str(body)[:80], r.text[:300])
            err = r.json()["error"]
            assert err["param"] == field, (str(body)[:80], err)
            assert err["code"] == status and err["message"]
        # the keep-alive connection survived all of them
        ok = client.post(IMAGES, json={"prompt": "fine", "size": "32x32", "seed": 1})
        assert ok.status_code == 200


def test_non_json_content_types_are_refused_on_json_routes(server):
    body = json.dumps({"prompt": "x"})
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        for path in (IMAGES, CHAT):
            r = httpx.post(f"{server}{path}", content=body, headers={"content-type": kind})
            assert r.status_code == 415, (kind, r.text)
            assert r.json()["error"]["param"] == "body"
    r = httpx.post(f"{server}{IMAGES}", content=body)  # no Content-Type at all
    assert r.status_code == 415


def test_bodies_past_the_cap_are_cut_off(server):
    big = b'{"prompt": "' + b"a" * (3 * 2**20) + b'"}'
    r = httpx.post(f"{server}{IMAGES}", content=big,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"

    def chunks():  # no Content-Length: the cap applies while streaming
        yield b'{"prompt": "'
        for _ in range(64):
            yield b"a" * 2**16
        yield b'"}'

    r = httpx.post(f"{server}{IMAGES}", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_long_prompts_are_rejected_without_stalling_health():
    with running_server(toy_engine()) as url:  # default 16 MiB body cap
        stalls = []
        stop = threading.Event()

        def probe():
            while not stop.is_set():
                t0 = time.monotonic()
                httpx.get(f"{url}/health", timeout=30)
                stalls.append(time.monotonic() - t0)
                time.sleep(0.01)

        t = threading.Thread(target=probe)
        t.start()
        try:
            r = httpx.post(f"{url}{IMAGES}", timeout=60,
                           json={"prompt": "x", "negative_prompt": "n" * 10_000_000})
        finally:
            stop.set()
            t.join()
        assert r.status_code == 400 and r.json()["error"]["param"] == "negative_prompt"
        assert "--max-prompt-chars" in r.json()["error"]["message"]
        assert max(stalls) < 2.0, max(stalls)


def test_sides_round_down_with_a_warning(server):
    r = httpx.post(f"{server}{IMAGES}", json={"prompt": "x", "size": "854x480", "seed": 2},
                   timeout=30)
    assert r.status_code == 200, r.text
    assert any("854x480" in w and "848x480" in w for w in r.json()["warnings"])
    r = httpx.post(f"{server}{CHAT}", json=chat("x", extra_body={"width": 100, "height": 40}),
                   timeout=30)
    assert r.status_code == 200 and any("96x32" in w for w in r.json()["warnings"])


def test_unknown_fields_are_named_in_warnings(server):
    r = httpx.post(f"{server}{IMAGES}", json={"prompt": "x", "quality": "hd", "sys_type": 1},
                   timeout=30)
    assert r.status_code == 200
    assert any("'quality'" in w and "'sys_type'" in w for w in r.json()["warnings"])


def test_model_shape_rules_wan_frames_and_image_models():
    wan = ModelRules(size_multiple=16, frame_step=4)
    with running_server(toy_engine(), rules=wan) as url:
        r = httpx.post(f"{url}{VIDEOS}", json={"prompt": "x", "num_frames": 6,
                                               "size": "32x32", "num_inference_steps": 2})
        assert r.status_code == 200, r.text
        assert r.json()["num_frames"] == 5 and "runs 5" in r.json()["warnings"][0]
    qwen = ModelRules(size_multiple=16, frame_step=0, min_steps=2, min_steps_reason="NaN")
    with running_server(toy_engine(), rules=qwen) as url:
        r = httpx.post(f"{url}{VIDEOS}", json={"prompt": "x", "num_frames": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "num_frames"
        r = httpx.post(f"{url}{IMAGES}", json={"prompt": "x", "num_inference_steps": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "num_inference_steps"
        assert "NaN" in r.json()["error"]["message"]


def test_admission_rejects_requests_too_long_for_this_device():
    with running_server(toy_engine(), limits=Limits(max_request_s=0.05)) as url:
        r = httpx.post(f"{url}{IMAGES}", json={"prompt": "x", "size": "1024x1024",
                                               "num_inference_steps": 200})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "estimated" in msg and "--max-request-s" in msg
        ok = httpx.post(f"{url}{IMAGES}", json={"prompt": "x", "num_inference_steps": 2},
                        timeout=30)
        assert ok.status_code == 200


def test_limits_are_listed_and_the_schema_documents_every_body(server):
    limits = httpx.get(f"{server}/v1/limits").json()
    assert limits["limits"]["max_body_bytes"] == 2**20
    assert {"max_steps", "max_pixels", "max_frames", "max_n", "max_request_s",
            "max_prompt_chars", "video_store_bytes", "video_ttl_s"} <= set(limits["limits"])
    model = httpx.get(f"{server}/v1/models").json()["data"][0]
    assert model["limits"] == limits["limits"]
    spec = httpx.get(f"{server}/openapi.json").json()
    for path, name in ((IMAGES, "ImageRequest"), (CHAT, "ChatRequest"),
                       (VIDEOS, "VideoRequest")):
        content = spec["paths"][path]["post"]["requestBody"]["content"]
        assert content["application/json"]["schema"]["$ref"].endswith(name)
        assert "prompt" in spec["components"]["schemas"][name]["properties"] or name == \
            "ChatRequest"
    assert "multipart/form-data" in spec["paths"][VIDEOS]["post"]["requestBody"]["content"]


def test_unknown_routes_and_ids_are_404_without_redirects(server):
    for method, path in (("GET", "/v1/videos/nope"), ("GET", "/v1/videos/nope/content"),
                         ("DELETE", "/v1/videos/nope"), ("GET", "/v1/models/"),
                         ("GET", "/nothing")):
        r = httpx.request(method, f"{server}{path}", headers={"host": "evil.example"})
        assert r.status_code == 404, (path, r.status_code)
        assert "location" not in r.headers
        assert r.json()["error"]["code"] == 404


def test_prompts_past_the_text_window_get_a_warning():
    from types import SimpleNamespace

    engine = toy_engine()
    words = lambda text, add_special_tokens=False: SimpleNamespace(input_ids=text.split())
    engine.gen.pipe = SimpleNamespace(tokenizer=words)  # one token per word
    with running_server(engine, rules=ModelRules(text_tokens=8)) as url:
        r = httpx.post(f"{url}{IMAGES}", json={"prompt": "a " * 20, "negative_prompt": "b c"},
                       timeout=30)
        assert r.status_code == 200
        assert r.json()["warnings"] == [
            "prompt: 20 tokens; the text encoder reads the first 8 (the rest is dropped, as "
            "the stock pipeline does)"]
        r = httpx.post(f"{url}{CHAT}", json=chat("x " * 9), timeout=30)
        assert any("9 tokens" in w for w in r.json()["warnings"])
