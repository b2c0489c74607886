"""The node sections of a device profile: parallel speed-up per model and token count, links.

Format (in the profile JSON, next to ``models``)::

    "parallel": {
      "<model>": {                       # a key of ditmem.scheduler.models
        "tokens":  [n_1, n_2, ...],      # ascending token counts (image/video tokens)
        "speedup": {"1": [1.0, ...], "2": [...], "4": [...], "8": [...]},
        "source":  "where the numbers come from"
      }
    },
    "links": {"device_bytes_per_s": ..., "host_bytes_per_s": ..., "source": "...",
              "move_latency_s": ...,       # optional, default 0
              "job_latency_s": ...}        # optional, default 0

``speedup[d][i]`` = step time at degree 1 / step time at sequence-parallel degree ``d`` for
one step of ``tokens[i]`` tokens. Lookup interpolates linearly in ``log(tokens)`` and clamps
at the ends; a degree the table lacks is an error naming it. ``device_bytes_per_s`` is one
device's peer link (one direction), ``host_bytes_per_s`` one device's host link,
``move_latency_s`` the fixed seconds every move command costs besides its bytes (control
round trips, the workers' bookkeeping; measured at start-up by the node engine's calibration,
0 for the FLOP-derived profiles, which have no measurement), ``job_latency_s`` the fixed
seconds every job costs besides its stages (the launch command to the group's workers, the
job's thread, the completion's way back to the loop; measured at start-up by
``ditmem.parallel.job_latency``, 0 when the profile has no measurement).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..models import known_models


class NodeProfileError(ValueError):
    """A profile's ``parallel`` or ``links`` section is missing or malformed."""


@dataclass(frozen=True, slots=True)
class SpeedupTable:
    """One model's speed-up per degree over ascending token counts (see the module doc)."""

    log_tokens: tuple[float, ...]
    by_degree: dict[int, tuple[float, ...]]
    source: str

    def speedup(self, tokens: float, degree: int) -> float:
        """Step time at degree 1 / at ``degree`` for a step of ``tokens`` tokens (> 0)."""
        row = self.by_degree.get(degree)
        if row is None:
            raise NodeProfileError(
                f"no speed-up for degree {degree}; the profile gives degrees "
                f"{', '.join(str(d) for d in sorted(self.by_degree))}"
            )
        if tokens <= 0:
            raise ValueError(f"tokens must be > 0, got {tokens}")
        x, xs = math.log(tokens), self.log_tokens
        if len(xs) == 1 or x <= xs[0]:
            return row[0]
        if x >= xs[-1]:
            return row[-1]
        i = bisect.bisect_right(xs, x)
        f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return row[i - 1] + f * (row[i] - row[i - 1])


@dataclass(frozen=True, slots=True)
class Links:
    """Bytes per second of one device's peer link and of its host link (one direction), the
    fixed seconds of one move command (offload, restore or re-shard) and of one job besides
    its stages (launch, completion)."""

    device_bytes_per_s: float
    host_bytes_per_s: float
    source: str
    move_latency_s: float = 0.0
    job_latency_s: float = 0.0

    def to_dict(self) -> dict:
        """The profile's ``links`` section for these links (``parse_links`` reads it back)."""
        return {
            "device_bytes_per_s": self.device_bytes_per_s,
            "host_bytes_per_s": self.host_bytes_per_s,
            "move_latency_s": self.move_latency_s,
            "job_latency_s": self.job_latency_s,
            "source": self.source,
        }


def _source(section: dict, where: str) -> str:
    source = section.get("source")
    if not isinstance(source, str) or not source.strip():
        raise NodeProfileError(f"{where}.source: every section needs a non-empty source")
    return source


def parse_table(section: dict, where: str) -> SpeedupTable:
    """Validate one model's ``parallel`` entry."""
    if not isinstance(section, dict):
        raise NodeProfileError(f"{where}: expected an object with tokens, speedup, source")
    source = _source(section, where)
    tokens = section.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise NodeProfileError(f"{where}.tokens: a non-empty list of token counts")
    if any(not isinstance(n, (int, float)) or n <= 0 for n in tokens):
        raise NodeProfileError(f"{where}.tokens: token counts must be > 0, got {tokens}")
    if any(b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
        raise NodeProfileError(f"{where}.tokens: must be strictly ascending, got {tokens}")
    table = section.get("speedup")
    if not isinstance(table, dict) or "1" not in table:
        raise NodeProfileError(f"{where}.speedup: an object of degree -> list, with degree 1")
    by_degree: dict[int, tuple[float, ...]] = {}
    for key, row in table.items():
        try:
            degree = int(key)
        except ValueError:
            degree = 0
        if degree < 1 or degree & (degree - 1):
            raise NodeProfileError(f"{where}.speedup: degree {key!r} is not a power of two")
        if not isinstance(row, list) or len(row) != len(tokens):
            raise NodeProfileError(
                f"{where}.speedup.{key}: needs {len(tokens)} values (one per token count)"
            )
        if any(not isinstance(s, (int, float)) or not 0 < s <= degree for s in row):
            raise NodeProfileError(
                f"{where}.speedup.{key}: each speed-up must be in (0, {degree}], got {row}"
            )
        by_degree[degree] = tuple(float(s) for s in row)
    if any(abs(s - 1.0) > 1e-9 for s in by_degree[1]):
        raise NodeProfileError(f"{where}.speedup.1: degree 1 is 1.0 by definition")
    return SpeedupTable(tuple(math.log(n) for n in tokens), by_degree, source)


def parse_links(profile: dict) -> Links:
    """The ``links`` section of a (parsed) profile dict."""
    name = profile.get("name", "<profile>")
    section = profile.get("links")
    if not isinstance(section, dict):
        raise NodeProfileError(
            f"profile {name!r} has no 'links' section (device and host link bandwidths); "
            "a node simulation needs it"
        )
    where = f"{name}.links"
    source = _source(section, where)
    values = []
    for key in ("device_bytes_per_s", "host_bytes_per_s"):
        value = section.get(key)
        if not isinstance(value, (int, float)) or not value > 0:
            raise NodeProfileError(f"{where}.{key}: a number > 0 (bytes per second)")
        values.append(float(value))
    latency = _seconds(section, "move_latency_s", where, "seconds per move")
    job = _seconds(section, "job_latency_s", where, "seconds per job")
    return Links(values[0], values[1], source, latency, job)


def _seconds(section: dict, key: str, where: str, what: str) -> float:
    """``section[key]`` (default 0) checked a finite number >= 0 of seconds."""
    value = section.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise NodeProfileError(f"{where}.{key}: a finite number >= 0 ({what}), got {value!r}")
    return float(value)


class ParallelProfile:
    """Speed-up tables and links of one profile (``ParallelProfile(cost.profile)``)."""

    def __init__(self, profile: dict):
        self.name = profile.get("name", "<profile>")
        section = profile.get("parallel")
        if not isinstance(section, dict) or not section:
            raise NodeProfileError(
                f"profile {self.name!r} has no 'parallel' section (speed-up per degree); "
                "a node simulation needs it"
            )
        self.tables: dict[str, SpeedupTable] = {}
        for model, entry in section.items():
            where = f"{self.name}.parallel.{model}"
            if model not in known_models():
                known = ", ".join(known_models())
                raise NodeProfileError(f"{where}: unknown model; known: {known}")
            self.tables[model] = parse_table(entry, where)
        self.links = parse_links(profile)

    def table(self, model: str) -> SpeedupTable:
        table = self.tables.get(model)
        if table is None:
            raise NodeProfileError(
                f"profile {self.name!r} has no parallel speed-up for model {model!r}; it has "
                f"{', '.join(self.tables)}"
            )
        return table

    def speedup(self, model: str, tokens: float, degree: int) -> float:
        """Step time at degree 1 / at ``degree`` for ``model`` and ``tokens`` tokens."""
        if degree == 1:
            return 1.0
        try:
            return self.table(model).speedup(tokens, degree)
        except NodeProfileError as exc:
            raise NodeProfileError(f"profile {self.name!r}, model {model!r}: {exc}") from None

    def degrees(self, model: str) -> tuple[int, ...]:
        """Degrees the table gives for ``model``, ascending."""
        return tuple(sorted(self.table(model).by_degree))
