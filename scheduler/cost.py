"""The cost model: predicted seconds and bytes for requests on one device profile."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .decode_lane import tile_sizes
from .models import geometry, tokens_for
from .noise import DEFAULT_SIGMA
from .plan import StepReport
from .profiles import load_profile, parse_profile
from .request import Request
from .steptime import make_step_model

#: Default page size for accounting (DESIGN.md: 64 MB slices).
DEFAULT_PAGE_BYTES = 64 * 2**20


#: The relative spread of step times assumed before any step is measured: the simulator's
#: default timing noise.
STEP_SPREAD_PRIOR = DEFAULT_SIGMA


class CostModel:
    """Step/encode/decode time, memory per request and host-link time from a device profile.

    Build with ``CostModel.load("h200")`` (a shipped profile) or ``CostModel.load(path)``.
    All times are seconds, all sizes bytes. ``observe`` folds measured times into
    correction factors (exponential moving averages of measured / predicted), so an engine
    running on a device that differs from its profile converges to its real speed:

    * steps: one factor per model, and one per *shape class* (model, total tokens of the
      batch in half-octaves) — a class not yet measured uses its model's factor;
    * encodes: one factor per model; decodes: one per (model, megapixels in half-octaves);
    * host-link transfers: one factor.

    Every prediction (step, encode, decode, transfer, standalone and remaining times)
    includes its factor; the bound's ``*_share`` lower bounds use the model's step factor.
    """

    def __init__(self, profile: dict, *, correction_alpha: float = 0.1):
        self.profile = profile
        self.name: str = profile["name"]
        self._models = profile["models"]
        self._steps = {m: make_step_model(sec["step"]) for m, sec in self._models.items()}
        self._correction = dict.fromkeys(self._models, 1.0)
        self._classes: dict[tuple, float] = {}
        self._spread: dict[tuple, float] = {}  # EMA of the squared relative step error
        self._alpha = correction_alpha
        self._cache: dict[tuple, float] = {}
        self._decode_cache: dict[tuple, list[float]] = {}

    @classmethod
    def load(cls, name_or_path: str | Path) -> CostModel:
        """A cost model for a shipped profile name or a profile JSON path."""
        return cls(load_profile(name_or_path))

    def fresh(self) -> CostModel:
        """A model of the same profile with no corrections yet (one per simulation, so a
        policy's learning never leaks into another run or into later traces' deadlines)."""
        return CostModel(self.profile, correction_alpha=self._alpha)

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        """A cost model for an in-memory (unparsed, version-1) profile dict."""
        return cls(parse_profile(data, data.get("name", "<dict>")))

    def _model(self, model: str) -> dict:
        section = self._models.get(model)
        if section is None:
            raise ValueError(
                f"profile {self.name!r} has no model {model!r}; it has {', '.join(self._models)}"
            )
        return section

    @property
    def page_bytes(self) -> int:
        """The engine's page size this profile describes (``DEFAULT_PAGE_BYTES`` if unsaid)."""
        return int(self.profile.get("page_bytes", DEFAULT_PAGE_BYTES))

    # ---- time -------------------------------------------------------------------------
    def tokens(self, request: Request) -> int:
        """Tokens per denoising forward of ``request`` (image/video tokens)."""
        return tokens_for(request.model, request.width, request.height, request.frames)

    def step_time(self, model: str, tokens: Sequence[int]) -> float:
        """Seconds for one denoising step of a packed batch whose members have ``tokens``."""
        return self.base_step_time(model, tokens) * self.step_correction(model, tokens)

    def base_step_time(self, model: str, tokens: Sequence[int]) -> float:
        """The profile's seconds for that step, without the online correction. What a
        packing gain is judged in: the corrections are learned per shape class of a step's
        total tokens, so a packed step and its members alone are scaled by different factors,
        and the ratio of those factors is the device's drift, not a gain."""
        self._model(model)
        key = (model, tuple(sorted(tokens)))
        base = self._cache.get(key)
        if base is None:
            base = self._steps[model].seconds(list(tokens)) if tokens else 0.0
            self._cache[key] = base
        return base

    def step_correction(self, model: str, tokens: Sequence[int]) -> float:
        """The measured/predicted factor applied to a step of ``tokens`` (its shape class's,
        else its model's)."""
        factor = self._classes.get(("step", model, _octave_bucket(sum(tokens))))
        return self._correction[model] if factor is None else factor

    def min_step_share(self, model: str, tokens: int) -> float:
        """A lower bound on one request's share of any packed step it is part of (s), from
        device physics alone: its FLOPs at full utilisation (FLOPs step models only)."""
        self._model(model)
        return self._steps[model].min_share(tokens) * self._correction[model]

    def profile_step_share(
        self, model: str, tokens: int, partner_min: int, partner_max: int
    ) -> float:
        """A lower bound on one request's share of any step this cost model charges (s), when
        its batch partners have ``partner_min``..``partner_max`` tokens (``max_batch`` caps
        the batch): the least this device's profile lets a request-step cost."""
        self._model(model)
        share = self._steps[model].profile_share(
            tokens, self.max_batch(model), partner_min, partner_max
        )
        return share * self._correction[model]

    def encode_time(self, request: Request) -> float:
        """Seconds to encode the prompt (once, when the request starts)."""
        base = float(self._model(request.model)["encode_s"])
        return base * self._classes.get(("encode", request.model), 1.0)

    def decode_time(self, request: Request) -> float:
        """Seconds for the VAE decode after the last step (all its tiles, if it tiles)."""
        return sum(self.decode_tiles(request))

    def decode_tiles(self, request: Request) -> list[float]:
        """Seconds of each piece the decode runs as: one piece, or, when the profile gives
        a tile geometry (``decode_tile_px``, ``decode_stride_px``, ``decode_tile_s``) and
        the image is larger than a tile, one per spatial tile (an edge tile costs its share
        of a full tile's pixels)."""
        base = self._decode_tiles_base(request)
        factor = self._classes.get(("decode", request.model, _decode_bucket(request)), 1.0)
        return base if factor == 1.0 else [t * factor for t in base]

    def _decode_tiles(self, request: Request) -> list[float]:
        sec = self._model(request.model)
        tile = sec.get("decode_tile_px")
        if tile is None or (request.width <= tile and request.height <= tile):
            mpix = request.width * request.height * request.frames / 1e6
            return [float(sec["decode_s_per_megapixel"]) * mpix]
        stride, full = int(sec["decode_stride_px"]), float(sec["decode_tile_s"])
        rows = tile_sizes(request.height, int(tile), stride)
        cols = tile_sizes(request.width, int(tile), stride)
        return [full * request.frames * r * c / tile**2 for r in rows for c in cols]

    def standalone_time(self, request: Request) -> float:
        """Seconds the request takes alone on the device: encode + steps + decode."""
        step = self.step_time(request.model, [self.tokens(request)])
        return self.encode_time(request) + request.steps * step + self.decode_time(request)

    def remaining_time(self, request: Request, steps_done: int, blocks_done: int = 0) -> float:
        """Seconds still needed alone after ``steps_done`` steps and ``blocks_done`` blocks of
        the next one (encode included if nothing ran yet)."""
        step = self.step_time(request.model, [self.tokens(request)])
        left = request.steps - steps_done - blocks_done / self.blocks(request.model)
        rest = left * step + self.decode_time(request)
        started = steps_done > 0 or blocks_done > 0
        return rest + (0.0 if started else self.encode_time(request))

    # ---- blocks (preemption inside a step) ----------------------------------------------
    def blocks(self, model: str) -> int:
        """Transformer blocks per forward of ``model`` (profile override, else geometry)."""
        sec = self._model(model)
        return int(sec.get("blocks", geometry(model).blocks))

    def chunk_time(self, model: str, tokens: Sequence[int], blocks: int) -> float:
        """Seconds for ``blocks`` transformer blocks of a packed step (blocks cost alike)."""
        return self.step_time(model, tokens) * blocks / self.blocks(model)

    def activation_bytes(self, request: Request) -> int:
        """Bytes of the block-boundary activations a step paused between blocks keeps
        (hidden states of every CFG branch; the text stream for dual-stream models)."""
        sec = self._model(request.model)
        tokens = self.tokens(request)
        if "activation_bytes_per_token" in sec:
            per_req = float(sec.get("activation_bytes_per_request", 0.0))
            return int(float(sec["activation_bytes_per_token"]) * tokens + per_req)
        step = sec["step"]
        if "cfg_passes" not in step:
            raise ValueError(
                f"profile {self.name!r}: model {request.model!r} has a table step model; give "
                "activation_bytes_per_token for block-level preemption"
            )
        geo = geometry(request.model)
        rows = tokens + geo.text_stream_tokens
        return int(float(step["cfg_passes"]) * rows * geo.hidden * geo.activation_dtype_bytes)

    def chunk_overhead(self) -> float:
        """Seconds one preemption point between blocks costs (sync + decision)."""
        value = self.profile.get("chunk_overhead_s")
        if value is None:
            raise ValueError(
                f"profile {self.name!r} has no chunk_overhead_s: block-level preemption "
                "needs it (see ditmem.scheduler.profiles)"
            )
        return float(value)

    def max_batch(self, model: str) -> int:
        """Most requests one packed step of ``model`` may hold."""
        return int(self._model(model)["max_batch"])

    def assign_deadline(self, request: Request, slo_scale: float = 3.0) -> Request:
        """Set ``standalone_s`` and ``deadline`` (``slo_ms`` if given, else scale × standalone)."""
        if slo_scale <= 0:
            raise ValueError(f"slo_scale must be > 0, got {slo_scale}")
        request.standalone_s = self.standalone_time(request)
        budget = request.slo_ms / 1000.0 if request.slo_ms is not None else None
        request.deadline = request.arrival + (
            budget if budget is not None else slo_scale * request.standalone_s
        )
        return request

    # ---- memory -----------------------------------------------------------------------
    def state_bytes(self, request: Request) -> int:
        """Bytes a started request keeps between steps (latents, solver state, embeddings)."""
        sec = self._model(request.model)
        per_token = float(sec["state_bytes_per_token"]) * self.tokens(request)
        return int(per_token + float(sec["state_bytes_per_request"]))

    def pages_for(self, request: Request, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
        """Pages of ``page_bytes`` its state needs (at least one)."""
        return max(1, math.ceil(self.state_bytes(request) / page_bytes))

    def device_pages(self, model: str, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
        """Device pages left for request state once ``model``'s weights and workspace sit."""
        sec = self._model(model)
        free = self.profile["device_bytes"] - sec["weights_bytes"] - sec["workspace_bytes"]
        if free < page_bytes:
            raise ValueError(
                f"profile {self.name!r}: {model} weights + workspace leave no room for pages "
                f"({free / 1e9:.1f} GB free of {self.profile['device_bytes'] / 1e9:.0f} GB)"
            )
        return int(free // page_bytes)

    def host_pages(self, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
        """Pages the host pool holds for offloaded requests."""
        return int(self.profile["host_bytes"] // page_bytes)

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` over the device–host link (one direction)."""
        factor = self._classes.get(("transfer",), 1.0)
        return nbytes / self.profile["host_link_bytes_per_s"] * factor

    # ---- feedback ---------------------------------------------------------------------
    def observe(self, report: StepReport) -> None:
        """Fold what an iteration measured into the correction factors (class docstring):
        the step (``step_s`` against the prediction for ``tokens``, per shape class), the
        encodes of ``report.encoded``, the decodes of ``report.decoded`` and the transfer of
        ``report.transfer_bytes`` (each only when both its measurement and prediction are
        positive)."""
        if report.batch and report.step_s > 0:
            self._observe_step(report)
        if report.encoded and report.encode_s > 0:
            base = sum(float(self._model(r.model)["encode_s"]) for r in report.encoded)
            self._fold(("encode", report.encoded[0].model), report.encode_s, base)
        if report.decoded and report.decode_s > 0:
            self._observe_decodes(report)
        if report.transfer_bytes > 0 and report.transfer_s > 0:
            base = report.transfer_bytes / self.profile["host_link_bytes_per_s"]
            self._fold(("transfer",), report.transfer_s, base)

    def _observe_step(self, report: StepReport) -> None:
        model, tokens = report.model, report.tokens
        self._model(model)
        base = self._cache.get((model, tuple(sorted(tokens))))
        if base is None:
            base = self._steps[model].seconds(list(tokens))
        if report.blocks is not None:
            base *= report.blocks / self.blocks(model)
        if base <= 0:
            return
        ratio = report.step_s / base
        key = ("step", model, _octave_bucket(sum(tokens)))
        old = self._classes.get(key, self._correction[model])
        self._classes[key] = (1 - self._alpha) * old + self._alpha * ratio
        error = (ratio / old - 1.0) ** 2
        model_var = self._spread.get(model, STEP_SPREAD_PRIOR**2)
        class_var = self._spread.get(key, model_var)
        self._spread[key] = (1 - self._alpha) * class_var + self._alpha * error
        self._spread[model] = (1 - self._alpha) * model_var + self._alpha * error
        old = self._correction[model]
        self._correction[model] = (1 - self._alpha) * old + self._alpha * ratio

    def _observe_decodes(self, report: StepReport) -> None:
        """One class per iteration's decodes (they are reported as one sum): the class of
        the largest, when they differ."""
        decoded = report.decoded
        base = sum(sum(self._decode_tiles_base(r)) for r in decoded)
        largest = max(decoded, key=lambda r: r.width * r.height * r.frames)
        self._fold(("decode", largest.model, _decode_bucket(largest)), report.decode_s, base)

    def _decode_tiles_base(self, request: Request) -> list[float]:
        key = (request.model, request.width, request.height, request.frames)
        base = self._decode_cache.get(key)
        if base is None:
            base = self._decode_cache[key] = self._decode_tiles(request)
        return base

    def _fold(self, key: tuple, measured: float, predicted: float) -> None:
        if predicted <= 0:
            return
        old = self._classes.get(key, 1.0)
        self._classes[key] = (1 - self._alpha) * old + self._alpha * measured / predicted

    def step_spread(self, model: str, tokens: int) -> float:
        """The relative standard deviation of a step's measured time around its corrected
        prediction, for a step of ``tokens`` in all: the square root of an exponential
        moving average (the corrections' rate) of the squared relative errors of its shape
        class, which starts from its model's over every class, which starts from
        ``STEP_SPREAD_PRIOR``."""
        var = self._spread.get(("step", model, _octave_bucket(tokens)))
        if var is None:
            var = self._spread.get(model, STEP_SPREAD_PRIOR**2)
        return math.sqrt(var)

    def correction(self, model: str) -> float:
        """Current measured/predicted step-time factor for ``model`` over all its shape
        classes (1.0 before feedback)."""
        return self._correction[model]

    def corrections(self) -> dict[str, float]:
        """Every correction factor learned so far, by a readable key ("step qwen-image
        2^12.0", "encode qwen-image", "decode qwen-image 2^0.0 MP", "transfer")."""
        out = {f"step {m}": f for m, f in self._correction.items()}
        for key, factor in sorted(self._classes.items(), key=str):
            kind = key[0]
            if kind == "step":
                out[f"step {key[1]} 2^{key[2] / 2:.1f} tokens"] = factor
            elif kind == "decode":
                out[f"decode {key[1]} 2^{key[2] / 2:.1f} MP"] = factor
            else:
                out[" ".join(str(k) for k in key)] = factor
        return out


def _octave_bucket(value: float) -> int:
    """Half-octave class of a positive size (0 for nothing)."""
    return round(2 * math.log2(value)) if value > 0 else 0


def _decode_bucket(request: Request) -> int:
    return _octave_bucket(request.width * request.height * request.frames / 1e6)
