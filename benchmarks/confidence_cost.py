"""What "how sure a score is" costs (aml_evaluation.confidence): one headline interval and one
board tie at 2,000 and 10,000 questions (wall time, best of three, and the peak memory numpy
allocates), aggregate() of a whole job of that size with and without the intervals (what the
scheduler adds at a job's completion), and the size of the job's kept per-question values.

    .venv/bin/python benchmarks/confidence_cost.py [--sizes 2000 10000]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any
from unittest import mock

import bson

from aml_evaluation import aggregate as aggregation
from aml_evaluation.aggregate import QuestionOutcome, aggregate, headline_values
from aml_evaluation.confidence import percentile_interval, tied
from aml_runtime.stores.leaderboard import HeadlineOutcomes, encode_outcomes

CATEGORIES = ("single-hop", "multi-hop", "temporal", "open-domain", "adversarial")


def _best_of_three(work: Callable[[], Any]) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def _peak_mb(work: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def _job(n: int, seed: int) -> list[QuestionOutcome]:
    """A LoCoMo-shaped job of n judged questions over five categories (one excluded)."""
    rng = random.Random(seed)
    outcomes = []
    for i in range(n):
        label = "CORRECT" if rng.random() < 0.7 else "WRONG"
        outcomes.append(
            QuestionOutcome(
                dataset_id="locomo",
                category_name=CATEGORIES[i % len(CATEGORIES)],
                scored=True,
                judge_label=label,
                judge_labels=[label],
                f1=rng.random(),
                bleu1=rng.random(),
                question_id=f"conv-{i // 200}:q{i % 200:04d}",
            )
        )
    return outcomes


def measure(n: int) -> None:
    rng = random.Random(n)
    verdicts = [float(rng.random() < 0.7) for _ in range(n)]
    f1 = [rng.random() for _ in range(n)]
    above = {f"locomo/q{i}": float(rng.random() < 0.7) for i in range(n)}
    below = {f"locomo/q{i}": float(rng.random() < 0.7) for i in range(n)}
    print(f"{n} questions")
    for name, work in (
        ("interval, 0/1 values", lambda: percentile_interval(verdicts)),
        ("interval, F1 values", lambda: percentile_interval(f1)),
        ("tie, paired 0/1 values", lambda: tied(above, below)),
    ):
        print(f"  {name:24} {_best_of_three(work):6.3f} s  peak {_peak_mb(work):5.1f} MB")
    outcomes = _job(n, n)
    excluded = {"locomo": ["adversarial"]}

    def aggregated() -> None:
        aggregate("j", "completed", outcomes, excluded)

    with_ci = _best_of_three(aggregated)
    with mock.patch.object(aggregation, "headline_interval", lambda *_: None):
        without = _best_of_three(aggregated)
    print(f"  aggregate() of the job   {with_ci:6.3f} s  ({without:.3f} s without intervals)")
    values = headline_values(outcomes, excluded, "accuracy")
    document = encode_outcomes(HeadlineOutcomes(job_id="j", headline="accuracy", values=values))
    kept, plain = len(bson.encode(document)), len(bson.encode({"values": values}))
    print(f"  kept values              {kept / 1e3:6.1f} KB for {len(values)} questions "
          f"({plain / 1e3:.1f} KB as one BSON field each)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 10_000])
    for n in parser.parse_args().sizes:
        measure(n)


if __name__ == "__main__":
    main()
