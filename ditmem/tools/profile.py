"""``ditmem profile``: measure a device profile for the cost model on this machine.

Writes the scheduler's version-1 profile JSON (``ditmem/scheduler/profiles.py``) with a
measured step table: median seconds of one packed step for each (tokens, batch) point, the
encode time, a decode rate, state bytes from the generator's own page accounting, and the
host-link copy rate. Every number's ``source`` says how it was measured.

The profile format has no fixed decode cost, only a per-megapixel rate; the tiny VAE has a
large fixed part, so the fixed part is folded into ``encode_s`` (both happen once per
request) and the slope into ``decode_s_per_megapixel`` — standalone times stay exact.

A decode is timed right after its request's last step, as a run meets it. Encodes are
timed back to back by default; ``encode_order="after-step"`` times each right after an
untimed step of another request instead (a request is admitted between the steps of the
others). The runs' encodes read x1.4-2.3 slow against the back-to-back profile on the quiet
machine; on the shared VM one block-by-block comparison put them x1.4-2.5 slower after a
step, sample-interleaved ones x0.76-1.28 (benchmarks/profile/encode_order.py; no page
faults either way): not shown to be better, so it is an option (``ditmem demo
--profile-encodes``), not the default.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ditmem.engine.threads import add_threads_argument, set_torch_threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen-image")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--name", default="cpu-tiny")
    p.add_argument("--sides", default="64,128,256",
                   help="square image sides to time (pixels, multiples of 16)")
    p.add_argument("--batches", default="1,2,4", help="batch sizes to time")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per point (median)")
    p.add_argument("--pool-mb", type=float, default=64.0,
                   help="engine pool the profile describes (device_bytes = weights + "
                        "workspace + pool)")
    p.add_argument("--page-kb", type=int, default=64)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="model dtype (default: bfloat16 on cuda/npu, float32 on cpu)")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=1, help="frames per request (video models)")
    add_decode_tile_argument(p, "tiled decode geometry in pixels to time (models with a "
                                "tiled decode; 'none' to skip): writes decode_tile_px/"
                                "stride_px/tile_s")
    add_threads_argument(p)
    from ditmem.tools.profile_devices import add_device_arguments

    add_device_arguments(p)


def median_time(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn()`` (:func:`timed`)."""
    return statistics.median(timed(fn) for _ in range(repeats))


#: two passes of one measurement whose medians differ by more than this (relative to the
#: smaller) are not trusted: it is measured again (:func:`stable_median`)
AGREEMENT = 0.10
#: passes :func:`stable_median` makes at most before it gives up on agreement
MAX_PASSES = 4


@dataclass(slots=True)
class Stable:
    """One :func:`stable_median` result: ``seconds`` (median of the two passes that
    agreed, or of every pass when none did), ``passes`` (medians of every pass, in order),
    ``agreed`` (two consecutive passes within ``AGREEMENT``)."""

    seconds: float
    passes: list[float]
    agreed: bool


def stable_median(sample, repeats: int, *, warmup: int = 1, agreement: float = AGREEMENT,
                  max_passes: int = MAX_PASSES, what: str = "",
                  log=logging.getLogger("ditmem.profile").info) -> Stable:
    """A robust measurement of one operation. ``sample()`` runs it once and returns its
    seconds (the caller times only the part that counts, e.g. a decode after its untimed
    steps). The first ``warmup`` samples are discarded (first-call costs: allocator,
    oneDNN primitive caches, lazy imports); then passes of ``repeats`` samples each until
    the medians of the last two passes differ by at most ``agreement`` (relative to the
    smaller), at most ``max_passes`` passes; the result is the median of those two passes'
    samples. One line is logged (naming ``what``) when it took more than two passes, and
    without agreement the result is the median of every pass's samples, logged as
    unstable. :func:`stable_medians` with one operation."""
    return stable_medians(lambda: (sample(),), repeats, warmup=warmup, agreement=agreement,
                          max_passes=max_passes, whats=(what,), log=log)[0]


def stable_medians(sample, repeats: int, *, warmup: int = 1, agreement: float = AGREEMENT,
                   max_passes: int = MAX_PASSES, whats=(),
                   log=logging.getLogger("ditmem.profile").info) -> list[Stable]:
    """:func:`stable_median` of several operations measured interleaved: ``sample()`` runs
    each once, in turn, and returns their seconds (a sequence, one per operation; ``whats``
    names them). The passes are shared and end when every operation's last two agree, so a
    slow spell (another process's work on the shared memory bus, a frequency change) slows
    all of them alike and their ratios hold — a batch's packing gain is the ratio of two
    such measurements (a 1024² pair measured after its batch 1 in a slow spell read 15 %
    faster than two alone, docs/results/profile.md). One :class:`Stable` per operation."""
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    if max_passes < 2:
        raise ValueError(f"max_passes: must be >= 2, got {max_passes}")
    for _ in range(warmup):
        sample()
    passes: list[list[tuple[float, ...]]] = []
    while len(passes) < max_passes:
        passes.append([tuple(float(x) for x in sample()) for _ in range(repeats)])
        if len(passes) < 2:
            continue
        medians = _pass_medians(passes)
        if all(abs(m[-2] - m[-1]) <= agreement * min(m[-2], m[-1]) * (1 + 1e-9)
               for m in medians):
            out = []
            for k, m in enumerate(medians):
                if len(passes) > 2:
                    log(f"profile: {_name(whats, k)}: passes disagreed by > "
                        f"{100 * agreement:.0f} %, measured again until two agreed (pass "
                        f"medians {', '.join(f'{1e3 * x:.1f}' for x in m)} ms)")
                kept = [row[k] for row in passes[-2] + passes[-1]]
                out.append(Stable(statistics.median(kept), m, True))
            return out
    out = []
    for k, m in enumerate(_pass_medians(passes)):
        log(f"profile: {_name(whats, k)} stayed unstable over {len(passes)} passes "
            f"(medians {', '.join(f'{1e3 * x:.1f}' for x in m)} ms, none two within "
            f"{100 * agreement:.0f} %): keeping the median of all")
        out.append(Stable(statistics.median([row[k] for q in passes for row in q]), m, False))
    return out


def _pass_medians(passes) -> list[list[float]]:
    """Per operation, the median of each pass."""
    return [[statistics.median(row[k] for row in q) for q in passes]
            for k in range(len(passes[0][0]))]


def _name(whats, k: int) -> str:
    return whats[k] if k < len(whats) and whats[k] else "a measurement"


def checked_median(checks: list[dict], sample, repeats: int, what: str, log) -> float:
    """:func:`stable_median` of ``sample`` (its lines to ``log``), its passes appended to
    ``checks`` as the dict :func:`stability_note` reads; returns its seconds."""
    return checked_medians(checks, lambda: (sample(),), repeats, (what,), log)[0]


def checked_medians(checks: list[dict], sample, repeats: int, whats, log) -> list[float]:
    """:func:`stable_medians` of ``sample`` (its lines to ``log``), each operation's passes
    appended to ``checks`` as the dict :func:`stability_note` reads; returns their
    seconds."""
    out = stable_medians(sample, repeats, whats=whats, log=log)
    for what, r in zip(whats, out, strict=True):
        checks.append({"what": what, "seconds": r.seconds, "passes": r.passes,
                       "agreed": r.agreed})
    return [r.seconds for r in out]


def checked_batches(checks: list[dict], step, batches, repeats: int, whats, log,
                    device=None) -> list[float]:
    """Seconds of one step per batch size in ``batches`` (``step(b)`` runs a step of ``b``
    requests; ``whats`` names each), measured together: each sample runs every batch size
    once, in turn (:func:`checked_medians`), so a slow spell slows them alike and their
    ratio — the packing gain — holds."""
    return checked_medians(
        checks, lambda: tuple(timed(lambda b=b: step(b), device) for b in batches),
        repeats, whats, log)


def timed(fn, device=None) -> float:
    """Seconds of one ``fn()`` call (a ``stable_median`` sample): the wall clock on the CPU
    (``device`` None or a CPU device); on CUDA/NPU, device events around the work on the
    current stream, since the work is asynchronous and the wall clock would time its launch."""
    if device is None:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    from ditmem.engine.timing import StageTimer

    return StageTimer(device, time.perf_counter).time(fn)[1]


def _fit_line(xs, ys):
    """Least squares y = a + b x with a, b >= 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx) if sxx else 0
    return max(0.0, my - b * mx), b


def _state_bytes(gen, request) -> int:
    """Bytes of state the generator keeps for ``request`` (its own accounting)."""
    if callable(getattr(gen, "state_bytes", None)):
        return int(gen.state_bytes(request))
    return 4 * gen.estimate_pages(request, 4)  # 4-byte pages: pages x 4 = bytes (fp32)


ENCODE_ORDERS = ("back-to-back", "after-step")


def profile_request(side: int, i: int, steps: int, frames: int = 1):
    """The ``i``-th request a measurement runs: ``side``² (× ``frames``), ``steps`` steps,
    prompt and seed from ``i``."""
    from ditmem.models.common.request import GenerationRequest
    from ditmem.tools.replay import PROMPTS

    return GenerationRequest(prompt=PROMPTS[i % len(PROMPTS)], width=side, height=side,
                             num_inference_steps=steps, num_frames=frames, seed=i,
                             request_id=f"p{side}-{i}")


def measure(gen, sides, batches, repeats, pool, log=print, *, key="qwen-image",
            frames: int = 1, decode_up_to: int | None = None,
            encode_order: str = "back-to-back") -> dict:
    """Raw measurements: step points, encode, decode per side, state bytes per side.
    ``key`` is the scheduler's model key (token geometry); ``frames`` > 1 for video;
    ``decode_up_to``: time decodes only of sides up to this (larger ones decode as tiles).
    Every number is a :func:`stable_median` (first call discarded, two passes of
    ``repeats`` samples that agree within ``AGREEMENT``, measured again where they do not);
    a side's batch sizes are measured together, interleaved (:func:`stable_medians`), so
    their ratios hold through a slow spell; ``checks`` lists each one's passes.
    ``encode_order="after-step"``: each encode sample right after an untimed step of another
    request (of the middle side), as a run meets it; "back-to-back" (default): after the
    previous sample."""
    if encode_order not in ENCODE_ORDERS:
        raise ValueError(f"encode_order: one of {ENCODE_ORDERS}, got {encode_order!r}")
    from ditmem.scheduler.models import tokens_for
    from ditmem.tools.decode_beside import decode_sample

    def request(side, i, steps):
        return profile_request(side, i, steps, frames)

    counter = iter(range(10**9))
    checks: list[dict] = []

    def stable(sample, n, what):
        return checked_median(checks, sample, n, what, _warn)

    device = getattr(gen, "device", None)  # the generator's torch device: how to time it

    between: list = []  # after-step: another request, stepped before each timed encode

    def encode_once(side):
        if encode_order == "after-step":
            if not between:
                between.append(gen.encode(request(sides[len(sides) // 2], next(counter),
                                                  1000), pool))
            gen.step([between[0]])
        r = request(side, next(counter), 1000)
        out = []
        dt = timed(lambda: out.append(gen.encode(r, pool)), device)
        gen.release(out[0])
        return dt

    steps, encodes, decodes, state_bytes = [], [], {}, {}
    for side in sides:
        reqs = [request(side, i, 1000) for i in range(max(batches))]
        state_bytes[side] = statistics.mean(_state_bytes(gen, r) for r in reqs)
        encodes.append(stable(lambda side=side: encode_once(side), max(2, repeats),
                              f"encode {side}x{side}"))
        states = [gen.encode(r, pool) for r in reqs]
        every = checked_batches(checks, lambda b, states=states: gen.step(states[:b]),
                                batches, repeats,
                                [f"step {side}x{side} batch {b}" for b in batches], _warn,
                                device)
        for b, secs in zip(batches, every, strict=True):
            steps.append({"tokens": tokens_for(key, side, side, frames), "batch": b,
                          "seconds": secs})
            log(f"  step {side}x{side} batch {b}: {1000 * secs:.1f} ms")
        for s in states:
            gen.release(s)
        if decode_up_to is not None and side > decode_up_to:
            continue
        decodes[side] = stable(decode_sample(gen, pool, side, frames=frames, counter=counter),
                               max(2, repeats - 1),
                               f"decode {side}x{side}")
        log(f"  decode {side}x{side}: {1000 * decodes[side]:.1f} ms")
    for s in between:
        gen.release(s)
    return {"steps": steps, "encode_s": statistics.median(encodes),
            "decode_s": decodes, "state_bytes": state_bytes, "key": key, "frames": frames,
            "checks": checks}


def _warn(msg: str) -> None:
    logging.getLogger("ditmem.profile").warning(msg)


def stability_note(checks: list[dict]) -> str:
    """One phrase on how a measurement's :func:`stable_median` checks went."""
    again = sum(len(c["passes"]) > 2 for c in checks)
    unstable = [c["what"] for c in checks if not c["agreed"]]
    note = (f"median of two passes agreeing within {100 * AGREEMENT:.0f} % "
            f"({again} of {len(checks)} measured again")
    return note + (f"; unstable: {', '.join(unstable)})" if unstable else ")")


def host_link_rate(pool_bytes: int = 64 * 2**20) -> float:
    """Bytes/s of a page-arena copy (what offload does on a CPU 'device')."""
    import torch

    src = torch.empty(pool_bytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    return pool_bytes / median_time(lambda: dst.copy_(src), 5)


def build_profile(m: dict, *, model: str, name: str, pool_mb: float, max_batch: int,
                  weights_bytes: int, link: float, tool: str = "ditmem profile",
                  page_kb: int = 64) -> dict:
    """The version-1 profile dict for the measured model's scheduler key."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    src = f"measured by `{tool} --model {model}` on this machine, {when}"
    n = lambda v, how="": {"value": v, "source": src + (f"; {how}" if how else "")}
    sides = sorted(m["decode_s"])
    tiling = m.get("decode_tile")
    if tiling is not None:  # larger images decode as tiles: fit the ones that fit a tile
        sides = [s for s in sides if s <= tiling[0]]
    mpix = [s * s * m["frames"] / 1e6 for s in sides]
    if len(sides) == 1:  # one point: a rate through the origin
        fixed, per_mp = 0.0, m["decode_s"][sides[0]] / mpix[0]
    else:
        fixed, per_mp = _fit_line(mpix, [m["decode_s"][s] for s in sides])
    from ditmem.scheduler.models import tokens_for

    state_sides = sorted(m["state_bytes"])
    tokens = [tokens_for(m["key"], s, s, m["frames"]) for s in state_sides]
    per_req, per_tok = _fit_line(tokens, [m["state_bytes"][s] for s in state_sides])
    workspace = 64 * 2**20
    pool = int(pool_mb * 2**20)
    profile = {
        "format": 1, "name": name,
        "description": f"{model} measured on this machine by `{tool}` ({when}).",
        "device_bytes": n(weights_bytes + workspace + pool, "weights + workspace + --pool-mb"),
        "host_bytes": n(4 * pool, "engine default host pool: 4x the device pool"),
        "host_link_bytes_per_s": n(link, "median of 5 copies of a 64 MiB arena"),
        "page_bytes": n(page_kb * 1024, "the engine's page size (--page-kb)"),
        "models": {m["key"]: {
            "weights_bytes": n(weights_bytes, "sum of parameter bytes of all components"),
            "workspace_bytes": n(workspace, "reserve for step activations (not measured)"),
            "state_bytes_per_token": n(per_tok, "fit of the generator's page accounting"),
            "state_bytes_per_request": n(per_req, "fit of the generator's page accounting"),
            "encode_s": n(m["encode_s"] + fixed,
                          f"median encode {m['encode_s']:.4f} s + fixed part of decode "
                          f"{fixed:.4f} s (line fit of decode vs megapixels)"),
            "decode_s_per_megapixel": n(per_mp, "slope of decode time vs megapixels"),
            "max_batch": n(max_batch, "engine packed-step limit"),
            "step": {"kind": "table", "points": n(
                m["steps"], stability_note(m["checks"]) if "checks" in m
                else "median of --repeats steps")},
        }},
    }
    if tiling is not None:
        tile, stride, tile_s = tiling
        section = profile["models"][m["key"]]
        section["decode_tile_px"] = n(tile, "tiled decode (Engine decode='tiled')")
        section["decode_stride_px"] = n(stride, "tiled decode stride")
        section["decode_tile_s"] = n(tile_s, f"median decode of one {tile}x{tile} tile")
    return profile


def measure_profile(gen, model: str, sides, batches, repeats: int, *, name: str = "cpu-tiny",
                    pool_mb: float = 64.0, max_batch: int = 4, page_kb: int = 64,
                    tool: str = "ditmem profile", log=print, frames: int = 1,
                    decode_tile: tuple[int, int] | None = (256, 224),
                    encode_order: str = "back-to-back") -> dict:
    """Measure ``gen`` and return the profile dict (see :func:`build_profile`);
    ``decode_tile`` (tile, stride) px: also time one decode tile when ``gen`` can tile;
    ``encode_order``: see :func:`measure`."""
    from ditmem.memory import PagePool

    pool = PagePool(max(16, int(256 * 2**20) // (page_kb * 1024)), page_kb * 1024)
    from ditmem.engine.factory import scheduler_model
    from ditmem.models.common.tiled_decode import supports_tiled_decode

    tiles = decode_tile is not None and supports_tiled_decode(gen)
    m = measure(gen, sides, batches, repeats, pool, log=log, key=scheduler_model(model, gen),
                frames=frames, decode_up_to=decode_tile[0] if tiles else None,
                encode_order=encode_order)
    if tiles:
        tile, stride = decode_tile
        if tile not in m["decode_s"]:
            extra = measure(gen, [tile], [1], repeats, pool, log=log, key=m["key"],
                            frames=frames)
            m["decode_s"][tile] = extra["decode_s"][tile]
            m["checks"] += extra["checks"]
        m["decode_tile"] = (tile, stride, m["decode_s"][tile])
    weights = sum(p.numel() * p.element_size() for c in gen.pipe.components.values()
                  if hasattr(c, "parameters") for p in c.parameters())
    return build_profile(m, model=model, name=name, pool_mb=pool_mb, max_batch=max_batch,
                         weights_bytes=weights, link=host_link_rate(), tool=tool,
                         page_kb=page_kb)


#: ``--profile`` values that resolve at start-up (``startup_profile``), not to a file or name.
STARTUP_CHOICES = ("auto", "measure")
#: What a start-up measurement times: square sides (the HTTP bench's 128²/256²/512² mix;
#: video models: smaller, their requests carry frames), batch sizes and repeats per point.
STARTUP_SIDES = (128, 256, 512)
STARTUP_VIDEO_SIDES = (64, 128)
STARTUP_BATCHES = (1, 2, 4)
STARTUP_REPEATS = 3


def profile_cache_path(model: str, device: str) -> Path:
    """Where the start-up profile of ``model`` on ``device`` of this host is kept
    (``$DITMEM_CACHE`` or ``~/.cache/ditmem``, then ``profiles/<model>-<device>-<host>.json``)."""
    root = Path(os.environ.get("DITMEM_CACHE") or Path.home() / ".cache" / "ditmem")
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{device}-{platform.node()}")
    return root / "profiles" / f"{key}.json"


def _kept_problem(path, key: str) -> str | None:
    """Why the kept measurement at ``path`` cannot schedule model ``key`` (None: it can)."""
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.profiles import ProfileError

    try:
        CostModel.load(path).max_batch(key)
    except (ProfileError, ValueError, OSError) as exc:
        return str(exc)
    return None


def will_measure(model: str, device: str, choice: str, key: str) -> bool:
    """Whether ``startup_profile(..., choice)`` measures now (and so needs the model's
    weights): for "measure", and for "auto" without a usable kept measurement of ``key``
    (the scheduler's model name)."""
    if choice not in STARTUP_CHOICES:
        return False
    path = profile_cache_path(model, device)
    return choice == "measure" or not path.is_file() or _kept_problem(path, key) is not None


def startup_profile(gen, model: str, device: str, choice: str, *, frames: int = 1,
                    page_kb: int = 64, log=None) -> str:
    """The profile an engine schedules with, as a name or JSON path: ``choice`` "auto" — the
    measurement kept for this model, device and host (``profile_cache_path``), made now and
    kept when there is none or it no longer loads; "measure" — measured now (the kept one
    replaced); anything else — a profile name or JSON path, returned as is."""
    if choice not in STARTUP_CHOICES:
        return choice
    from ditmem.engine.factory import scheduler_model

    log = log or logging.getLogger("ditmem.profile").warning
    key = scheduler_model(model, gen)
    sides = STARTUP_VIDEO_SIDES if frames > 1 else STARTUP_SIDES
    batches, repeats = STARTUP_BATCHES, STARTUP_REPEATS
    path = profile_cache_path(model, device)
    if choice == "auto" and path.is_file():
        problem = _kept_problem(path, key)
        if problem is None:
            log(f"profile: {path} (measured earlier on this machine; --profile measure "
                "to measure again)")
            return str(path)
        log(f"profile: {path} is unusable ({problem}); measuring again")
    log(f"profile: measuring {model} on {device} (sides {list(sides)}, batches "
        f"{list(batches)}) ...")
    t0 = time.perf_counter()
    profile = measure_profile(gen, model, list(sides), list(batches), repeats,
                              name=f"{model} on {device} ({platform.node()})",
                              page_kb=page_kb, tool="ditmem serve", log=lambda *_: None,
                              frames=frames)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(profile, indent=2))
    tmp.replace(path)
    log(f"profile: measured in {time.perf_counter() - t0:.0f} s, kept in {path}")
    return str(path)


def parse_tile(text: str) -> tuple[int, int] | None:
    """``"256,224"`` -> (256, 224); ``"none"`` -> None. ValueError names the flag."""
    if text.strip().lower() == "none":
        return None
    try:
        tile, stride = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--decode-tile: expected TILE,STRIDE pixels, got {text!r}") from None
    if tile % 16 or stride % 16 or not 0 < stride <= tile:
        raise ValueError(f"--decode-tile: TILE and STRIDE must be multiples of 16 with "
                         f"0 < STRIDE <= TILE, got {text!r}")
    return tile, stride


def add_decode_tile_argument(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--decode-tile TILE,STRIDE`` (default 256,224; 'none'), parsed by
    :func:`parse_tile` when the command line is read: a bad value is a usage error."""

    def tile(text: str) -> tuple[int, int] | None:
        try:
            return parse_tile(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--decode-tile: ")) from None

    p.add_argument("--decode-tile", type=tile, default="256,224", metavar="TILE,STRIDE",
                   help=help_text)


def main(args) -> int:
    from ditmem import models
    from ditmem.tools.profile_devices import check_device_arguments, measure_parallel

    problem = check_device_arguments(args)
    if problem:
        print(f"ditmem profile: error: {problem}")
        return 2
    set_torch_threads(args.threads)
    gen = models.load(args.model, dtype=args.dtype)
    sides = [int(s) for s in args.sides.split(",")]
    batches = sorted({int(b) for b in args.batches.split(",")})
    print(f"profiling {args.model}: sides {sides}, batches {batches}")
    profile = measure_profile(gen, args.model, sides, batches, args.repeats, name=args.name,
                              pool_mb=args.pool_mb, max_batch=args.max_batch,
                              page_kb=args.page_kb, frames=args.frames,
                              decode_tile=args.decode_tile)
    if args.devices > 1:
        from ditmem.parallel.speedup import CalibrationError

        try:
            profile["parallel"], profile["links"] = measure_parallel(
                args, next(iter(profile["models"])), profile["host_link_bytes_per_s"]["value"])
        except CalibrationError as exc:
            print(f"ditmem profile --devices: error: {exc}; nothing written")
            return 1
    from ditmem.scheduler.profiles import parse_profile

    parse_profile(profile, args.out)  # refuse to write what the loader would reject
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=2)
    print(f"wrote {args.out}")
    return 0


#: the measured times :func:`average_profiles` averages (per model section)
_AVERAGED = ("encode_s", "decode_s_per_megapixel", "decode_tile_s")


def average_profiles(profiles: list[dict]) -> dict:
    """One profile from measurements of the same table made at the same time by several
    processes (one per core, as the runs that use it): each model's step points,
    ``encode_s``, ``decode_s_per_megapixel`` and ``decode_tile_s`` averaged, the rest
    from the first; each averaged number's source says how many measurements it is."""
    import copy

    if not profiles:
        raise ValueError("profiles: expected at least one")
    out = copy.deepcopy(profiles[0])
    n = len(profiles)
    if n == 1:
        return out
    note = f"; mean of {n} measurements made at once, one per replay process"
    for key, section in out["models"].items():
        others = [p["models"][key] for p in profiles]
        for field in _AVERAGED:
            if field in section:
                section[field]["value"] = statistics.mean(o[field]["value"] for o in others)
                section[field]["source"] += note
        points = section["step"]["points"]
        by_point = [{(q["tokens"], q["batch"]): q["seconds"] for q in o["step"]["points"]["value"]}
                    for o in others]
        for q in points["value"]:
            q["seconds"] = statistics.mean(b[(q["tokens"], q["batch"])] for b in by_point)
        points["source"] += note
    out["description"] += f" Mean of {n} simultaneous measurements."
    return out
