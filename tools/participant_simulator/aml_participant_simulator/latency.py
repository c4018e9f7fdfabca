"""Latency draws. Each endpoint owns one seeded generator and draws once per arriving request,
so the sequence of latencies (in arrival order) is the same on every run with the same seed."""

from __future__ import annotations

import random

from .script import FixedLatency, LatencyDistribution, UniformLatency


class LatencySampler:
    def __init__(self, latency: float | LatencyDistribution) -> None:
        self._latency = latency
        seed = 0 if isinstance(latency, float | int | FixedLatency) else latency.seed
        # A private generator: the global `random` state is shared with everything else in the
        # process, so draws from it would not be reproducible.
        self._rng = random.Random(seed)

    def sample(self) -> float:
        latency = self._latency
        if isinstance(latency, float | int):
            return float(latency)
        if isinstance(latency, FixedLatency):
            return latency.seconds
        if isinstance(latency, UniformLatency):
            return self._rng.uniform(latency.low, latency.high)
        value = self._rng.lognormvariate(latency.mu, latency.sigma)
        return value if latency.max_seconds is None else min(value, latency.max_seconds)
