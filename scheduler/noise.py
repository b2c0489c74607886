"""Timing noise: the simulator's truth drawn around the profile's prediction.

A policy plans with its cost model; the simulated device takes ``TimingNoise.draw(predicted)``
seconds instead, so the policy meets timing error as on a real machine and learns only through
its online correction. The draw is lognormal around a systematic bias:

    true = predicted * (1 + bias) * exp(sigma * z - sigma**2 / 2),   z ~ N(0, 1)

so ``E[true] = predicted * (1 + bias)`` and the spread is ``sigma`` (3 % by default, the jitter
measured between repeats of one step on this project's machines). ``sigma = 0, bias = 0`` is the
old noiseless simulation (the truth is the policy's own model).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

#: Lognormal spread of a simulated duration around its prediction when none is given.
DEFAULT_SIGMA = 0.03


@dataclass(slots=True)
class TimingNoise:
    """Seeded lognormal jitter with a systematic bias (see the module docstring).

    ``sigma``: standard deviation of ``log(true / predicted)``, >= 0; ``bias``: the mean
    relative error, > -1 (0.1 = the machine is 10 % slower than the profile says); ``seed``:
    the draws repeat exactly for the same seed and call order.
    """

    sigma: float = DEFAULT_SIGMA
    bias: float = 0.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma: a finite number >= 0, got {self.sigma!r}")
        if not (self.bias > -1 and math.isfinite(self.bias)):
            raise ValueError(f"bias: a finite number > -1, got {self.bias!r}")
        self._rng = random.Random(self.seed)

    @property
    def exact(self) -> bool:
        """True when every draw returns its prediction unchanged."""
        return self.sigma == 0 and self.bias == 0

    def draw(self, predicted: float) -> float:
        """One true duration (seconds) for a predicted one (seconds, >= 0)."""
        if self.exact or predicted <= 0:
            return predicted
        z = self._rng.gauss(0.0, 1.0) if self.sigma else 0.0
        return predicted * (1.0 + self.bias) * math.exp(self.sigma * z - self.sigma**2 / 2)
