"""The node sections of a profile: speed-up tables and links (format, lookup, errors)."""

import math

import pytest
from node_factories import node_profile

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.speedup import NodeProfileError, ParallelProfile, parse_table


def _table(**over):
    entry = {"tokens": [1000, 4000], "speedup": {"1": [1, 1], "2": [1.2, 1.8]}, "source": "s"}
    entry.update(over)
    return parse_table(entry, "p")


def test_lookup_is_linear_in_log_tokens_and_clamps():
    t = _table()
    # 2000 tokens is half-way between 1000 and 4000 in log: 1.2 + 0.5 * (1.8 - 1.2) = 1.5
    assert t.speedup(2000, 2) == pytest.approx(1.5)
    assert t.speedup(1000 * 4 ** 0.25, 2) == pytest.approx(1.35)
    assert t.speedup(10, 2) == 1.2  # clamped below
    assert t.speedup(1e6, 2) == 1.8  # clamped above
    assert t.speedup(3000, 1) == 1.0


def test_missing_degree_is_named():
    with pytest.raises(NodeProfileError, match="degree 4.*degrees 1, 2"):
        _table().speedup(2000, 4)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"tokens": [4000, 1000]}, "ascending"),
        ({"speedup": {"1": [1, 1], "3": [1, 1]}}, "power of two"),
        ({"speedup": {"1": [1, 1], "2": [1.2]}}, "needs 2 values"),
        ({"speedup": {"1": [1, 1], "2": [2.5, 1]}}, r"\(0, 2\]"),
        ({"speedup": {"2": [1.2, 1.8]}}, "degree 1"),
        ({"speedup": {"1": [1, 0.9]}}, "1.0 by definition"),
        ({"source": " "}, "source"),
    ],
)
def test_bad_tables_are_rejected_naming_the_field(over, message):
    with pytest.raises(NodeProfileError, match=message):
        _table(**over)


def test_profile_without_node_sections_is_a_clear_error():
    prof = node_profile()
    del prof["links"]
    with pytest.raises(NodeProfileError, match="no 'links' section"):
        ParallelProfile(CostModel.from_dict(prof).profile)
    prof = node_profile()
    del prof["parallel"]
    with pytest.raises(NodeProfileError, match="no 'parallel' section"):
        ParallelProfile(CostModel.from_dict(prof).profile)


def test_unknown_model_in_parallel_section():
    prof = node_profile()
    prof["parallel"]["flux"] = prof["parallel"]["qwen-image"]
    with pytest.raises(NodeProfileError, match="unknown model"):
        ParallelProfile(CostModel.from_dict(prof).profile)


@pytest.mark.parametrize("name", ["h200", "h100", "a100", "ascend-910b"])
def test_shipped_profiles_reproduce_the_vllm_omni_ulysses_anchor(name):
    # Qwen-Image 2048², H800, Ulysses 1/2/4/8: 112.5 / 65.2 / 39.6 / 30.8 s (calibration.md).
    par = ParallelProfile(CostModel.load(name).profile)
    for degree, seconds in ((2, 65.2), (4, 39.6), (8, 30.8)):
        assert par.speedup("qwen-image", 16384, degree) == pytest.approx(112.5 / seconds, 1e-3)
    # Small shapes gain less than large ones (communication and the per-step floor).
    for degree in (2, 4, 8):
        assert par.speedup("qwen-image", 1024, degree) < par.speedup("qwen-image", 16384, degree)
    assert par.links.device_bytes_per_s > par.links.host_bytes_per_s > 0
    assert math.isfinite(par.speedup("qwen-image", 4096, 8))
