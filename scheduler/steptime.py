"""Step-time models: seconds for one denoising step of a batch, from a profile's ``step``."""

from __future__ import annotations

import math
from collections.abc import Sequence


def _fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = c + a·x`` (through the origin when there is one point)."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return max(0.0, my - a * mx), a


class FlopsStepModel:
    """``t(n_1..n_B) = floor + cfg · Σ F(n_i) / (R · u(Σ n_i))`` (see profiles.py)."""

    def __init__(self, step: dict):
        points = step["flops_points"]
        if not points:
            raise ValueError("flops_points: at least one [tokens, tflop, attention_share]")
        ns = [float(p[0]) for p in points]
        attn = [float(p[1]) * float(p[2]) for p in points]
        linear = [float(p[1]) * (1.0 - float(p[2])) for p in points]
        self.quad = sum(a * n * n for a, n in zip(attn, ns, strict=True)) / sum(n**4 for n in ns)
        self.const, self.lin = _fit_line(ns, linear)
        self.cfg = float(step["cfg_passes"])
        self.rate = float(step["effective_tflops"])
        self.floor = float(step["step_floor_s"])
        anchor = step["batching"]
        self.n0 = self._solve_n0(anchor["tokens"], anchor["batch"], anchor["throughput_gain"])

    def tflop(self, tokens: float) -> float:
        """TFLOP of one forward (one CFG branch) over ``tokens`` tokens."""
        return self.const + self.lin * tokens + self.quad * tokens * tokens

    def _time(self, tokens: Sequence[int], n0: float) -> float:
        total = float(sum(tokens))
        work = self.cfg * sum(self.tflop(n) for n in tokens)
        return self.floor + work * (total + n0) / (total * self.rate)

    def _solve_n0(self, n: int, batch: int, gain: float) -> float:
        """N0 such that ``batch`` requests of ``n`` tokens run (1 + gain)× faster batched."""

        def speedup(n0: float) -> float:
            return batch * self._time([n], n0) / self._time([n] * batch, n0)

        if gain <= 0 or speedup(0.0) >= 1 + gain:
            return 0.0
        lo, hi = 0.0, 1e7
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if speedup(mid) < 1 + gain else (lo, mid)
        return (lo + hi) / 2

    def seconds(self, tokens: Sequence[int]) -> float:
        return self._time(tokens, self.n0)

    def min_share(self, tokens: int) -> float:
        """Infimum of one request's share of any batch's step: its FLOPs at full utilisation."""
        return self.cfg * self.tflop(tokens) / self.rate

    def profile_share(
        self, tokens: int, max_batch: int, partner_min: int, partner_max: int
    ) -> float:
        """A lower bound on one request's share of any step ``seconds`` charges, when batches
        hold at most ``max_batch`` members of at most ``partner_max`` tokens each.

        A step splits exactly into per-member shares ``floor/B + cfg·F(n_i)/R · (N + N0)/N``
        (B members, N tokens in all); B ≤ ``max_batch`` and N ≤ n + (max_batch − 1) ·
        ``partner_max`` bound each share from below. ``partner_min`` is unused here (the
        share only grows with smaller partners)."""
        del partner_min
        total = tokens + (max_batch - 1) * partner_max
        work = self.cfg * self.tflop(tokens) / self.rate
        return self.floor / max_batch + work * (total + self.n0) / total


class TableStepModel:
    """Measured points ``(tokens, batch) -> seconds``, interpolated log-log in tokens."""

    def __init__(self, step: dict):
        self.curves: dict[int, list[tuple[float, float]]] = {}
        for p in step["points"]:
            tokens, batch, secs = int(p["tokens"]), int(p["batch"]), float(p["seconds"])
            if tokens < 1 or batch < 1 or secs <= 0:
                raise ValueError(f"table point {p}: tokens, batch and seconds must be > 0")
            self.curves.setdefault(batch, []).append((math.log(tokens), math.log(secs)))
        if 1 not in self.curves:
            raise ValueError("a table profile needs batch-1 points")
        for curve in self.curves.values():
            curve.sort()

    @staticmethod
    def _interp(curve: list[tuple[float, float]], x: float) -> float:
        if len(curve) == 1:
            return math.exp(curve[0][1] + (x - curve[0][0]))  # proportional to tokens
        i = 1
        while i < len(curve) - 1 and curve[i][0] < x:
            i += 1
        (x0, y0), (x1, y1) = curve[i - 1], curve[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def seconds(self, tokens: Sequence[int]) -> float:
        """A measured batch size b: ``curve_b`` at the mean size — exact for equal sizes.
        Unequal sizes cost at least that, at least their largest member alone, and at least
        the sum of their batch-1 times scaled by the batching gain measured at the mean
        (attention grows with each member's own length, not with the mean's). Other batch
        sizes: the sum of batch-1 times."""
        batch = len(tokens)
        alone = [self._interp(self.curves[1], math.log(n)) for n in tokens]
        if batch > 1 and batch in self.curves:
            x = math.log(sum(tokens) / batch)
            equal = self._interp(self.curves[batch], x)
            gain = equal / (batch * self._interp(self.curves[1], x))
            return max(equal, max(alone), gain * sum(alone))
        return sum(alone)

    def min_share(self, tokens: int) -> float:
        """Not defined: a measured table has no FLOPs to bound a share by."""
        raise ValueError("a table (measured) step model has no FLOPs bound; use profile_share")

    def profile_share(
        self, tokens: int, max_batch: int, partner_min: int, partner_max: int
    ) -> float:
        """A lower bound on one request's share of any step ``seconds`` charges, when batches
        hold at most ``max_batch`` members of ``partner_min``..``partner_max`` tokens each.

        A batch of a measured size b costs ``curve_b(mean tokens)``, shared equally; any
        other batch costs the sum of its members' batch-1 times. So the share is at least the
        least of the batch-1 time and, for each measured b ≤ ``max_batch``, ``curve_b / b``
        over the means the partners allow (log-log linear pieces: ends and knots suffice)."""
        best = self._interp(self.curves[1], math.log(tokens))
        for b, curve in self.curves.items():
            if b == 1 or b > max_batch:
                continue
            lo = math.log((tokens + (b - 1) * partner_min) / b)
            hi = math.log((tokens + (b - 1) * partner_max) / b)
            xs = [lo, hi] + [x for x, _ in curve if lo < x < hi]
            best = min(best, min(self._interp(curve, x) for x in xs) / b)
        return best


def make_step_model(step: dict):
    """The step model for a parsed profile ``step`` section."""
    if step["kind"] == "flops":
        return FlopsStepModel(step)
    return TableStepModel(step)
