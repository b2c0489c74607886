"""The forecast's charge capped at what its arrivals could still use before their own deadlines.

``slo``'s give-up rule charges each deadline prefix (present on-time work in deadline order)
the work ``F(Δ)`` the forecast expects of arrivals still to come that will be due within the
prefix's ``Δ`` seconds. A forecast arrival due at ``δ`` is served, in deadline order, after
the present work due before ``δ``; when that work already fills the device time before ``δ``
the arrival would be late anyway (the rule would give it up once present), and it must not
cost a present on-time request its place. With ``give_up_forecast="fits"`` each prefix is
charged only the forecast work that fits before its own deadline, evaluated at the present
deadlines ``d_1 ≤ d_2 ≤ …`` (``Δ_j = d_j − now``):

    G_j = G_{j−1} + min(F(Δ_j) − F(Δ_{j−1}), max(0, R_j − P_{j−1} − G_{j−1})),  G_0 = 0,

where ``R_j`` is the device time left to work before ``d_j`` without the forecast (the lane's
forced work and pending decodes taken off), ``P_{j−1}`` the present on-time work due by
``d_{j−1}``: the arrivals due in ``(d_{j−1}, d_j]`` get at most the time before ``d_j`` that
the present work due before them and the earlier-due arrivals leave. (An upper bound on what
they could use: an arrival due inside the interval has only the time to its own deadline.)
The prefix ``j`` then overruns when ``P_j + G_j > R_j``. ``G_j ≤ F(Δ_j)``, so the rule never
gives up more than with the full charge, and ``G_j ≥ 0``, so never less than with none.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class FittedCharge:
    """The capped forecast charge over a decision's deadline prefixes (seconds).

    Push the prefixes in deadline order (``push``); a request set aside is ``drop``-ped
    (its work no longer counts before later arrivals, so they may fit where it stood).
    """

    rooms: list[float] = field(default_factory=list)  # R_j: time left without the forecast
    expected: list[float] = field(default_factory=list)  # F(Δ_j)
    work: list[float] = field(default_factory=list)  # present work of prefix j's own request
    charge: list[float] = field(default_factory=list)  # G_j
    total: float = 0.0  # present work of every prefix pushed

    def push(self, room: float, expected: float, work: float) -> float:
        """Add the next prefix (``room`` R_j s, ``expected`` F(Δ_j) s, its request's
        ``work`` s); returns its charge G_j (s)."""
        if work < 0:
            raise ValueError(f"work must be >= 0, got {work!r}")
        self.rooms.append(room)
        self.expected.append(expected)
        self.work.append(work)
        self.charge.append(self._next(len(self.rooms) - 1, self.total))
        self.total += work
        return self.charge[-1]

    def drop(self, index: int) -> None:
        """Take prefix ``index``'s request out (set aside): its work becomes 0 and the
        charges from there on are recomputed."""
        if not 0 <= index < len(self.work):
            raise ValueError(f"index must be in [0, {len(self.work)}), got {index!r}")
        self.total -= self.work[index]
        self.work[index] = 0.0
        before = sum(self.work[:index])
        for j in range(index, len(self.rooms)):
            self.charge[j] = self._next(j, before)
            before += self.work[j]

    def last(self) -> float:
        """The charge of the latest prefix pushed (s; 0 before any)."""
        return self.charge[-1] if self.charge else 0.0

    def _next(self, j: int, before: float) -> float:
        """G_j from G_{j−1}, with ``before`` = P_{j−1}."""
        prev_g = self.charge[j - 1] if j > 0 else 0.0
        prev_f = self.expected[j - 1] if j > 0 else 0.0
        arriving = max(0.0, self.expected[j] - prev_f)
        room = max(0.0, self.rooms[j] - before - prev_g)
        return prev_g + min(arriving, room)
