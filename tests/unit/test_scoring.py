"""Scoring primitives pinned on hand-checked examples (tokens after normalising and stemming
are written out in the comments)."""

from __future__ import annotations

import hashlib
from importlib.resources import files

import pytest

from aml_evaluation.prompts import format_memories, load_prompt, template_fields
from aml_evaluation.scoring import F1_VERSION, normalize_answer, parse_judge_label, token_f1


def test_f1_version_is_pinned() -> None:
    assert F1_VERSION == "f1-locomo-v1"


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Quick, Brown Fox!", "quick brown fox"),
        ("Ann and Bob", "ann bob"),  # LoCoMo also drops "and"
        ("an android and a banana", "android banana"),  # whole words only
        ("1,000", "1000"),  # commas go before tokenising
        ("  spaced\tout \n text ", "spaced out text"),
        ("?!...", ""),
        ("Caroline\u2019s", "caroline\u2019s"),  # only ASCII punctuation goes, as in the reference
        # Word boundaries are the `regex` module's, as in the reference; `re` would remove
        # the "a" of a decomposed "á", "the" before a zero-width joiner, and keep "the²".
        ("a\u0301 b", "a\u0301 b"),
        ("the\u200dend", "the\u200dend"),
        ("the\u00b2 x", "\u00b2 x"),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Paris", "Paris", 1.0),
        ("the cat and the dog", "Cat, dog.", 1.0),
        # [carolin, went, to, pari] vs [pari]: P 1/4, R 1
        ("Caroline went to Paris", "Paris", 0.4),
        ("London", "Paris", 0.0),
        # empty cases: no shared token is 0.0 in the reference, also when both are empty
        ("", "", 0.0),
        ("", "Paris", 0.0),
        ("Paris", "", 0.0),
        # punctuation-only normalises to nothing
        ("?!", "...", 0.0),
        ("...", "Paris", 0.0),
        # numeric gold given as a number (LoCoMo JSON has some) compares by its digits
        ("2022", 2022, 1.0),
        ("2022", "2022", 1.0),
        # [in, 2022] vs [2022]: P 1/2, R 1
        ("In 2022.", 2022, 2 / 3),
        # [1000, peopl] vs [1000]
        ("1,000 people", "1000", 2 / 3),
        # stemming: run/run, and [she, like, paint] vs [paint]
        ("running", "runs", 1.0),
        ("She likes painting", "paints", 0.5),
        # multiset overlap: a set-based F1 would give 0.5 here
        ("cat cat", "cat cat", 1.0),
        # [cat, cat] vs [cat]: shared 1, P 1/2, R 1
        ("cat cat", "cat", 2 / 3),
        # [cat, cat, dog] vs [cat, dog, dog]: shared cat 1 + dog 1, P = R = 2/3
        ("cat cat dog", "cat dog dog", 2 / 3),
    ],
)
def test_token_f1(prediction: str, gold: str | int, expected: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(expected)


def test_token_f1_is_symmetric_in_value() -> None:
    assert token_f1("Caroline went to Paris", "Paris") == token_f1(
        "Paris", "Caroline went to Paris"
    )


@pytest.mark.parametrize(
    ("text", "label"),
    [
        # well-formed
        ('{"label": "CORRECT"}', "CORRECT"),
        ('{"label":"WRONG"}', "WRONG"),
        ('{"label": " correct "}', "CORRECT"),
        # chatty
        ('The dates match. {"label": "CORRECT"} Hope this helps!', "CORRECT"),
        ('Not correct at all, so: {"label": "WRONG"}', "WRONG"),  # the JSON wins over prose
        ('I use {braces} loosely. {"label": "WRONG"}', "WRONG"),
        ('{"reasoning": "same city", "label": "CORRECT"}', "CORRECT"),
        ('{"result": {"label": "WRONG"}}', "WRONG"),
        ('{"label": "CORRECT"} {"label": "WRONG"}', "CORRECT"),  # the first valid one
        # fenced
        ('```json\n{\n  "label": "WRONG"\n}\n```', "WRONG"),
        ('Verdict:\n```\n{"label": "CORRECT"}\n```\n', "CORRECT"),
        ('Sure!\n```json\n{"reasoning": "wrong year?", "label": "CORRECT"}\n```', "CORRECT"),
        ('```json\n{"label": "WRONG"}', "WRONG"),  # fence never closed
        ("```JSON\n{'label': 'CORRECT'}\n```", "CORRECT"),  # not JSON; one bare word
        # truncated
        ('{"label": "CORRECT"', "CORRECT"),  # no JSON, one bare word
        ('{"label": "CORR', None),
        ('{"label": ', None),
        ('{"label": "WRONG"', "WRONG"),
        ('```json\n{"label": "WRO', None),
        ('{"reasoning": "the year is wro', None),
        # bare words
        ("CORRECT", "CORRECT"),
        ("Label: wrong.", "WRONG"),
        ("The answer is correct. CORRECT", "CORRECT"),
        ('{"verdict": "CORRECT"}', "CORRECT"),  # no valid label field, one bare word
        ('{"label": ["CORRECT"]}', "CORRECT"),  # same: not a string label, one bare word
        # garbage and ambiguity: a judge failure, never WRONG by default
        ("", None),
        ("I cannot grade this.", None),
        ("```json\n```", None),
        ("{}", None),
        ("null", None),
        ('{"label": null}', None),
        ("\x00\ufffd}{", None),
        ('{"label": "MAYBE"}', None),
        ('{"label": true}', None),
        ("INCORRECT", None),  # not the word CORRECT
        ("The answer is not correct", None),
        ("It isn't wrong", None),
        ("CORRECT or WRONG", None),
        ("The answer is correct. Label: WRONG", None),
    ],
)
def test_parse_judge_label(text: str, label: str | None) -> None:
    assert parse_judge_label(text) == label


def _prompt_file_bytes(name: str) -> bytes:
    return (files("aml_evaluation") / "prompts" / f"{name}.txt").read_bytes()


def test_load_answer_prompt() -> None:
    prompt = load_prompt("answer_v1")
    assert (prompt.name, prompt.version) == ("answer_v1", "v1")
    assert prompt.fields == {"memories", "question"}
    assert prompt.sha256 == hashlib.sha256(_prompt_file_bytes("answer_v1")).hexdigest()
    rendered = prompt.text.format(memories="- [2023-05-08] went hiking", question="Where?")
    assert "- [2023-05-08] went hiking" in rendered
    assert "Where?" in rendered


def test_load_judge_prompt_asks_for_json_label() -> None:
    prompt = load_prompt("judge_v1")
    assert (prompt.name, prompt.version) == ("judge_v1", "v1")
    assert prompt.fields == {"question", "gold_answer", "generated_answer"}
    assert len(prompt.sha256) == 64
    # Values containing braces must not be taken for placeholders.
    rendered = prompt.text.format(
        question="When?", gold_answer="7 May 2023", generated_answer='{"label": "CORRECT"}'
    )
    assert '{"label": "CORRECT"}' in rendered
    assert '{"label": "WRONG"}' in rendered
    assert "generous" in rendered


def test_abstention_judge_prompt_has_no_gold_to_fill_in() -> None:
    """The judge of a question the conversation does not answer is told so, gets no gold
    answer (never LoCoMo's trap) and is asked for the same JSON label."""
    prompt = load_prompt("judge_abstention_v1")
    assert (prompt.name, prompt.version) == ("judge_abstention_v1", "v1")
    assert prompt.fields == {"question", "generated_answer"}
    assert prompt.sha256 == hashlib.sha256(_prompt_file_bytes("judge_abstention_v1")).hexdigest()
    rendered = prompt.text.format(question="What did Caroline realize?", generated_answer="Hi")
    assert "cannot be answered from the conversations" in rendered
    assert "Gold answer: none" in rendered
    assert '{"label": "CORRECT"}' in rendered and '{"label": "WRONG"}' in rendered
    assert "What did Caroline realize?" in rendered and "Generated answer: Hi" in rendered


def test_load_prompt_is_stable_and_distinct() -> None:
    assert load_prompt("judge_v1") == load_prompt("judge_v1")
    assert load_prompt("judge_v1").sha256 != load_prompt("answer_v1").sha256


@pytest.mark.parametrize("name", ["answer", "../answer_v1", "answer_v1.txt", "Answer_v1", ""])
def test_load_prompt_rejects_malformed_names(name: str) -> None:
    with pytest.raises(ValueError):
        load_prompt(name)


def test_load_prompt_unknown_name() -> None:
    with pytest.raises(FileNotFoundError):
        load_prompt("nonexistent_v9")


def test_template_fields() -> None:
    assert template_fields("{a} {{literal}} {b}") == {"a", "b"}


def test_format_memories_keeps_order_and_dates() -> None:
    rendered = format_memories(
        [
            ("Went hiking in the Alps", "2023-05-08T13:56:00.000Z"),
            ("Likes tea", None),
            ("Adopted a cat", ""),
        ]
    )
    assert rendered == (
        "- [2023-05-08T13:56:00.000Z] Went hiking in the Alps\n- Likes tea\n- Adopted a cat"
    )


def test_format_memories_multiline_and_empty() -> None:
    assert format_memories([("def f():\n    return 1", None)]) == "- def f():\n      return 1"
    assert format_memories([]) == "(none)"
