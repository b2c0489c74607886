"""``ditmem serve --devices N``'s front process loads only what request checks need: its
generator's networks are meta tensors (no weights), and its checks — model rules, prompt
tokens, page estimates, refusals — are those of the fully loaded model."""

from __future__ import annotations

from pathlib import Path

import pytest

from ditmem import models
from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.front_model import load_for_checks, weight_bytes
from ditmem.server.limits import ModelRules, count_tokens

pytestmark = pytest.mark.timeout(300)

PROFILE = Path(__file__).parents[2] / "benchmarks/parallel/results/cpu-tiny-devices2.json"

ASKS = [  # (width, height, frames, steps, negative prompt)
    (64, 48, 1, 5, None), (256, 256, 1, 20, "blurry"), (96, 64, 5, 6, "ugly"),
    (128, 64, 9, 30, None), (50, 64, 1, 4, None), (64, 64, 4, 4, None), (64, 64, 1, 0, None)]


def _outcome(gen, ask, page_bytes):
    w, h, frames, steps, neg = ask
    request = GenerationRequest("a red cat on a mat " * 3, width=w, height=h, num_frames=frames,
                                num_inference_steps=steps, negative_prompt=neg,
                                guidance_scale=4.0, seed=1)
    try:
        return gen.estimate_pages(request, page_bytes)
    except ValueError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("model", ["tiny-qwen-image", "tiny-wan"])
def test_the_front_generator_holds_no_weights_and_checks_as_the_model(model):
    from ditmem.engine.factory import scheduler_model

    front, full = load_for_checks(model), models.load(model)
    assert weight_bytes(front) == 0 < weight_bytes(full)
    assert ModelRules.of(front) == ModelRules.of(full)
    assert scheduler_model(model, front) == scheduler_model(model, full)
    for text in ("a red cat", "a lighthouse at dusk, " * 40, "ünïcödé ✓"):
        assert count_tokens(front, text) == count_tokens(full, text)
    outcomes = [(_outcome(front, a, p), _outcome(full, a, p)) for a in ASKS
                for p in (1 << 12, 1 << 16)]
    for got, want in outcomes:
        assert got == want
    assert any(isinstance(g, int) for g, _ in outcomes)
    assert any(isinstance(g, str) for g, _ in outcomes)  # refusals are compared too


@pytest.mark.parametrize("model", ["tiny-qwen-image", "tiny-wan"])
def test_a_diffusers_folder_is_read_without_its_weight_files(model, tmp_path):
    """The tiny pipeline saved as a diffusers folder, loaded fully, then its weight files
    removed: the front still builds from the configs, tokenizer and scheduler alone, and
    checks as the fully loaded folder."""
    models.load(model).pipe.save_pretrained(tmp_path)
    full = models.load(str(tmp_path))
    weights = [p for p in tmp_path.rglob("*") if p.suffix in (".safetensors", ".bin")]
    assert weights
    for p in weights:
        p.unlink()
    front = load_for_checks(str(tmp_path))
    assert weight_bytes(front) == 0
    assert ModelRules.of(front) == ModelRules.of(full)
    assert count_tokens(front, "a red cat") == count_tokens(full, "a red cat")
    for ask in ASKS:
        assert _outcome(front, ask, 1 << 14) == _outcome(full, ask, 1 << 14)
    with pytest.raises(ValueError, match="model_index.json"):
        load_for_checks(str(tmp_path / "transformer"))
    index = tmp_path / "model_index.json"
    index.write_text(index.read_text().replace('"transformer": [\n    "diffusers",',
                                               '"transformer": [\n    "nowhere",'))
    with pytest.raises(ValueError, match="'transformer' is nowhere"):
        load_for_checks(str(tmp_path))


@pytest.mark.slow
def test_serve_devices_front_loads_no_weights(monkeypatch):
    """The real start of ``serve --devices 2`` (saved profile, workers started) with the
    full model load forbidden in the front: it serves a request."""
    from ditmem.engine.factory import EngineConfig
    from ditmem.parallel.service_factory import build_node_service

    def no_load(*args, **kwargs):
        raise AssertionError("the front loaded the model's weights")

    monkeypatch.setattr(models, "load", no_load)
    config = EngineConfig(model="tiny-qwen-image", profile=str(PROFILE), pool_mb=8,
                          host_mb=8, page_kb=16)
    service = build_node_service(config, 2, log=lambda *_: None)
    try:
        assert weight_bytes(service.gen) == 0
        ticket = service.submit(GenerationRequest("a red cat", width=64, height=64,
                                                  num_inference_steps=3, seed=1,
                                                  request_id="front-1"))
        result = ticket.future.result(timeout=120)
        assert result.output.shape == (64, 64, 3) and result.output.std() > 1
        assert result.peak_bytes > 0
    finally:
        service.drain(30)


@pytest.mark.parametrize("choice, kept, measures", [
    ("auto", None, True), ("auto", "usable", False), ("auto", "broken", True),
    ("measure", "usable", True), (str(PROFILE), None, False)])
def test_the_front_loads_the_weights_exactly_when_the_profile_is_measured(
        choice, kept, measures, monkeypatch, tmp_path):
    """``serve --devices``'s start-up profile: the full model is loaded in the front only
    for a measurement, and every measurement gets it (never the weightless generator),
    whatever the kept profile's state; a measurement is stubbed (the saved profile)."""
    import json

    import ditmem.tools.profile as prof
    from ditmem.engine.factory import EngineConfig
    from ditmem.parallel.service_factory import _node_profile

    monkeypatch.setenv("DITMEM_CACHE", str(tmp_path))
    saved = json.loads(PROFILE.read_text())
    if kept is not None:
        path = prof.profile_cache_path("tiny-qwen-image", "cpu")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(saved if kept == "usable" else {"format": 1}))
    loads, measured = [], []
    real_load = models.load

    def load(*args, **kwargs):
        loads.append(args[0])
        return real_load(*args, **kwargs)

    def measure(gen, *args, **kwargs):
        measured.append(weight_bytes(gen))
        return saved

    monkeypatch.setattr(models, "load", load)
    monkeypatch.setattr(prof, "measure_profile", measure)
    config = EngineConfig(model="tiny-qwen-image", profile=choice, page_kb=16)
    profile = _node_profile(config, load_for_checks("tiny-qwen-image"), "qwen-image")
    assert profile["models"] == saved["models"]
    assert len(measured) == int(measures) and all(b > 0 for b in measured)
    assert loads == (["tiny-qwen-image"] if measures else [])
