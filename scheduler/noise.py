"""Timing noise: the simulator's truth drawn around the profile's prediction.

A policy plans with its cost model; the simulated device takes ``TimingNoise.draw(predicted,
kind, key)`` seconds instead, so the policy meets timing error as on a real machine and
learns only through its online correction. The draw is lognormal around a systematic bias:

    true = predicted * factor * exp(sigma * z - sigma**2 / 2),   z ~ N(0, 1)

so ``E[true] = predicted * factor`` and the spread is ``sigma`` (3 % by default, the jitter
measured between repeats of one step on this project's machines). ``sigma = 0, bias = 0`` is the
old noiseless simulation (the truth is the policy's own model).

**Drift by kind and class.** Real devices drift apart by kind of work and by shape (session
10's two-device run: moves ×2.42 the profile, encodes ×1.29, degree-2 steps ×0.90), so the
factor is

    factor = (1 + b_kind) * prod(1 + b_kind:class  for each of the draw's classes listed)

where ``b_kind = bias_by[kind]`` when ``kind`` is listed, else the plain ``bias``; a listed
class's bias is *on top of* its kind's (``{"step:d2": -0.1}`` alone: degree-2 steps ×0.90;
with ``bias=0.1`` too: ×0.99). Unlisted kinds and classes get the plain bias only, so a noise
with an empty ``bias_by`` draws exactly what it drew before ``bias_by`` existed.

Keys (``bias_by``): ``KIND`` or ``KIND:CLASS``, ``KIND`` one of :data:`KINDS`:

* ``step``: a denoising step (or a chunk of one), classes: its shape (``shape_class`` of its
  largest member: ``"1024x1024"``, a video ``"1280x720x81"``) and, on a node, its degree
  (``"d2"``);
* ``encode``, ``decode``: a request's prompt encode and VAE decode, class: its shape;
* ``move``: a copy of paused state, class on a node: the move's kind (``"offload"``,
  ``"restore"``, ``"peer"``, ``"host"``); one device's host-link copies have no class;
* ``launch``: a node job's fixed cost besides its stages (``links.job_latency_s``), no class.

**Measured spread (``residuals``).** The lognormal's tails are thin; a real machine's are
not (a step that waits for the OS, a slow period). ``residuals`` maps ``KIND``,
``KIND:CLASS`` or ``KIND:CLASS:CLASS`` (a step's shape and degree: ``"step:1024x1024:d2"``)
to log ratios measured on a machine (``log(measured / predicted)`` of single jobs, e.g.
``demo --devices``' ``job_timings``, fitted by ``fit_residuals``). A draw whose kind and
classes have a pool (the longest key first: both classes, then each class alone, then the
kind) takes its values in the order measured instead of ``sigma * z`` — from a seeded
random start, wrapping around — so a slow period's run of slow steps stays a run (the
measured lag-1 autocorrelation of a step's log ratio is 0.3–0.6 on this project's CPU).
Each pool is re-centred on itself (the mean of ``exp`` over it is 1), so that ``E[true] =
predicted * factor`` still holds: a pool carries the measured spread, tail and runs, and
the mean error stays the bias (``bias``, ``bias_by``). Kinds without a pool keep the
lognormal, from the same seeded stream (a pool's start is drawn from it, so the
lognormal draws of a run with pools are not those of the same seed without).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Lognormal spread of a simulated duration around its prediction when none is given.
DEFAULT_SIGMA = 0.03
#: The kinds of work a draw names (``TimingNoise.draw``'s ``kind``; ``bias_by``'s keys).
KINDS = ("step", "encode", "decode", "move", "launch")
_SHAPE = re.compile(r"\d+x\d+(x\d+)?")  # shape_class's "WxH" / "WxHxF"
_DEGREE = re.compile(r"d\d+")  # a node step's degree


def shape_class(request) -> str:
    """A request's shape class: ``"WxH"`` (one frame) or ``"WxHxF"`` (pixels, frames)."""
    w, h, f = request.width, request.height, request.frames
    return f"{w}x{h}" if f == 1 else f"{w}x{h}x{f}"


def step_class(requests: Iterable) -> str:
    """A packed step's shape class: its largest member's (most pixels × frames; the first
    of equals), as the cost model names a mixed decode by its largest."""
    return shape_class(max(requests, key=lambda r: r.width * r.height * r.frames))


@dataclass(slots=True)
class TimingNoise:
    """Seeded lognormal jitter with a systematic bias (see the module docstring).

    ``sigma``: standard deviation of ``log(true / predicted)``, >= 0; ``bias``: the mean
    relative error of every kind not in ``bias_by``, > -1 (0.1 = the machine is 10 % slower
    than the profile says); ``seed``: the draws repeat exactly for the same seed and call
    order; ``bias_by``: mean relative errors by ``KIND`` or ``KIND:CLASS`` (module
    docstring), each > -1.
    """

    sigma: float = DEFAULT_SIGMA
    bias: float = 0.0
    seed: int = 0
    bias_by: Mapping[str, float] = field(default_factory=dict)
    residuals: Mapping[str, Sequence[float]] = field(default_factory=dict)
    _rng: random.Random = field(init=False, repr=False)
    _pools: dict[str, tuple[float, ...]] = field(init=False, repr=False)
    _next: dict[str, int] = field(init=False, repr=False)
    _kind: dict[str, float] = field(init=False, repr=False)
    _class: dict[tuple[str, str], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma: a finite number >= 0, got {self.sigma!r}")
        if not (self.bias > -1 and math.isfinite(self.bias)):
            raise ValueError(f"bias: a finite number > -1, got {self.bias!r}")
        self.bias_by = dict(self.bias_by)
        self._kind, self._class = {}, {}
        for key, value in self.bias_by.items():
            kind, sep, cls = str(key).partition(":")
            if kind not in KINDS or (sep and not cls):
                raise ValueError(
                    f"bias_by key {key!r}: expected KIND or KIND:CLASS, KIND one of "
                    f"{', '.join(KINDS)}"
                )
            if sep and not _known_class(kind, cls):
                raise ValueError(
                    f"bias_by key {key!r}: class {cls!r} is no class a {kind} draw names "
                    "(a shape WxH or WxHxF; a step's degree dN; a move's kind)"
                )
            if not (isinstance(value, (int, float)) and value > -1 and math.isfinite(value)):
                raise ValueError(f"bias_by[{key!r}]: a finite number > -1, got {value!r}")
            if sep:
                self._class[(kind, cls)] = 1.0 + value
            else:
                self._kind[kind] = 1.0 + value
        self._pools, self._next = {}, {}
        for key, values in dict(self.residuals).items():
            parts = str(key).split(":")
            if parts[0] not in KINDS or len(parts) > 3 or not all(parts):
                raise ValueError(
                    f"residuals key {key!r}: expected KIND, KIND:CLASS or KIND:CLASS:CLASS, "
                    f"KIND one of {', '.join(KINDS)}"
                )
            logs = [float(v) for v in values]
            if not logs or not all(math.isfinite(v) for v in logs):
                raise ValueError(f"residuals[{key!r}]: a non-empty list of finite log ratios")
            shift = math.log(math.fsum(math.exp(v) for v in logs) / len(logs))
            self._pools[str(key)] = tuple(v - shift for v in logs)
        self.residuals = dict(self.residuals)
        self._rng = random.Random(self.seed)

    @property
    def exact(self) -> bool:
        """True when every draw returns its prediction unchanged."""
        return (self.sigma == 0 and self.bias == 0 and not any(self.bias_by.values())
                and not self._pools)

    def _pool(self, kind: str | None, key: str | Iterable[str]) -> str | None:
        """The name of the pool of measured log ratios a draw of ``kind`` with classes
        ``key`` takes from (module docstring), or None."""
        if not self._pools or kind is None:
            return None
        classes = [key] if isinstance(key, str) else list(key)
        names = ([f"{kind}:{':'.join(classes)}"] if len(classes) > 1 else []) + [
            f"{kind}:{c}" for c in classes] + [kind]
        for name in names:
            if name in self._pools:
                return name
        return None

    def _measured(self, name: str) -> float:
        """The pool's next log ratio (module docstring: in order, from a seeded start)."""
        pool = self._pools[name]
        i = self._next.get(name)
        if i is None:
            i = self._rng.randrange(len(pool))
        self._next[name] = (i + 1) % len(pool)
        return pool[i]

    def factor(self, kind: str | None = None, key: str | Iterable[str] = ()) -> float:
        """The mean true / predicted ratio of a draw of ``kind`` with classes ``key`` (one
        class or several; module docstring). ``kind`` None: the plain ``1 + bias``."""
        factor = self._kind.get(kind, 1.0 + self.bias) if kind is not None else 1.0 + self.bias
        if self._class and kind is not None:
            for cls in (key,) if isinstance(key, str) else key:
                extra = self._class.get((kind, cls))
                if extra is not None:
                    factor *= extra
        return factor

    def draw(self, predicted: float, kind: str | None = None,
             key: str | Iterable[str] = ()) -> float:
        """One true duration (seconds) for a predicted one (seconds, >= 0) of ``kind`` (one
        of :data:`KINDS`; None: the plain bias) and its classes ``key``."""
        if self.exact or predicted <= 0:
            return predicted
        pool = self._pool(kind, key)
        if pool is not None:
            return predicted * self.factor(kind, key) * math.exp(self._measured(pool))
        z = self._rng.gauss(0.0, 1.0) if self.sigma else 0.0
        return predicted * self.factor(kind, key) * math.exp(self.sigma * z - self.sigma**2 / 2)


def _known_class(kind: str, cls: str) -> bool:
    """Whether a draw of ``kind`` can name class ``cls`` (module docstring's keys)."""
    if kind == "move":
        from .node.cost import MOVE_KINDS  # here: the node package imports this module

        return cls in MOVE_KINDS
    if kind == "launch":
        return False
    return bool(_SHAPE.fullmatch(cls) or (kind == "step" and _DEGREE.fullmatch(cls)))


def parse_bias(text: str) -> tuple[float, dict[str, float]]:
    """A ``--bias`` value as (plain bias, bias_by): ``"0.1"`` → (0.1, {}); ``"step:2048x2048=
    0.1,move=1.42"`` → (0.0, {...}); a bare number among the items (``"0.05,encode=0.29"``)
    is the plain bias. ValueError naming the bad item."""
    plain, by = 0.0, {}
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise ValueError(f"--bias: expected B or KIND[:CLASS]=B,..., got {text!r}")
    seen_plain = False
    for item in items:
        key, sep, value = item.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--bias item {item!r}: {value!r} is not a number") from None
        if not sep:
            if seen_plain:
                raise ValueError(f"--bias item {item!r}: a second plain bias")
            plain, seen_plain = number, True
            continue
        key = key.strip()
        if key in by:
            raise ValueError(f"--bias item {item!r}: {key!r} given twice")
        by[key] = number
    TimingNoise(0.0, plain, 0, by)  # validates every key and value (names the bad one)
    return plain, by


#: the stages of ``demo --devices``' ``job_timings`` → a draw's kind
_STAGE_KINDS = {"encodes": "encode", "decodes": "decode", "moves": "move"}


def fit_residuals(rows: Iterable[Sequence], *, min_samples: int = 20) -> dict[str, list[float]]:
    """``TimingNoise.residuals`` from measured jobs: ``rows`` of (stage, class, count,
    measured_s, predicted_s, ...) as ``demo --devices`` writes them (``job_timings``: the
    columns after these are ignored; stage
    ``"steps dN"``, ``"encodes"``, ``"decodes"`` or ``"moves"``). Only single pieces of work
    (count 1) and positive times are used, so a pool holds one step's, one encode's, one
    decode's or one move's log ratio. Pools: per kind, and per kind and class (a step's
    shape and degree: ``"step:1024x1024:d2"``), each where it has ``min_samples`` or more
    (a kind measured less keeps the lognormal: one value re-centred would be no noise).
    The mean error is left in the values; ``TimingNoise`` re-centres each pool (the bias is
    the caller's)."""
    if min_samples < 1:
        raise ValueError(f"min_samples: an integer >= 1, got {min_samples!r}")
    pools: dict[str, list[float]] = {}
    for stage, cls, count, measured, predicted, *_ in rows:
        if stage.startswith("steps d"):
            kind, cls = "step", f"{cls}:d{stage.removeprefix('steps d')}"
        elif stage in _STAGE_KINDS:
            kind = _STAGE_KINDS[stage]
        else:
            raise ValueError(f"rows: unknown stage {stage!r}")
        if count != 1 or not (measured > 0 and predicted > 0):
            continue
        value = math.log(measured / predicted)
        pools.setdefault(kind, []).append(value)
        if cls and "," not in cls:
            pools.setdefault(f"{kind}:{cls}", []).append(value)
    return {k: v for k, v in pools.items() if len(v) >= min_samples}
