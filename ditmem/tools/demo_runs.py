"""Replaying the demo's trace under each policy: one after the other in this process, or
one process per policy started together (pinned one per core when there are enough)."""

from __future__ import annotations

import time

from ditmem.engine.threads import set_torch_threads


def decode_mode(args, policy: str, gen) -> str:
    """The decode mode ``policy`` runs with (see ``--decode``)."""
    from ditmem.engine.factory import resolve_decode

    if args.decode_workers:
        return "inline"
    return resolve_decode(args.decode, policy, gen)[0]


def decode_tile(args, gen) -> tuple[int, int] | None:
    """``--decode-tile`` for models that can tile (None for the others, or 'none')."""
    from ditmem.models.common.tiled_decode import supports_tiled_decode

    return args.decode_tile if supports_tiled_decode(gen) else None


def warm_up(gen, trace, pool) -> None:
    """Run each distinct shape for two steps once (first-call costs stay out of the runs)."""
    from ditmem.tools.replay import to_generation

    seen = set()
    for r in trace:
        key = (r.width, r.height, r.frames)
        if key in seen:
            continue
        seen.add(key)
        req = to_generation(r)
        req.num_inference_steps = 2
        state = gen.encode(req, pool)
        while not gen.is_done(state):
            gen.step([state])
        gen.decode(state)
        gen.release(state)


def run_policy(gen, name: str, trace, args, model_key: str, barrier=None,
               line: int = 0) -> dict:
    """Replay ``trace`` under policy ``name`` on a fresh engine; the raw outcome (picklable).
    ``barrier``: wait on it just before the replay (parallel mode starts all together)."""
    from ditmem.engine.factory import EngineConfig, make_policy_and_cost, make_pools
    from ditmem.engine.loop import Engine
    from ditmem.tools.replay import replay

    config = EngineConfig(model=args.model, pool_mb=args.pool_mb, page_kb=args.page_kb,
                          max_queued=max(256, 2 * args.requests))
    policy, cost = make_policy_and_cost(name, args.profile)
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.policies.recorder import ObservingPolicy
    from ditmem.tools.profile_check import ProfileCheck, observe_step_report, observe_timing

    check, as_measured = ProfileCheck(), CostModel.load(args.profile)
    policy = ObservingPolicy(policy, lambda rep: observe_step_report(check, rep, as_measured))
    decisions = None
    if getattr(args, "decisions", None):
        from ditmem.scheduler.policies.recorder import DecisionLog

        policy = decisions = DecisionLog(policy)
    pool, host = make_pools(config, "cpu")
    engine = Engine(gen, policy, cost, pool, host, model=model_key,
                    max_queued=config.max_queued, decode_workers=args.decode_workers,
                    decode=decode_mode(args, name, gen), decode_tile=decode_tile(args, gen))
    engine.start()
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(trace), desc=f"{name:>5}", unit="req", position=line)
    if barrier is not None:
        barrier.wait()
    t0, origin = time.perf_counter(), engine.clock()  # replay's clock starts at ``origin``
    timings: list = []
    records, services = replay(engine, trace, progress=bar, timings=timings)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    engine.drain(60)
    for request, timing in timings:
        observe_timing(check, request, timing, as_measured)
    return {"records": records, "services": services, "stats": engine.stats(), "wall": wall,
            "vs_profile": check.summary(),
            "leaked": pool.num_used_pages + host.num_used_pages,
            "page_bytes": pool.page_bytes, "num_pages": pool.num_pages,
            "decisions": None if decisions is None else
            [dict(d.as_row(), now=d.now - origin) for d in decisions.log]}


def _child(args, name, barrier, done, out_queue, in_queue, core, line) -> None:
    """One policy in its own process (parallel mode), on CPU ``core`` when given; its
    progress bar on terminal ``line`` (also its index among the processes). With
    ``--profile measure`` it first measures the profile here (pinned, one thread, the other
    replay process measuring beside it on the other core: the conditions its replay runs
    under), times its decode tile again while the others run steps (``done``: one Event
    per process; :mod:`ditmem.tools.decode_beside`) and sends the profile up; then it gets
    the trace and the profile to schedule with from ``in_queue``."""
    import os

    from ditmem import models
    from ditmem.engine.factory import EngineConfig, make_pools, scheduler_model

    if core is not None:
        os.sched_setaffinity(0, {core})
    set_torch_threads(args.threads)
    gen = models.load(args.model, dtype=args.dtype)
    if args.profile == "measure":
        from ditmem.tools.demo import measure_demo_profile, retime_decodes

        profile = measure_demo_profile(gen, args)
        out_queue.put(("profile", name, retime_decodes(profile, gen, args, line, barrier,
                                                        done)))
    trace, args.profile = in_queue.get()
    pool, _ = make_pools(EngineConfig(pool_mb=args.pool_mb, page_kb=args.page_kb), "cpu")
    warm_up(gen, trace, pool)
    out_queue.put(("outcome", name, run_policy(gen, name, trace, args,
                                               scheduler_model(args.model, gen), barrier,
                                               line)))


def run_parallel(names, args, build_trace):
    """Each policy in its own process, all replays started together: on a shared machine
    both see the same background load at the same time. With at least one core per policy
    (and ``--threads`` 1), each process is pinned to its own core. With ``--profile
    measure`` every process measures the profile first, all at once, then times its decode
    tile while the others run steps (``ditmem.tools.decode_beside``), and the profile the
    replays schedule with is their average (:func:`~ditmem.tools.profile.average_profiles`,
    saved to ``--profile-out``; ``args.profile`` becomes its path). ``build_trace()`` (after
    that) gives the trace. Returns ``(trace, {policy: outcome})``."""
    import multiprocessing as mp
    import os

    from ditmem.tools.profile import average_profiles

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = len(cores) >= len(names) and args.threads == 1
    ctx = mp.get_context("spawn")
    barrier, out_queue = ctx.Barrier(len(names)), ctx.Queue()
    done = [ctx.Event() for _ in names]
    in_queues = [ctx.Queue() for _ in names]
    procs = [ctx.Process(target=_child, args=(args, n, barrier, done, out_queue, in_queues[i],
                                              cores[i] if pin else None, i))
             for i, n in enumerate(names)]
    for p in procs:
        p.start()
    if args.profile == "measure":
        print(f"measuring the device profile in the {len(names)} replay processes "
              f"({'pinned one per core, ' if pin else ''}all at once) ...", flush=True)
        measured = dict(_collect(out_queue, procs, len(names)))
        from ditmem.tools.demo import save_profile

        args.profile = save_profile(average_profiles([measured[n] for n in names]), args)
    trace = build_trace()
    for q in in_queues:
        q.put((trace, args.profile))
    outcomes = dict(_collect(out_queue, procs, len(names)))
    for p in procs:
        p.join()
    print("\n" * len(names), end="", flush=True)  # below the progress bars
    return trace, outcomes


def _collect(out_queue, procs, n: int) -> list[tuple]:
    """``n`` ``(name, value)`` messages from the replay processes; RuntimeError naming the
    process when one of them dies before sending its message (no hang)."""
    import queue

    got = []
    while len(got) < n:
        try:
            got.append(out_queue.get(timeout=2.0)[1:])
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                raise RuntimeError("ditmem demo: replay process "
                                   + ", ".join(f"{p.name} (exit code {p.exitcode})"
                                               for p in dead)
                                   + " died; see its error above") from None
    return got
