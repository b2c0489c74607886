"""The Ray Serve application: ingress -> engine replicas (ditmem router), plus the board.

``build_app(engine_config, server_config, options)`` binds the three deployments; ``serve.run``
of it (``ditmem serve --ray``, tests, benchmarks) starts them on the connected cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ray import serve
from ray.serve.config import RequestRouterConfig

from ditmem.deploy.board import Board
from ditmem.deploy.ingress import Ingress
from ditmem.deploy.replica import EngineReplica, MoveOptions
from ditmem.deploy.router import DitmemRequestRouter

ROUTERS = ("ditmem", "ray")


@dataclass(slots=True)
class DeployOptions:
    """``replicas``: engine replicas; ``devices_per_replica``: devices each reserves (GPUs
    on cuda, the custom resource ``npu`` on npu, CPUs on cpu — fractions allowed there);
    ``router``: "ditmem" (:class:`DitmemRequestRouter`) or "ray" (Ray Serve's default,
    power of two choices on queue length); ``stats_period_s``: how often Serve asks each
    replica for its routing stats; ``post_period_s``: how often replicas post to the board;
    ``reroutes``: times a request whose replica died is sent again; ``autoscaling``: Ray
    Serve's own ``autoscaling_config`` for the engine deployment (replaces ``replicas``);
    ``moves``: each replica's rebalancer (:class:`~ditmem.deploy.replica.MoveOptions`;
    default: every second, by the rule, with the ditmem router; with Ray's router it only
    carries out moves an operator ordered: that router is the no-migration baseline)."""

    replicas: int = 2
    devices_per_replica: float = 1.0
    router: str = "ditmem"
    stats_period_s: float = 0.5
    post_period_s: float = 0.5
    accept_timeout_s: float = 60.0
    reroutes: int = 2
    health_check_period_s: float = 2.0
    autoscaling: dict | None = None
    moves: MoveOptions | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {self.replicas}")
        if not self.devices_per_replica > 0:
            raise ValueError(f"devices_per_replica: must be > 0, got "
                             f"{self.devices_per_replica}")
        if self.router not in ROUTERS:
            raise ValueError(f"router: one of {', '.join(ROUTERS)}, got {self.router!r}")


def replica_resources(device: str, devices: float) -> tuple[dict, int]:
    """(Ray actor options reserving ``devices`` of the kind ``device`` names, torch threads
    for the engine). A replica of several GPUs/NPUs is a node engine (DESIGN.md "Many
    devices"), which this build does not have: ValueError then."""
    kind = device.split(":")[0]
    if kind == "cpu":
        return {"num_cpus": devices}, max(1, math.floor(devices))
    if devices != int(devices):
        raise ValueError(f"devices_per_replica: whole {kind} devices, got {devices}")
    if devices > 1:
        raise ValueError(f"devices_per_replica {int(devices)}: a replica over several "
                         f"{kind} devices needs the node engine (ditmem.parallel), not in "
                         "this build; run one device per replica (--replicas N)")
    if kind == "cuda":
        return {"num_gpus": int(devices), "num_cpus": 1}, 1
    if kind == "npu":
        return {"resources": {"npu": int(devices)}, "num_cpus": 1}, 1
    raise ValueError(f"device: cpu, cuda or npu, got {device!r}")


def move_options(opts: DeployOptions) -> MoveOptions:
    """The replicas' rebalancer for ``opts`` (see :class:`DeployOptions`)."""
    if opts.moves is not None:
        return opts.moves
    return MoveOptions(rule=opts.router == "ditmem")


def build_app(engine_config, server_config, options: DeployOptions | None = None):
    """The bound application (pass to ``serve.run``). ``engine_config``: each replica's
    ``EngineConfig``; ``server_config``: the ingress's ``ServerConfig``."""
    opts = options or DeployOptions()
    actor_options, threads = replica_resources(engine_config.device, opts.devices_per_replica)
    quiet = {"enable_access_log": False}
    board = serve.deployment(Board, name="board", num_replicas=1, logging_config=quiet,
                             ray_actor_options={"num_cpus": 0}).bind()
    if opts.router == "ditmem":
        router = RequestRouterConfig(request_router_class=DitmemRequestRouter,
                                     request_routing_stats_period_s=opts.stats_period_s,
                                     request_routing_stats_timeout_s=5.0)
    else:
        router = RequestRouterConfig(request_routing_stats_period_s=opts.stats_period_s,
                                     request_routing_stats_timeout_s=5.0)
    scale = ({"autoscaling_config": opts.autoscaling} if opts.autoscaling
             else {"num_replicas": opts.replicas})
    engine = serve.deployment(
        EngineReplica, name="engine", ray_actor_options=actor_options,
        # The engine queues and refuses (429) by itself: Ray must not hold requests back.
        max_ongoing_requests=engine_config.max_active + engine_config.max_queued + 8,
        request_router_config=router, health_check_period_s=opts.health_check_period_s,
        health_check_timeout_s=30.0, logging_config=quiet,
        graceful_shutdown_timeout_s=server_config.drain_timeout_s,
        **scale,
    ).bind(engine_config, board, threads, opts.post_period_s, move_options(opts))
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=10_000)
    return ingress.bind(engine, board, server_config, opts.post_period_s,
                        opts.accept_timeout_s, opts.reroutes)
