"""``ditmem serve --opt POLICY.KEY=VALUE``: the served policy's options, checked before
anything starts (a clear exit, never a traceback), and handed to the policy the engine runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ditmem.cli import build_parser
from ditmem.engine.factory import build_engine
from ditmem.server.cli import engine_config


def _args(*argv):
    parser, _ = build_parser("serve")
    return parser.parse_args(["serve", *argv])


def test_options_reach_the_served_policy():
    args = _args("--policy", "slo", "--opt", "slo.packing=0", "--opt", 'slo.tail="fifo"',
                 "--profile", "cpu-tiny")
    config = engine_config(args)
    assert config.policy_options == {"packing": 0, "tail": "fifo"}
    engine = build_engine(config)  # not started: nothing runs
    assert engine.policy.packing == 0 and engine.policy.lane.rule == "fifo"
    default = build_engine(engine_config(_args("--profile", "cpu-tiny")))
    assert default.policy.packing != 0


@pytest.mark.parametrize("opt, message", [
    ("slo.bogus=1", "unknown option"),
    ("fifo.x=1", "runs policy 'slo', not 'fifo'"),
    ("packing=0", "expected POLICY.KEY=VALUE"),
])
def test_bad_options_are_named(opt, message):
    with pytest.raises(ValueError, match=message):
        engine_config(_args("--opt", opt))


def test_a_bad_option_exits_with_its_message_before_the_model_loads():
    out = subprocess.run([sys.executable, "-m", "ditmem.cli", "serve", "--opt", "slo.bogus=1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "unknown option(s) bogus" in out.stderr
