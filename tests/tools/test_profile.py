"""``ditmem profile``: the profile built from measurements, by hand and on the tiny model."""

from __future__ import annotations

import pytest

from ditmem.scheduler import CostModel, Request
from ditmem.scheduler.profiles import parse_profile
from ditmem.tools.profile import build_profile, measure_profile, parse_tile

MEASURED = {
    "steps": [{"tokens": 16, "batch": 1, "seconds": 0.003},
              {"tokens": 256, "batch": 1, "seconds": 0.005}],
    "encode_s": 0.002,
    # decode time 2.5 s per megapixel up to the tile; 512² (untiled, slower) is ignored
    "decode_s": {64: 0.01024, 128: 0.04096, 256: 0.16384, 512: 0.9},
    "state_bytes": {64: 1000.0, 128: 4000.0},
    "key": "qwen-image",
    "frames": 1,
    "decode_tile": (256, 224, 0.16384),
}


def test_build_profile_by_hand():
    data = build_profile(MEASURED, model="tiny-qwen-image", name="t", pool_mb=64, max_batch=4,
                         weights_bytes=10, link=1e9, page_kb=16)
    parse_profile(data, "built")
    cost = CostModel.from_dict(data)
    assert cost.page_bytes == 16 * 1024
    model = data["models"]["qwen-image"]
    assert model["decode_s_per_megapixel"]["value"] == pytest.approx(2.5)
    assert model["encode_s"]["value"] == pytest.approx(0.002)
    small = Request("s", 0.0, width=128, height=128)
    assert cost.decode_time(small) == pytest.approx(0.04096)
    big = Request("b", 0.0, width=512, height=512)  # tiles start at 0, 224, 448
    tiles = cost.decode_tiles(big)
    assert len(tiles) == 9 and max(tiles) == pytest.approx(0.16384)
    untiled = dict(MEASURED, decode_tile=None)
    data = build_profile(untiled, model="tiny-qwen-image", name="t", pool_mb=64, max_batch=4,
                         weights_bytes=10, link=1e9)
    assert "decode_tile_px" not in data["models"]["qwen-image"]


def test_parse_tile():
    assert parse_tile("256,224") == (256, 224)
    assert parse_tile("none") is None
    for bad in ("256", "250,224", "256,288", "a,b"):
        with pytest.raises(ValueError, match="--decode-tile"):
            parse_tile(bad)


@pytest.mark.slow
def test_measure_profile_on_the_tiny_model():
    from ditmem import models

    gen = models.load("tiny-qwen-image")
    data = measure_profile(gen, "tiny-qwen-image", [64, 128], [1, 2], 1, log=lambda *_: None,
                           decode_tile=(64, 48))
    parse_profile(data, "measured")
    model = data["models"]["qwen-image"]
    assert model["decode_tile_px"]["value"] == 64 and model["decode_stride_px"]["value"] == 48
    points = model["step"]["points"]["value"]
    assert {(p["tokens"], p["batch"]) for p in points} == {(16, 1), (16, 2), (64, 1), (64, 2)}
    assert all(p["seconds"] > 0 for p in points)


@pytest.mark.parametrize("command", ["demo", "serve", "profile"])
def test_bad_decode_tile_is_a_usage_error(command, capsys):
    from ditmem.cli import build_parser

    parser, _ = build_parser(command)
    argv = [command, "--decode-tile", "250,224"] + (["--out", "x.json"] if command == "profile"
                                                   else [])
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    assert "argument --decode-tile: TILE and STRIDE must be multiples of 16" in (
        capsys.readouterr().err)
    good = parser.parse_args([command] + (["--out", "x.json"] if command == "profile" else []))
    assert good.decode_tile == (256, 224)
