"""``ditmem serve``: the HTTP server (OpenAI images / vllm-omni chat / videos API).

SIGTERM (or Ctrl-C) stops intake — uvicorn closes the listening socket, new submissions
get 503 — and the engine drains for at most ``--drain-timeout`` seconds; what is left is
cancelled (503) and the process exits: 0 when everything finished, 1 when the drain timed
out, 3 when the engine died. A second signal exits at once (130).
"""

from __future__ import annotations

import argparse
import os

from ditmem.deploy.cli import add_ray_arguments, check_ray_arguments
from ditmem.engine.factory import EngineConfig, add_model_arguments, build_engine
from ditmem.engine.threads import add_threads_argument, set_torch_threads
from ditmem.server.app import ServerConfig, create_app
from ditmem.server.limits import add_limit_arguments, limits_from_args
from ditmem.server.security import KEY_ENV, check_api_key
from ditmem.tools.profile import add_decode_tile_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen-image",
                   help="tiny-qwen-image | tiny-wan | a diffusers folder")
    p.add_argument("--policy", default="slo", choices=("fifo", "srtf", "slo"))
    p.add_argument("--opt", action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="an option of the served policy, as in `ditmem sim --opt` (VALUE is "
                        "JSON), e.g. slo.packing=0 (repeatable; checked at start)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get(KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1; read from the "
                        f"environment variable {KEY_ENV} when not given (prefer it: "
                        "command lines are visible to other users); an empty key is refused")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host names the server answers (e.g. "
                        "'localhost,127.0.0.1'; '*.example.com' patterns); others get 400. "
                        "Default: any")
    p.add_argument("--drain-timeout", type=float, default=600.0,
                   help="on SIGTERM/SIGINT, seconds to let running requests finish before "
                        "cancelling them (503); a second signal exits at once")
    p.add_argument("--pool-mb", type=float, default=None,
                   help="device page pool size (default: 64 on cpu, else --memory-fraction)")
    p.add_argument("--host-mb", type=float, default=None,
                   help="host pool in MiB (or --host-memory-gb)")
    add_model_arguments(p)
    p.add_argument("--page-kb", type=int, default=64, help="page size in KiB")
    p.add_argument("--profile", default="auto",
                   help="the cost model's device profile: 'auto' (default): measured for this "
                        "model and device at the first start (about a minute), kept in "
                        "~/.cache/ditmem/profiles and reused after; 'measure': measure again; "
                        "or a profile JSON (ditmem profile) or name to reuse")
    p.add_argument("--device", default="cpu")
    p.add_argument("--devices", type=int, default=1,
                   help="serve on a node of N devices (N >= 2: one worker process per "
                        "device, on cpu pinned to a core, N <= cores): policy slo "
                        "(elastic sequence-parallel degree, migration) or fifo (static "
                        "single-device replicas); --profile needs the parallel and links "
                        "sections (ditmem profile --devices N), else they are measured at "
                        "start")
    p.add_argument("--max-active", type=int, default=64, help="running + paused requests")
    p.add_argument("--max-queued", type=int, default=256, help="waiting requests before 429")
    p.add_argument("--slo-scale", type=float, default=3.0,
                   help="default SLO = scale x standalone estimate when slo_ms is not given")
    p.add_argument("--decode-workers", type=int, choices=(0, 1), default=0,
                   help="1: VAE decode on a worker thread beside the step loop")
    p.add_argument("--decode", choices=("auto", "inline", "tiled"), default="auto",
                   help="auto (default): fifo decodes right after the last step, the other "
                        "policies tile by tile between steps when a decode is due first")
    add_decode_tile_argument(p, "VAE decode tiles in pixels ('none': whole decodes, as the "
                                "stock pipeline by default; with tiles, images equal the "
                                "stock pipeline with vae.enable_tiling at these sizes)")
    p.add_argument("--preemption", choices=("step", "block"), default="step",
                   help="pause requests between steps, or also between chunks of "
                        "transformer blocks (long video steps)")
    p.add_argument("--default-size", default="256x256")
    p.add_argument("--default-steps", type=int, default=28)
    p.add_argument("--default-frames", type=int, default=17,
                   help="num_frames of /v1/videos when not given (video models)")
    p.add_argument("--default-fps", type=int, default=16, help="fps of /v1/videos results")
    add_limit_arguments(p)
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    add_threads_argument(p)
    add_ray_arguments(p)


def engine_config(args) -> EngineConfig:
    return EngineConfig(model=args.model, policy=args.policy, profile=args.profile,
                        pool_mb=args.pool_mb, host_mb=args.host_mb, page_kb=args.page_kb,
                        max_active=args.max_active, max_queued=args.max_queued,
                        device=args.device, slo_scale=args.slo_scale,
                        decode_workers=args.decode_workers, preemption=args.preemption,
                        decode="inline" if args.decode_workers else args.decode,
                        decode_tile=args.decode_tile, dtype=args.dtype,
                        memory_fraction=args.memory_fraction,
                        host_memory_gb=args.host_memory_gb,
                        profile_frames=_profile_frames(args),
                        policy_options=policy_options(args.opt, args.policy, args.devices > 1))


def policy_options(items: list[str], policy: str, node: bool) -> dict:
    """The served policy's options from ``--opt POLICY.KEY=VALUE`` items; ValueError for a
    malformed item, an option of another policy, or one the policy does not take."""
    from ditmem.scheduler.cli import parse_options
    from ditmem.scheduler.policies import POLICIES, check_options

    given = parse_options(items)
    others = sorted(set(given) - {policy})
    if others:
        raise ValueError(f"--opt: this server runs policy {policy!r}, not {others[0]!r}")
    options = given.get(policy, {})
    if node:
        from ditmem.scheduler.node.policies import NODE_POLICIES

        check_options(policy, NODE_POLICIES[policy], options, positional=2)
    else:
        check_options(policy, POLICIES[policy], options)
    return options


def _profile_frames(args) -> int:
    """Frames per timed request of a start-up measurement: the default video length for
    video models (``--default-frames``), 1 for image models."""
    from ditmem.engine.factory import scheduler_model

    return args.default_frames if scheduler_model(args.model).startswith("wan") else 1


def main(args) -> int:
    import logging

    from ditmem.server.runner import DRAINED, ENGINE_DEAD, exit_now, serve

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        api_key = check_api_key(args.api_key)
        limits = limits_from_args(args)
        engine_config(args)  # the policy's options, checked before anything starts
    except ValueError as exc:
        raise SystemExit(f"ditmem serve: {exc}") from None
    hosts = [h.strip() for h in args.allowed_hosts.split(",")] if args.allowed_hosts else None
    check_ray_arguments(args)
    if args.devices < 1:
        raise SystemExit(f"ditmem serve: --devices must be >= 1, got {args.devices}")
    if args.devices > 1 and args.ray:
        raise SystemExit("ditmem serve: --devices N serves one node in this process; with "
                         "--ray each replica is one device (give one or the other)")
    config = ServerConfig(model_name=args.model, api_key=api_key,
                          default_size=args.default_size, default_steps=args.default_steps,
                          default_frames=args.default_frames, default_fps=args.default_fps,
                          limits=limits, allowed_hosts=hosts,
                          drain_timeout_s=args.drain_timeout)
    if args.ray:
        from ditmem.deploy.cli import serve_on_ray

        return serve_on_ray(args, engine_config(args), config)
    set_torch_threads(args.threads)
    if args.devices > 1:
        from ditmem.parallel.service_factory import build_node_service
        from ditmem.parallel.speedup import CalibrationError

        try:
            engine = build_node_service(engine_config(args), args.devices)
        except (ValueError, CalibrationError) as exc:
            raise SystemExit(f"ditmem serve --devices: {exc}") from None
    else:
        try:
            engine = build_engine(engine_config(args)).start()
        except ValueError as exc:
            raise SystemExit(f"ditmem serve: {exc}") from None
    app = create_app(engine, config)
    status = serve(app, args.host, args.port, args.log_level, engine=engine,
                   drain_timeout_s=args.drain_timeout)
    said = {DRAINED: "drained", ENGINE_DEAD: f"engine dead: {engine.stats().dead}"}
    logging.getLogger("ditmem.server").warning(
        "ditmem serve: stopped (%s)", said.get(status, "drain timed out, the rest cancelled"))
    exit_now(status)
    return status
