"""Which candidates the answer model sees (R-6.1, rule context-v1 in aml_evaluation.context)."""

from __future__ import annotations

from aml_evaluation.context import estimate_tokens, estimated, fit_candidates
from aml_evaluation.prompts import Memory


async def by_length(text: str) -> int:
    """A counter whose numbers are easy to check by hand: one token per character."""
    return len(text)


async def test_keeps_the_ranked_prefix_that_fits() -> None:
    candidates = [
        {"id": "a", "content": "x" * 40, "created_at": "2023-05-08"},
        {"id": "b", "content": "y" * 40},
        {"id": "c", "content": "z" * 5},
    ]
    # Lines "- [2023-05-08] xxx…" (15 + 40 = 55) and "- yyy…" (2 + 40 = 42): 97 fits; the
    # short third one would fit too but is never pulled ahead of rank.
    fitted = await fit_candidates(candidates, 97, by_length)
    assert fitted.memories == [Memory("x" * 40, "2023-05-08"), Memory("y" * 40, None)]
    assert (fitted.tokens, fitted.candidates_returned) == (97, 3)
    fitted = await fit_candidates(candidates, 96, by_length)
    assert fitted.memories == [Memory("x" * 40, "2023-05-08")] and fitted.tokens == 55


async def test_first_candidate_is_kept_even_when_too_long() -> None:
    fitted = await fit_candidates([{"content": "x" * 500}], 10, by_length)
    assert fitted.memories == [Memory("x" * 500, None)] and fitted.tokens == 502


async def test_content_parts_use_their_text() -> None:
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    fitted = await fit_candidates([{"content": parts}], 100, by_length)
    assert fitted.memories == [Memory("hello world", None)] and fitted.images_withheld == 0


async def test_no_candidates() -> None:
    fitted = await fit_candidates([], 100, by_length)
    assert (fitted.memories, fitted.tokens, fitted.candidates_returned) == ([], 0, 0)


async def test_the_estimate_rounds_utf8_bytes_up_by_thirds() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("abcd") == 2
    assert estimate_tokens("猫") == 1  # three UTF-8 bytes
    assert estimate_tokens("Zoë") == 2  # four bytes
    assert await estimated("x" * 30) == 10
