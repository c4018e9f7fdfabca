"""The judge's runs, retries and majority vote (pure logic; the model call is a scripted fake)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from aml_evaluation.judging import judge, majority


def scripted(*replies: str) -> Callable[[], Awaitable[str]]:
    queue = list(replies)

    async def call() -> str:
        return queue.pop(0)

    return call


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (["CORRECT"], "CORRECT"),
        (["WRONG"], "WRONG"),
        (["CORRECT", "WRONG", "CORRECT"], "CORRECT"),
        (["WRONG", None, None], "WRONG"),
        (["CORRECT", "WRONG"], None),  # a tie is a judge failure, not a guess
        ([None, None, None], None),
        ([], None),
    ],
)
def test_majority(labels: list[str | None], expected: str | None) -> None:
    assert majority(labels) == expected  # type: ignore[arg-type]


async def test_unreadable_reply_is_retried_then_kept_as_failure() -> None:
    verdict = await judge(scripted("hmm", '{"label": "WRONG"}'), runs=1, retries=2)
    assert (verdict.label, verdict.labels, verdict.calls) == ("WRONG", ["WRONG"], 2)
    verdict = await judge(scripted("hmm", "no idea", "{"), runs=1, retries=2)
    assert (verdict.label, verdict.labels, verdict.calls) == (None, [None], 3)
    assert verdict.replies == ["hmm", "no idea", "{"]


async def test_three_runs_vote() -> None:
    replies = ('{"label": "CORRECT"}', "garbage", '{"label": "WRONG"}', '{"label": "CORRECT"}')
    verdict = await judge(scripted(*replies), runs=3, retries=1)
    assert verdict.labels == ["CORRECT", "WRONG", "CORRECT"]
    assert verdict.label == "CORRECT" and verdict.calls == 4


async def test_the_tokens_of_every_call_are_summed_retries_included() -> None:
    replies = [("hmm", 100, 3), ('{"label": "WRONG"}', 101, 7), ('{"label": "CORRECT"}', 90, 6)]

    async def call() -> tuple[str, int, int]:
        return replies.pop(0)

    verdict = await judge(call, runs=2, retries=1)
    assert (verdict.labels, verdict.calls) == (["WRONG", "CORRECT"], 3)
    assert (verdict.tokens_in, verdict.tokens_out) == (291, 16)
    # A call that reports no tokens (a bare text) counts none.
    assert (await judge(scripted('{"label": "WRONG"}'))).tokens_in == 0
