"""``ditmem serve``'s start-up profile: measured for its model and device at the first start,
kept, reused after (``--profile auto``), measured again on request or when the kept one no
longer loads, or taken as given; and the engine builds for a video model (``tiny-wan``
exited with a traceback against the image-only ``cpu-tiny`` profile)."""

from __future__ import annotations

import json

import pytest

import ditmem.tools.profile as prof
from ditmem.scheduler import CostModel


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """A private cache and the smallest measurement that is still a real one."""
    monkeypatch.setenv("DITMEM_CACHE", str(tmp_path))
    monkeypatch.setattr(prof, "STARTUP_SIDES", (32, 64))
    monkeypatch.setattr(prof, "STARTUP_VIDEO_SIDES", (32,))
    monkeypatch.setattr(prof, "STARTUP_BATCHES", (1,))
    monkeypatch.setattr(prof, "STARTUP_REPEATS", 1)
    calls = []
    real = prof.measure_profile

    def counting(*args, **kw):
        calls.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(prof, "measure_profile", counting)
    return calls


def test_auto_measures_once_then_reuses_and_measure_measures_again(tiny, tmp_path):
    from ditmem import models

    gen = models.load("tiny-qwen-image")
    logs = []
    path = prof.startup_profile(gen, "tiny-qwen-image", "cpu", "auto", log=logs.append)
    assert path.startswith(str(tmp_path)) and len(tiny) == 1
    cost = CostModel.load(path)
    points = cost.profile["models"]["qwen-image"]["step"]
    assert cost.max_batch("qwen-image") >= 1 and points["kind"] == "table"
    assert cost.name.startswith("tiny-qwen-image on cpu")
    assert prof.startup_profile(gen, "tiny-qwen-image", "cpu", "auto", log=logs.append) == path
    assert len(tiny) == 1  # reused, not measured again
    assert any("measured earlier" in line for line in logs)
    prof.startup_profile(gen, "tiny-qwen-image", "cpu", "measure", log=logs.append)
    assert len(tiny) == 2
    # a kept profile that no longer loads (or lacks the model) is measured again
    with open(path, "w") as f:
        json.dump({"format": 1, "name": "broken"}, f)
    assert prof.startup_profile(gen, "tiny-qwen-image", "cpu", "auto", log=logs.append) == path
    assert len(tiny) == 3 and CostModel.load(path).max_batch("qwen-image") >= 1
    # the cache is per model and device
    assert prof.profile_cache_path("tiny-qwen-image", "cpu") != prof.profile_cache_path(
        "tiny-wan", "cpu") != prof.profile_cache_path("tiny-wan", "cuda:0")


def test_a_given_profile_is_used_as_is(tiny):
    assert prof.startup_profile(None, "tiny-qwen-image", "cpu", "h200") == "h200"
    assert prof.startup_profile(None, "tiny-qwen-image", "cpu", "/x/p.json") == "/x/p.json"
    assert tiny == []


@pytest.mark.slow
def test_serve_builds_an_engine_for_tiny_wan_from_its_own_measured_profile(tiny):
    from ditmem.cli import build_parser
    from ditmem.engine.factory import build_engine
    from ditmem.server.cli import engine_config

    parser, _ = build_parser("serve")
    args = parser.parse_args(["serve", "--model", "tiny-wan", "--default-frames", "5"])
    assert args.profile == "auto"
    engine = build_engine(engine_config(args))
    assert tiny == ["tiny-wan"]
    assert engine.cost.max_batch("wan2.2-a14b") >= 1
    r = engine.cost.base.profile["models"]["wan2.2-a14b"]
    assert r["step"]["kind"] == "table"
