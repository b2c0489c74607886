"""Hypothesis over the request models: arbitrary JSON values (huge and negative numbers,
NaN/Infinity, booleans, lone surrogates, digit strings in other scripts, nested lists and
objects, unknown keys) in every field of every body. In process, parsing raises nothing but
InvalidField; over HTTP (live server, toy engine, small limits so valid requests are cheap),
no response is a 5xx and none hangs (each request has a timeout)."""

from __future__ import annotations

import json

import httpx
import pytest
from harness import running_server, toy_engine
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ditmem.server.limits import Limits, ModelRules
from ditmem.server.requests import (
    ChatRequest,
    Defaults,
    GenerationOptions,
    ImageRequest,
    InvalidField,
    VideoRequest,
    build_spec,
    chat_options,
    chat_prompt,
    validate,
)

LIMITS = Limits(max_side=256, max_pixels=128 * 128, max_steps=6, max_n=2, max_frames=9)
RULES = ModelRules(size_multiple=16, frame_step=4)
DEFAULTS = Defaults(size="32x32", steps=2, frames=5, fps=8)
FIELDS = sorted(set(GenerationOptions.model_fields) | {"prompt", "output_format"})

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                     max_size=3)
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), surrogates,
    st.sampled_from(["--64", "²", "٣٢", "9" * 400, "64", " 32 ", "32x32", "854x480",
                     "64×48", "0x16", "1e3", "1_6", "high", "low", "b64_json", "mp4", "gif",
                     "user", "text", ""]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=8))
fuzz_fields = st.dictionaries(keys, values, max_size=6)
plausible = st.fixed_dictionaries({}, optional={
    "size": st.sampled_from(["32x32", "48x40", "854x480", "100x40"]),
    "num_inference_steps": st.integers(0, 7), "n": st.integers(1, 3),
    "seed": st.integers(0, 2**63), "priority": st.sampled_from([0, 1, 2, "high", 3]),
    "num_frames": st.integers(0, 10), "fps": st.integers(0, 30),
    "guidance_scale": st.floats(-1, 101), "negative_prompt": st.text(max_size=8)})
fields = st.one_of(fuzz_fields, plausible,
                   st.builds(lambda a, b: {**a, **b}, plausible, fuzz_fields))
prompts = st.one_of(st.just("a cat"), values)
parts = st.one_of(values, st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                 "text": values}))
messages = st.one_of(values, st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system"]), values),
     "content": st.one_of(values, st.lists(parts, max_size=3))}), max_size=3))


def image_bodies():
    return st.builds(lambda p, f: {"prompt": p, **f}, prompts, fields)


def chat_bodies():
    return st.builds(lambda m, f, e: {"messages": m, **f, **({"extra_body": e} if e else {})},
                     messages, fields, st.one_of(st.none(), fields, values))


def parse(path: str, body):
    """What the routes do before submitting, in process."""
    if path == "images":
        req = validate(ImageRequest, body)
        return build_spec(req, req.prompt, LIMITS, RULES, DEFAULTS)
    if path == "videos":
        req = validate(VideoRequest, body)
        return build_spec(req, req.prompt, LIMITS, RULES, DEFAULTS, video=True)
    req = validate(ChatRequest, body)
    opts, ignored = chat_options(req)
    return build_spec(opts, chat_prompt(req), LIMITS, RULES, DEFAULTS, ignored=ignored)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.tuples(st.just("images"), image_bodies()),
                 st.tuples(st.just("videos"), image_bodies()),
                 st.tuples(st.just("chat"), chat_bodies()),
                 st.tuples(st.sampled_from(["images", "videos", "chat"]), values)))
def test_parsing_raises_only_invalid_field(case):
    path, body = case
    try:
        spec = parse(path, body)
    except InvalidField as exc:
        assert exc.field and exc.message.startswith(exc.field)
        event(f"invalid {exc.field.split('.')[0]}")
        return
    event("valid")
    assert LIMITS.min_side <= spec.width <= LIMITS.max_side and spec.width % 16 == 0
    assert spec.width * spec.height <= LIMITS.max_pixels
    assert 1 <= spec.num_inference_steps <= LIMITS.max_steps and 1 <= spec.n <= LIMITS.max_n
    assert (spec.num_frames - 1) % 4 == 0 or path != "videos"


@pytest.fixture(scope="module")
def server():
    with running_server(toy_engine(), limits=LIMITS, rules=RULES, default_size="32x32",
                        default_steps=2, default_frames=5) as url:
        with httpx.Client(base_url=url, timeout=20) as client:
            yield client


def check(r: httpx.Response) -> None:
    event(f"status {r.status_code}")
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.tuples(st.just("/v1/images/generations"), image_bodies()),
                 st.tuples(st.just("/v1/videos"), image_bodies()),
                 st.tuples(st.just("/v1/chat/completions"), chat_bodies()),
                 st.tuples(st.sampled_from(["/v1/images/generations", "/v1/videos",
                                            "/v1/chat/completions"]), values)))
def test_http_json_bodies_never_5xx(server, case):
    path, body = case
    text = json.dumps(body)  # ensure_ascii: lone surrogates travel as \ud800 escapes
    check(server.post(path, content=text, headers={"content-type": "application/json"}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, st.one_of(st.text(max_size=12), scalars.map(str)), max_size=8),
       st.booleans())
def test_http_video_forms_never_5xx(server, fields, as_multipart):
    fields = {k: v.encode("utf-8", "replace").decode() for k, v in fields.items()
              if k.encode("utf-8", "replace").decode() == k}
    if as_multipart:
        files = {k: (None, v) for k, v in fields.items()}
        r = server.post("/v1/videos", files=files or {"prompt": (None, "x")})
    else:
        r = server.post("/v1/videos", data=fields)
    check(r)
