"""``ditmem serve --ray``: the server as a Ray Serve application (docs/deploy.md).

Connects to a cluster (``--ray-address``; default: starts a local one), runs the
application (``--replicas`` engine replicas of ``--devices-per-replica`` devices each,
routed by ``--router``) and serves HTTP on ``--host``/``--port`` until SIGTERM/SIGINT; then
the application is deleted (each replica finishes its requests for at most
``--drain-timeout`` seconds) and Serve shuts down.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

log = logging.getLogger("ditmem.deploy")


def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of the Ray deployment (one argument group)."""
    g = p.add_argument_group("Ray Serve (several engines behind one endpoint; needs the "
                             "'ray' extra: pip install 'ditmem[ray]')")
    g.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: an HTTP ingress and --replicas engines")
    g.add_argument("--replicas", type=int, default=1,
                   help="engine replicas (with --ray; default %(default)s)")
    g.add_argument("--devices-per-replica", type=float, default=1.0,
                   help="devices each replica reserves as Ray resources: GPUs (cuda), the "
                        "custom resource 'npu' (npu), CPUs (cpu; fractions allowed); "
                        "default %(default)s")
    g.add_argument("--ray-address", default=None,
                   help="cluster to join ('auto', or HOST:PORT of `ray start --head`); "
                        "default: start a local cluster in this process")
    g.add_argument("--ray-cpus", type=float, default=None,
                   help="CPUs of the local cluster (without --ray-address; default: all)")
    g.add_argument("--router", choices=("ditmem", "ray"), default="ditmem",
                   help="ditmem: backlog- and deadline-aware (default); ray: Ray Serve's "
                        "power of two choices on queue length")
    g.add_argument("--move-period", type=float, default=1.0,
                   help="seconds between two looks of each replica's rebalancer, which "
                        "hands a parked request late on its replica to one where it is on "
                        "time (ditmem router only; 0: no migration); default %(default)s")
    g.add_argument("--move-s", type=float, default=0.5,
                   help="what a hand-off is taken to cost, off the request's deadline when "
                        "judging another replica; default %(default)s")


def check_ray_arguments(args) -> None:
    """SystemExit for flag combinations that cannot run (before anything loads)."""
    if args.replicas < 1:
        raise SystemExit(f"ditmem serve: --replicas must be >= 1, got {args.replicas}")
    if not args.ray and (args.replicas != 1 or args.ray_address):
        raise SystemExit("ditmem serve: --replicas > 1 and --ray-address need --ray")
    if args.move_period < 0 or args.move_s < 0:
        raise SystemExit("ditmem serve: --move-period and --move-s must be >= 0")
    if args.ray:
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            raise SystemExit("ditmem serve --ray: Ray Serve is not installed "
                             "(pip install 'ditmem[ray]')") from None


def serve_on_ray(args, engine_config, server_config) -> int:
    """Run the application until SIGTERM/SIGINT; 0 once it was deleted cleanly."""
    import ray
    from ray import serve

    from ditmem.deploy.app import DeployOptions, build_app
    from ditmem.deploy.replica import MoveOptions

    try:
        moves = MoveOptions(period_s=args.move_period, move_s=args.move_s,
                            rule=args.router == "ditmem")
        options = DeployOptions(replicas=args.replicas,
                                devices_per_replica=args.devices_per_replica,
                                router=args.router, moves=moves)
        app = build_app(engine_config, server_config, options)
    except ValueError as exc:
        raise SystemExit(f"ditmem serve --ray: {exc}") from None
    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False)
    stop = threading.Event()
    previous = {}
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name="ditmem", route_prefix="/")
        # After Ray and Serve started: they install handlers of their own.
        previous = {s: signal.signal(s, lambda *_: stop.set())
                    for s in (signal.SIGTERM, signal.SIGINT)}
        log.warning("ditmem serve --ray: %d replica(s) of %s, router %s, on http://%s:%d",
                    args.replicas, engine_config.model, args.router, args.host, args.port)
        while not stop.wait(1.0):
            pass
        log.warning("ditmem serve --ray: stopping (replicas finish their requests)")
        serve.delete("ditmem")
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        serve.shutdown()
        ray.shutdown()
