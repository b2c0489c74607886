"""The profile's parallel table from measured rows, and ``ditmem profile --devices``
argument checks (pure; the measurement itself runs in test_node_engine)."""

from argparse import Namespace

import pytest

from ditmem.parallel.profile_devices import check_device_arguments
from ditmem.parallel.speedup import degrees_of, speedup_table
from ditmem.scheduler.node.speedup import parse_table


def _row(tokens, degree, wall, cpu):
    return {"side": 0, "tokens": tokens, "degree": degree, "speedup": wall, "cpu_speedup": cpu}


def test_table_is_ascending_degree_one_exact_and_loads_in_the_scheduler():
    rows = [_row(1024, 1, 1.0, 1.0), _row(1024, 2, 3.0, 1.57),
            _row(256, 1, 1.0, 1.0), _row(256, 2, 0.7, 1.11)]
    table = speedup_table(rows, "measured here")
    assert table == {"tokens": [256, 1024], "speedup": {"1": [1.0, 1.0], "2": [1.11, 1.57]},
                     "source": "measured here"}
    assert speedup_table(rows, "x", clock="wall")["speedup"]["2"] == [0.7, 3.0]
    parsed = parse_table(table, "parallel.qwen-image")
    assert parsed.speedup(512, 2) == pytest.approx(1.11 + 0.5 * (1.57 - 1.11))
    with pytest.raises(ValueError, match="clock"):
        speedup_table(rows, "x", clock="gpu")


def test_degrees_and_argument_checks():
    assert degrees_of(1) == [1] and degrees_of(2) == [1, 2] and degrees_of(6) == [1, 2, 4]
    ok = Namespace(devices=2, model="tiny-qwen-image", parallel_sides="256,512")
    assert check_device_arguments(ok, device_count=2) is None
    assert "exceeds" in check_device_arguments(Namespace(**{**vars(ok), "devices": 3}), 2)
    assert ">= 1" in check_device_arguments(Namespace(**{**vars(ok), "devices": 0}), 2)
    assert "Qwen-Image" in check_device_arguments(Namespace(**{**vars(ok), "model": "tiny-wan"}),
                                                  2)
    bad = Namespace(**{**vars(ok), "parallel_sides": "256,100"})
    assert "multiples of 16" in check_device_arguments(bad, 2)
