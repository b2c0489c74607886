"""Policy options are checked by name before a run: a misspelt ``--opt`` is a clear error
naming it and what the policy takes, not a TypeError traceback."""

from __future__ import annotations

import pytest
from node_factories import node_cost

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.policies import make_policy


def test_a_known_option_reaches_the_policy():
    assert make_policy("slo", CostModel.load("h200"), window=7).window == 7


def test_an_unknown_option_is_named():
    with pytest.raises(ValueError, match=r"policy 'slo': unknown option\(s\) bogus;.*window"):
        make_policy("slo", CostModel.load("h200"), bogus=1)
    with pytest.raises(ValueError, match="unknown option.*takes none"):
        make_policy("fifo", CostModel.load("h200"), window=3)


def test_node_policies_check_their_options_too():
    ncost = node_cost()
    node = Node(2, ncost.links)
    assert make_node_policy("slo", ncost, node, guard=True).guard is True
    with pytest.raises(ValueError, match=r"policy 'elastic-np': unknown option\(s\) guard"):
        make_node_policy("elastic-np", ncost, node, guard=True)
    with pytest.raises(ValueError, match="policy 'fifo'.*baseline_degree"):
        make_node_policy("fifo", ncost, node, baseline_degree=1, x=1)


def test_opt_values_are_json_none_or_the_bare_string():
    from ditmem.scheduler.cli import parse_options

    got = parse_options(["slo.late_rank=lane", 'slo.tail="fifo"', "slo.packing=0.5",
                         "slo.batching=false", "slo.late_tile_margin=None"])
    assert got == {"slo": {"late_rank": "lane", "tail": "fifo", "packing": 0.5,
                           "batching": False, "late_tile_margin": None}}
    for bad in ("slo.late_rank", ".late_rank=lane", "slo.=1"):
        with pytest.raises(ValueError, match="expected POLICY.KEY=VALUE"):
            parse_options([bad])


def test_a_bare_string_the_policy_does_not_take_is_named_by_it():
    from ditmem.scheduler.cli import parse_options

    opts = parse_options(["slo.late_rank=lane"])["slo"]
    assert make_policy("slo", CostModel.load("h200"), **opts).late_rank == "lane"
    with pytest.raises(ValueError, match="late_rank"):
        make_policy("slo", CostModel.load("h200"), **parse_options(["slo.late_rank=lifo"])["slo"])
