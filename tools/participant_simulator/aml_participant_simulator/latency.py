"""Latency draws. Each endpoint owns one seeded generator and draws once per arriving request,
so the sequence of latencies (in arrival order) is the same on every run with the same seed."""

from __future__ import annotations

import random

from .script import FixedLatency, LatencySpec, UniformLatency


class LatencySampler:
    def __init__(self, spec: float | LatencySpec) -> None:
        self._spec = spec
        seed = 0 if isinstance(spec, float | int | FixedLatency) else spec.seed
        # A private generator: the global `random` state is shared with everything else in the
        # process, so draws from it would not be reproducible.
        self._rng = random.Random(seed)

    def sample(self) -> float:
        spec = self._spec
        if isinstance(spec, float | int):
            return float(spec)
        if isinstance(spec, FixedLatency):
            return spec.seconds
        if isinstance(spec, UniformLatency):
            return self._rng.uniform(spec.low, spec.high)
        value = self._rng.lognormvariate(spec.mu, spec.sigma)
        return value if spec.max_seconds is None else min(value, spec.max_seconds)
