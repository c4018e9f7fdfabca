"""Efficiency figures (rule `efficiency-v1`): what a job's results cost, beside them. Pure: the
scheduler streams a completed job's audit records, answers and scores into these tallies
(aml_scheduler.job_efficiency); nothing here reads or writes anything.

Latency. The audit's `latency_ms` of each HTTP attempt (request sent to response received, as
the platform measured it: the participant's time and the network between, never the platform's
own queueing, `queued_ms`) goes into a histogram of log-spaced buckets, each `LATENCY_RESOLUTION`
(2%) wider than the one below, from 0.01 ms up. A percentile is the upper bound of the bucket
holding its nearest-rank order statistic, so it is never below the exact value and at most 2%
above it, clipped to the exact maximum; the count and the maximum are exact. Memory is bounded
(at most 1,201 buckets, whatever the count) and two histograms merge by adding their buckets.

Calls, per work item (an Add request or a question's Search), over every delivery of the item:
- `attempts`: every HTTP attempt; an Add's status polls (`add_status`) count here and in the
  failure counts, but its latency is that of its `add` attempts alone (the time the participant
  took to accept or confirm the request: a 202's task may take longer, which its polls show and
  no latency figure does);
- `first_attempts`: the latency of items whose one and only `add` or `search` attempt succeeded
  (answered and, where judged, valid);
- `retried`: the latency of every `add` or `search` attempt of items that needed more than one;
  an item with a single failed attempt is in neither (its failure is counted);
- `timeouts`: attempts without an HTTP status whose error is a timeout (`TIMEOUT_ERRORS`);
  `rate_limited`: attempts answered 429; `errors`: any other failed attempt (no answer, a 4xx or
  5xx, a body that broke the contract);
- Health checks are the platform's own probing and are left out.

Context, per question answered from a Search's candidates (the answer document): candidates
returned and used, the returned candidates' text in words by the frozen counter `wc-v1`
(aml_evaluation.wordcount: the same count for every participant and answer model, unlike the
answer model's tokenizer that the context budget counts with) and in UTF-8 bytes, the words of the
candidates that fitted the budget, and whether any returned candidate was cut.

LLM use, per question: the answer model's tokens in and out as the provider reported them (a
coding attempt's: the sum over its agent's steps), and the judge's summed over its calls, per
judged question (a multiple-choice or F1-only question asks no judge).

Cells: the job, each dataset and each category, every question counted (a category reported apart
from Overall included: its calls were made all the same). Adds belong to a dataset, not a
category: their figures are reported per job and per dataset only.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel

from aml_contract.api.results import (
    CallStats,
    ContextStats,
    DatasetEfficiency,
    Efficiency,
    JobEfficiency,
    LatencyStats,
    LLMUse,
    MeasuredUnder,
)
from aml_evaluation.wordcount import count_words

EFFICIENCY_METHOD: Final = "efficiency-v1"
LATENCY_RESOLUTION: Final = 0.02
# The upper bound of the lowest bucket: every faster attempt shares it (clipped to the maximum).
_FLOOR_MS: Final = 0.01
# The highest bucket's upper bound is 0.01 ms * 1.02^1200, about 58 hours: far beyond any call's
# timeout, so the bound on memory never merges real latencies.
_TOP_BUCKET: Final = 1200
# The error classes of an attempt that got no answer in time: httpx's timeouts and the
# participant client's own total deadline per attempt (aml_pipeline.participants.client).
TIMEOUT_ERRORS: Final = frozenset(
    {
        "TimeoutException",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "DeadlineExceeded",
        "TimeoutError",
    }
)
# The validation an answered attempt carries when the answer kept the contract.
_VALID: Final = "valid"
# The operations whose latency is the item's (an Add's status polls are not).
_TIMED: Final = frozenset({"add", "search"})
_ADD_OPERATIONS: Final = frozenset({"add", "add_status"})

Operation = Literal["add", "add_status", "search", "health"]


# -- latency -----------------------------------------------------------------------------------


@dataclass
class LatencyHistogram:
    """Log-spaced buckets of latencies in milliseconds (see the module docstring)."""

    resolution: float = LATENCY_RESOLUTION
    count: int = 0
    max_ms: float | None = None
    buckets: dict[int, int] = field(default_factory=dict)

    def _upper(self, index: int) -> float:
        return _FLOOR_MS * (1.0 + self.resolution) ** index

    def _index(self, value_ms: float) -> int:
        if value_ms <= _FLOOR_MS:
            return 0
        guess = math.ceil(math.log(value_ms / _FLOOR_MS) / math.log1p(self.resolution))
        index = min(max(guess, 0), _TOP_BUCKET)
        # The logarithm may land one off at a bucket's edge: the bucket is the one whose upper
        # bound is the first at or above the value.
        while index < _TOP_BUCKET and self._upper(index) < value_ms:
            index += 1
        while index > 0 and self._upper(index - 1) >= value_ms:
            index -= 1
        return index

    def add(self, value_ms: float) -> None:
        value = max(float(value_ms), 0.0)
        index = self._index(value)
        self.buckets[index] = self.buckets.get(index, 0) + 1
        self.count += 1
        self.max_ms = value if self.max_ms is None else max(self.max_ms, value)

    def merge(self, other: LatencyHistogram) -> None:
        if other.resolution != self.resolution:
            raise ValueError("histograms of different resolutions do not merge")
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count
        self.count += other.count
        if other.max_ms is not None:
            self.max_ms = other.max_ms if self.max_ms is None else max(self.max_ms, other.max_ms)

    def percentile(self, percent: int) -> float | None:
        """The upper bound of the bucket holding the nearest-rank `percent`-th order statistic
        (rank ceil(percent/100 · count), in integers so 95% of 20 is the 19th), clipped to the
        maximum; None without samples."""
        if not self.count or self.max_ms is None:
            return None
        rank = max(1, -(-percent * self.count // 100))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                # The top bucket is open above (anything slower lands in it): its bound is the
                # maximum.
                top = index == _TOP_BUCKET
                return self.max_ms if top else min(self._upper(index), self.max_ms)
        return self.max_ms

    def stats(self) -> LatencyStats:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return LatencyStats(
            count=self.count,
            p50_ms=rounded(self.percentile(50)),
            p95_ms=rounded(self.percentile(95)),
            p99_ms=rounded(self.percentile(99)),
            max_ms=rounded(self.max_ms),
            resolution=self.resolution,
        )


# -- participant calls ------------------------------------------------------------------------


class CallAttempt(BaseModel):
    """What efficiency reads of one audit record (aml_contract.api.audit.AuditRecord)."""

    operation: Operation
    attempt: int
    latency_ms: float
    status: int | None = None
    error_class: str | None = None
    outcome: Literal["ok", "retry", "final"]
    validation: str | None = None


def timed_out(attempt: CallAttempt) -> bool:
    return attempt.status is None and attempt.error_class in TIMEOUT_ERRORS


def rate_limited(attempt: CallAttempt) -> bool:
    return attempt.status == 429


def succeeded(attempt: CallAttempt) -> bool:
    """Answered as the operation wants (a 200, an Add's 202), and valid where it was judged."""
    return attempt.outcome == "ok" and attempt.validation in (None, _VALID)


def failed_otherwise(attempt: CallAttempt) -> bool:
    """A failed attempt that is neither a timeout nor a 429: no answer, a 4xx or 5xx, an answer
    that broke the contract. A poll's 202 ("not yet") is no failure."""
    if timed_out(attempt) or rate_limited(attempt):
        return False
    if attempt.status is None or attempt.status >= 400 or attempt.error_class is not None:
        return True
    return attempt.validation not in (None, _VALID)


def is_add(attempts: Iterable[CallAttempt]) -> bool:
    """Whether these attempts are an Add request's (else a question's Search)."""
    return any(attempt.operation in _ADD_OPERATIONS for attempt in attempts)


@dataclass
class CallTally:
    """One operation's calls in one cell (see the module docstring)."""

    items: int = 0
    attempts: int = 0
    first: LatencyHistogram = field(default_factory=LatencyHistogram)
    retried: LatencyHistogram = field(default_factory=LatencyHistogram)
    timeouts: int = 0
    rate_limited: int = 0
    errors: int = 0

    def add_item(self, attempts: Sequence[CallAttempt]) -> None:
        """Every recorded attempt of one work item, over all its deliveries."""
        calls = [attempt for attempt in attempts if attempt.operation != "health"]
        if not calls:
            return
        self.items += 1
        self.attempts += len(calls)
        self.timeouts += sum(map(timed_out, calls))
        self.rate_limited += sum(map(rate_limited, calls))
        self.errors += sum(map(failed_otherwise, calls))
        timed = [attempt for attempt in calls if attempt.operation in _TIMED]
        if len(timed) == 1:
            (only,) = timed
            if only.attempt == 1 and succeeded(only):
                self.first.add(only.latency_ms)
        elif len(timed) > 1:
            for attempt in timed:
                self.retried.add(attempt.latency_ms)

    def merge(self, other: CallTally) -> None:
        self.items += other.items
        self.attempts += other.attempts
        self.first.merge(other.first)
        self.retried.merge(other.retried)
        self.timeouts += other.timeouts
        self.rate_limited += other.rate_limited
        self.errors += other.errors

    def stats(self) -> CallStats | None:
        if not self.items:
            return None
        return CallStats(
            items=self.items,
            attempts=self.attempts,
            first_attempts=self.first.stats(),
            retried=self.retried.stats(),
            timeouts=self.timeouts,
            rate_limited=self.rate_limited,
            errors=self.errors,
        )


# -- retrieved context ------------------------------------------------------------------------


def candidate_text(candidate: Mapping[str, Any]) -> str:
    """A stored candidate's text: its content string, or its content array's text parts joined
    by a space (images are not text: the answer document counts them apart)."""
    content = candidate.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return " ".join(
        str(part.get("text", ""))
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    )


class RetrievedSize(BaseModel):
    """What a Search returned, in the answer document: every candidate's words (wc-v1) and
    UTF-8 bytes, and the words of the candidates the answer model saw."""

    retrieved_tokens: int
    retrieved_bytes: int
    used_tokens: int


class WordCounts:
    """`count_words`, remembered for the texts seen last: a memory is returned by many of its
    user's questions (LoCoMo-10: 100 candidates per Search, all from the one user's memories),
    and counting every candidate of every answer again was most of the answerer's own work. Only
    texts up to `longest` characters are kept, at most `kept` of them (a few MB)."""

    def __init__(self, kept: int = 4096, longest: int = 2048) -> None:
        self._kept = kept
        self._longest = longest
        self._counts: OrderedDict[str, int] = OrderedDict()

    def __call__(self, text: str) -> int:
        known = self._counts.get(text)
        if known is not None:
            self._counts.move_to_end(text)
            return known
        words = count_words(text)
        if len(text) <= self._longest:
            self._counts[text] = words
            if len(self._counts) > self._kept:
                self._counts.popitem(last=False)
        return words


def retrieved_size(
    candidates: Sequence[Mapping[str, Any]],
    used: int,
    count: Callable[[str], int] = count_words,
) -> RetrievedSize:
    """`used`: how many of the candidates, from the first, reached the answer model; `count`
    counts a text's words by wc-v1 (`WordCounts` remembers them)."""
    words = []
    size = 0
    for candidate in candidates:
        text = candidate_text(candidate)
        words.append(count(text))
        size += len(text.encode("utf-8"))
    return RetrievedSize(
        retrieved_tokens=sum(words), retrieved_bytes=size, used_tokens=sum(words[:used])
    )


class AnswerUse(BaseModel):
    """What efficiency reads of a `done` answer document (fields absent on documents written
    before they were recorded, and on coding attempts for the retrieval sizes)."""

    candidates_returned: int | None = None
    candidates_used: int | None = None
    retrieved_tokens: int | None = None
    retrieved_bytes: int | None = None
    used_tokens: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None


class JudgeUse(BaseModel):
    """What efficiency reads of a score document: the judge's tokens over its calls."""

    judge_tokens_in: int | None = None
    judge_tokens_out: int | None = None


@dataclass
class _Mean:
    total: float = 0.0
    count: int = 0

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.count += 1

    def merge(self, other: _Mean) -> None:
        self.total += other.total
        self.count += other.count

    def value(self) -> float | None:
        return round(self.total / self.count, 3) if self.count else None


@dataclass
class ContextTally:
    questions: int = 0
    returned: _Mean = field(default_factory=_Mean)
    retrieved_tokens: _Mean = field(default_factory=_Mean)
    retrieved_bytes: _Mean = field(default_factory=_Mean)
    used: _Mean = field(default_factory=_Mean)
    used_tokens: _Mean = field(default_factory=_Mean)
    truncated: int = 0

    def add(self, answer: AnswerUse) -> None:
        if answer.candidates_returned is None:
            return
        self.questions += 1
        self.returned.add(answer.candidates_returned)
        self.retrieved_tokens.add(answer.retrieved_tokens)
        self.retrieved_bytes.add(answer.retrieved_bytes)
        self.used.add(answer.candidates_used)
        self.used_tokens.add(answer.used_tokens)
        used = answer.candidates_used
        self.truncated += used is not None and used < answer.candidates_returned

    def merge(self, other: ContextTally) -> None:
        self.questions += other.questions
        for mine, theirs in (
            (self.returned, other.returned),
            (self.retrieved_tokens, other.retrieved_tokens),
            (self.retrieved_bytes, other.retrieved_bytes),
            (self.used, other.used),
            (self.used_tokens, other.used_tokens),
        ):
            mine.merge(theirs)
        self.truncated += other.truncated

    def stats(self) -> ContextStats | None:
        if not self.questions:
            return None
        return ContextStats(
            questions=self.questions,
            candidates_returned_mean=self.returned.value(),
            retrieved_tokens_mean=self.retrieved_tokens.value(),
            retrieved_bytes_mean=self.retrieved_bytes.value(),
            candidates_used_mean=self.used.value(),
            used_tokens_mean=self.used_tokens.value(),
            truncated_questions=self.truncated,
        )


@dataclass
class LLMTally:
    questions: int = 0
    answer_in: _Mean = field(default_factory=_Mean)
    answer_out: _Mean = field(default_factory=_Mean)
    judge_in: _Mean = field(default_factory=_Mean)
    judge_out: _Mean = field(default_factory=_Mean)

    def answered(self, answer: AnswerUse) -> None:
        self.questions += 1
        self.answer_in.add(answer.tokens_in)
        self.answer_out.add(answer.tokens_out)

    def judged(self, judge: JudgeUse) -> None:
        self.judge_in.add(judge.judge_tokens_in)
        self.judge_out.add(judge.judge_tokens_out)

    def merge(self, other: LLMTally) -> None:
        self.questions += other.questions
        self.answer_in.merge(other.answer_in)
        self.answer_out.merge(other.answer_out)
        self.judge_in.merge(other.judge_in)
        self.judge_out.merge(other.judge_out)

    def stats(self) -> LLMUse | None:
        if not self.questions and not self.judge_in.count:
            return None
        return LLMUse(
            questions=self.questions,
            answer_tokens_in_mean=self.answer_in.value(),
            answer_tokens_out_mean=self.answer_out.value(),
            judge_tokens_in_mean=self.judge_in.value(),
            judge_tokens_out_mean=self.judge_out.value(),
        )


# -- cells ------------------------------------------------------------------------------------


@dataclass
class CellTally:
    add: CallTally = field(default_factory=CallTally)
    search: CallTally = field(default_factory=CallTally)
    context: ContextTally = field(default_factory=ContextTally)
    llm: LLMTally = field(default_factory=LLMTally)

    def merge(self, other: CellTally) -> None:
        self.add.merge(other.add)
        self.search.merge(other.search)
        self.context.merge(other.context)
        self.llm.merge(other.llm)

    def efficiency(self) -> Efficiency:
        return Efficiency(
            add=self.add.stats(),
            search=self.search.stats(),
            context=self.context.stats(),
            llm=self.llm.stats(),
        )


@dataclass
class EfficiencyTally:
    """A job's figures, fed item by item: the questions' per category, the Adds' per dataset.
    A dataset's cell is its categories merged with its Adds, the job's every dataset merged."""

    categories: dict[str, dict[str, CellTally]] = field(default_factory=dict)
    adds: dict[str, CallTally] = field(default_factory=dict)

    def _cell(self, dataset_id: str, category_name: str) -> CellTally:
        return self.categories.setdefault(dataset_id, {}).setdefault(category_name, CellTally())

    def calls(
        self, dataset_id: str, category_name: str | None, attempts: Sequence[CallAttempt]
    ) -> None:
        """One work item's attempts: an Add's (`category_name` None) or a question's Search."""
        if category_name is None or is_add(attempts):
            self.adds.setdefault(dataset_id, CallTally()).add_item(attempts)
        else:
            self._cell(dataset_id, category_name).search.add_item(attempts)

    def answer(self, dataset_id: str, category_name: str, answer: AnswerUse) -> None:
        cell = self._cell(dataset_id, category_name)
        cell.context.add(answer)
        cell.llm.answered(answer)

    def judge(self, dataset_id: str, category_name: str, judge: JudgeUse) -> None:
        self._cell(dataset_id, category_name).llm.judged(judge)

    def efficiency(
        self, measured_under: MeasuredUnder, method: str = EFFICIENCY_METHOD
    ) -> JobEfficiency:
        overall = CellTally()
        datasets: dict[str, DatasetEfficiency] = {}
        for dataset_id in sorted(self.categories.keys() | self.adds.keys()):
            categories = self.categories.get(dataset_id, {})
            dataset = CellTally()
            for cell in categories.values():
                dataset.merge(cell)
            if dataset_id in self.adds:
                dataset.add.merge(self.adds[dataset_id])
            overall.merge(dataset)
            datasets[dataset_id] = DatasetEfficiency(
                overall=dataset.efficiency(),
                categories={
                    name: categories[name].efficiency().model_copy(update={"add": None})
                    for name in sorted(categories)
                },
            )
        return JobEfficiency(
            method=method,
            measured_under=measured_under,
            overall=overall.efficiency(),
            datasets=datasets,
        )
