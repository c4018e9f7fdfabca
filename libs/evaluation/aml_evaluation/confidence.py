"""How sure a score is: a seeded percentile bootstrap of a headline figure over the questions it
is a mean of, and a paired bootstrap of the difference between two results over the questions
both answered (docs/evaluation.md, "How sure a score is").

Every headline figure is a mean of per-question values: 1 or 0 per verdict for `accuracy` (a
judge label or a multiple-choice option) and `resolved_rate` (a coding attempt), the token F1
for `f1_mean`. The rule, `bootstrap-percentile-v1` with the parameters of `ConfidenceMethod`:

- one result's values are sorted ascending, so its interval depends on the values alone, never
  on the order a store returned the questions in; two results' values are paired by question
  and ordered by question key;
- a new `numpy.random.Generator` (PCG64) is seeded with `seed` for each computation, and the
  resamples are drawn `batch` at a time, each batch as `integers(0, n, (batch, n))`: each row
  picks one resample's question indices, with replacement;
- a resample's statistic is the mean of the values it picked (for two results, the mean of the
  upper one's values minus the mean of the lower one's, at the same indices);
- the interval is the (1 - level) / 2 and (1 + level) / 2 quantiles of the `resamples`
  statistics, interpolated linearly between order statistics (numpy's `linear`).

These are the resamples `scipy.stats.bootstrap(..., method="percentile", batch=batch,
rng=numpy.random.default_rng(seed))` draws (tests/unit/test_confidence.py compares the two on the
same data). Memory is bounded by one batch, `batch` x n indices and values (some 13 MB for
10,000 questions), never `resamples` x n.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from aml_contract.api.results import Interval

BOOTSTRAP_METHOD: Final = "bootstrap-percentile-v1"

Floats = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int32]
Values = Sequence[float] | Floats


class ConfidenceMethod(BaseModel):
    """The bootstrap's rule and parameters, recorded in the evaluation spec (`confidence`): the
    same values under the same parameters give the same interval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["bootstrap-percentile-v1"] = BOOTSTRAP_METHOD
    level: float = Field(default=0.95, gt=0, lt=1, description="Coverage of the interval.")
    resamples: int = Field(default=10_000, ge=1)
    seed: int = Field(default=2026, ge=0, description="numpy.random.default_rng's seed.")
    batch: int = Field(
        default=100,
        ge=1,
        description="Resamples drawn by one call: the draws depend on it, and memory is "
        "batch x questions.",
    )


CONFIDENCE: Final = ConfidenceMethod()


def _resample(n: int, statistic: Callable[[Indices], Floats], method: ConfidenceMethod) -> Floats:
    rng = np.random.default_rng(method.seed)
    out = np.empty(method.resamples, dtype=np.float64)
    for start in range(0, method.resamples, method.batch):
        size = min(method.batch, method.resamples - start)
        # int32 indices are the same draws as scipy's int64 ones (numpy takes its 32-bit bounded
        # path for either below 2**32) at half the memory and a third less time.
        indices = rng.integers(0, n, (size, n), dtype=np.int32)
        out[start : start + size] = statistic(indices)
    return out


def _binary(values: Floats) -> bool:
    return bool(np.all((values == 0.0) | (values == 1.0)))


def _mean_of(values: Floats) -> Callable[[Indices], Floats]:
    """The mean of the picked values; for 0/1 values the count of picked ones over n (the same
    floats: a sum of 0s and 1s is exact), without gathering them as floats, and in sorted
    values the count of indices past the last 0, without gathering them at all."""
    n = len(values)
    if _binary(values) and bool(np.all(values[:-1] <= values[1:])):
        zeros = n - int(np.count_nonzero(values))

        def past_zeros(indices: Indices) -> Floats:
            counted: Floats = np.count_nonzero(indices >= zeros, axis=-1) / n
            return counted

        return past_zeros
    if _binary(values):
        ones = values.astype(np.bool_)

        def count(indices: Indices) -> Floats:
            counted: Floats = np.count_nonzero(ones[indices], axis=-1) / n
            return counted

        return count

    def mean(indices: Indices) -> Floats:
        means: Floats = np.mean(values[indices], axis=-1)
        return means

    return mean


def bootstrap_means(values: Values, method: ConfidenceMethod = CONFIDENCE) -> Floats | None:
    """The mean of each resample of `values` (sorted first), in the order drawn; None without
    values."""
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        return None
    return _resample(data.size, _mean_of(data), method)


def _quantiles(statistics: Floats, method: ConfidenceMethod) -> tuple[float, float]:
    tail = (1.0 - method.level) / 2.0
    low, high = np.quantile(statistics, [tail, 1.0 - tail], method="linear")
    return float(low), float(high)


def percentile_interval(
    values: Values, method: ConfidenceMethod = CONFIDENCE
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of `values`; None without values (one
    value, or values all equal, give that value at both ends)."""
    means = bootstrap_means(values, method)
    return None if means is None else _quantiles(means, method)


def headline_interval(
    values: Values, figure: float | None, method: ConfidenceMethod = CONFIDENCE
) -> Interval | None:
    """A headline figure's interval, as results report it. The figure is computed apart (a
    plain sum over the questions), so where the interval collapses onto it, rounding could
    leave it a hair outside; the ends are widened to hold it, never narrowed."""
    interval = percentile_interval(values, method)
    if interval is None or figure is None:
        return None
    low, high = interval
    return Interval(low=min(low, figure), high=max(high, figure))


def _paired(above: Mapping[str, float], below: Mapping[str, float]) -> tuple[Floats, Floats]:
    common = sorted(above.keys() & below.keys())
    return (
        np.fromiter((above[key] for key in common), dtype=np.float64, count=len(common)),
        np.fromiter((below[key] for key in common), dtype=np.float64, count=len(common)),
    )


def paired_differences(
    above: Mapping[str, float], below: Mapping[str, float], method: ConfidenceMethod = CONFIDENCE
) -> Floats | None:
    """For each resample of the questions both answered (question key -> value, paired by key,
    in key order), the mean of `above`'s values minus the mean of `below`'s at the same
    indices; None when they share no question."""
    upper, lower = _paired(above, below)
    if upper.size == 0:
        return None
    upper_mean, lower_mean = _mean_of(upper), _mean_of(lower)
    return _resample(upper.size, lambda indices: upper_mean(indices) - lower_mean(indices), method)


def difference_interval(
    above: Mapping[str, float], below: Mapping[str, float], method: ConfidenceMethod = CONFIDENCE
) -> tuple[float, float] | None:
    """The paired bootstrap interval of `above`'s mean minus `below`'s over the questions both
    answered; None when they share none."""
    differences = paired_differences(above, below, method)
    return None if differences is None else _quantiles(differences, method)


def tied(
    above: Mapping[str, float], below: Mapping[str, float], method: ConfidenceMethod = CONFIDENCE
) -> bool | None:
    """Whether two results are indistinguishable: the interval of their difference holds 0.
    None when no paired comparison is possible (no question in common)."""
    interval = difference_interval(above, below, method)
    if interval is None:
        return None
    low, high = interval
    return low <= 0.0 <= high
