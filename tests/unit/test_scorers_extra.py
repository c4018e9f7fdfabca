"""Set-based token F1 (mem0 harness), BLEU-1 and multiple-choice parsing, pinned on
hand-checked examples. Token lists after tokenising are written out in the comments. (LoCoMo's
per-category F1 and the abstention rule: test_locomo_category_f1.py.)"""

from __future__ import annotations

import math

import pytest

from aml_evaluation.scoring import (
    BLEU_VERSION,
    F1_CATEGORY_VERSION,
    F1_SET_VERSION,
    F1_VARIANTS,
    F1_VERSION,
    MC_VERSION,
    bleu1,
    bleu_tokens,
    f1_locomo,
    f1_locomo_category,
    f1_memgallery,
    f1_set,
    parse_choice,
    score_choice,
    token_f1_set,
)


def test_versions_are_pinned() -> None:
    assert F1_SET_VERSION == "f1-set-v1"
    assert F1_CATEGORY_VERSION == "f1-locomo-category-v1"
    assert BLEU_VERSION == "bleu1-nltk-word_tokenize-v2"
    assert MC_VERSION == "mc-parse-v1"


def test_f1_variants_registry() -> None:
    assert dict(F1_VARIANTS) == {
        "f1-locomo-v1": f1_locomo,
        "f1-set-v1": f1_set,
        "f1-locomo-category-v1": f1_locomo_category,
        "f1-memgallery-v1": f1_memgallery,
    }
    assert F1_VARIANTS[F1_VERSION] is f1_locomo
    with pytest.raises(TypeError):
        F1_VARIANTS["other"] = f1_locomo  # type: ignore[index]


# --- set-based token F1 (mem0 `simple_tokenize`: lowercase, ".,!?" -> space, split, set) ---


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Paris", "Paris", 1.0),
        ("London", "Paris", 0.0),  # no overlap
        # empty cases: an empty token set on either side is 0.0, also both empty
        ("", "", 0.0),
        ("", "Paris", 0.0),
        ("Paris", "", 0.0),
        ("   ", "Paris", 0.0),
        # punctuation-only: ".,!?" become spaces, so these have no tokens at all
        ("?!", "...", 0.0),
        ("...", "Paris", 0.0),
        ("Paris!", "paris.", 1.0),
        # ...but other punctuation stays in the token: {paris;} vs {paris}
        ("Paris;", "Paris", 0.0),
        ("--", "--", 1.0),
        # numeric: int gold compares by its digits
        ("2022", 2022, 1.0),
        # {2022} vs {in, 2022}: P 1, R 1/2 -> 2/3
        ("2022", "in 2022", 2 / 3),
        # {in, 2022} vs {2022}: P 1/2, R 1 -> 2/3
        ("In 2022.", 2022, 2 / 3),
        # the comma splits: {1, 000, people} vs {1000}, nothing shared
        ("1,000 people", "1000", 0.0),
        # {caroline, went, to, paris} vs {paris}: P 1/4, R 1 -> 0.4
        ("Caroline went to Paris", "Paris", 0.4),
        # no stemming: {running} vs {runs}
        ("running", "runs", 0.0),
        # articles and "and" are kept: {the, cat, and, dog} vs {cat, dog}: P 2/4, R 1 -> 2/3
        ("the cat and the dog", "Cat, dog.", 2 / 3),
        # sets: duplicates collapse. {cat} vs {cat}
        ("cat cat", "cat", 1.0),
        # {cat, dog} vs {cat, dog}
        ("cat cat dog", "cat dog dog", 1.0),
        # {cat, dog} vs {cat, bird}: P 1/2, R 1/2 -> 1/2
        ("cat dog dog", "bird cat", 0.5),
        # apostrophes stay: ASCII ' and typographic \u2019 differ
        ("Caroline's", "caroline's", 1.0),
        ("Caroline\u2019s", "Caroline's", 0.0),
    ],
)
def test_token_f1_set(prediction: str, gold: str | int, expected: float) -> None:
    assert token_f1_set(prediction, gold) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "gold", "locomo", "set_based"),
    [
        ("cat cat", "cat", 2 / 3, 1.0),  # multiset vs set
        ("running", "runs", 1.0, 0.0),  # stemming
        ("1,000 people", "1000", 2 / 3, 0.0),  # comma removed vs comma as separator
        ("the cat", "cat", 1.0, 2 / 3),  # articles dropped vs kept
    ],
)
def test_f1_variants_differ_where_documented(
    prediction: str, gold: str, locomo: float, set_based: float
) -> None:
    # Category 4 (single-hop): the per-category variant is plain token F1 there.
    assert F1_VARIANTS["f1-locomo-v1"](prediction, gold, 4) == pytest.approx(locomo)
    assert F1_VARIANTS["f1-locomo-category-v1"](prediction, gold, 4) == pytest.approx(locomo)
    assert F1_VARIANTS["f1-set-v1"](prediction, gold, 4) == pytest.approx(set_based)


# --- BLEU-1: brevity_penalty * clipped unigram precision; BP = 1 if c > r else exp(1 - r/c),
# c and r the prediction and gold token counts (lowercased, nltk.word_tokenize tokens) ---


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Paris", "Paris", 1.0),
        ("London", "Paris", 0.0),  # no overlap
        # empty: 0.0 without calling nltk
        ("", "", 0.0),
        ("", "Paris", 0.0),
        ("Paris", "", 0.0),
        ("   ", "Paris", 0.0),
        # punctuation-only: [?, !] vs [...], nothing shared
        ("?!", "...", 0.0),
        # [...] vs [...]: punctuation is a token like any other
        ("...", "...", 1.0),
        # [paris, .] vs [paris]: p 1/2, c 2 > r 1
        ("Paris.", "Paris", 0.5),
        # [paris] vs [paris, .]: p 1, BP exp(1 - 2/1)
        ("Paris", "Paris.", math.exp(-1)),
        # numeric
        ("2022", 2022, 1.0),
        # [2022] vs [in, 2022]: p 1, BP exp(1 - 2/1)
        ("2022", "in 2022", math.exp(-1)),
        # [in, 2022] vs [2022]: p 1/2, BP 1
        ("in 2022", "2022", 0.5),
        # [in, 2022, .] vs [2022]: p 1/3, BP 1
        ("In 2022.", 2022, 1 / 3),
        # [1,000, people] vs [1000, people]: the comma stays inside the number; p 1/2, c = r
        ("1,000 people", "1000 people", 0.5),
        # clipping: [cat, cat] vs [cat]: clipped matches 1, p 1/2, BP 1
        ("cat cat", "cat", 0.5),
        # [cat] vs [cat, cat]: p 1, BP exp(1 - 2/1)
        ("cat", "cat cat", math.exp(-1)),
        # [caroline, went, to, paris] vs [paris]: p 1/4, BP 1
        ("Caroline went to Paris", "Paris", 0.25),
        # order does not matter for unigrams: [7, may, 2023] vs [may, 7, ",", 2023]:
        # p 3/3, c 3 < r 4, BP exp(1 - 4/3)
        ("7 May 2023", "May 7, 2023", math.exp(-1 / 3)),
        # punkt splits the sentences, so each final period is its own token:
        # [i, went, ., then, left, .] vs [i, went, then, left]: p 4/6, c 6 > r 4
        ("I went. Then left.", "i went then left", 4 / 6),
        # [researched, agencies, ., this, happened, .] vs [adoption, agencies]: p 1/6, BP 1
        # (the Treebank rules alone keep "agencies." whole, which matches nothing)
        ("Researched agencies. This happened.", "adoption agencies", 1 / 6),
    ],
)
def test_bleu1(prediction: str, gold: str | int, expected: float) -> None:
    score = bleu1(prediction, gold)
    assert type(score) is float
    assert score == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Caroline researched adoption agencies. This event occurred on May 25, 2023.",
         ["caroline", "researched", "adoption", "agencies", ".", "this", "event", "occurred",
          "on", "may", "25", ",", "2023", "."]),
        # punkt knows abbreviations: "mr." is not a sentence end
        ("Mr. Smith went home.", ["mr.", "smith", "went", "home", "."]),
        ("Paris", ["paris"]),
        ("", []),
    ],
)  # fmt: skip
def test_bleu_tokens_are_nltk_word_tokenize(text: str, tokens: list[str]) -> None:
    assert bleu_tokens(text) == tokens


@pytest.mark.filterwarnings("error")
def test_bleu1_returns_float_on_nltk_integer_zero() -> None:
    # nltk returns the int 0 when no unigram matches; the scorer hands back a float
    assert type(bleu1("London", "Paris")) is float
    assert type(bleu1("?!", "...")) is float


# --- multiple choice ---

CITIES = ["London", "Paris", "Berlin", "Madrid"]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # letter labels
        ("B", 1),
        ("b", 1),
        ("(B)", 1),
        ("( b )", 1),
        ("[C]", 2),
        ("B.", 1),
        ("B)", 1),
        ("B:", 1),
        ("  D  ", 3),
        ("**B**", 1),
        ("`B`", 1),
        ("Answer: B", 1),
        ("answer: (b)", 1),
        ("Answer:B", 1),
        ("The answer is B.", 1),
        ("The correct answer is (D) Madrid", 3),
        ("Option - C", 2),
        # label followed by text
        ("B. Paris", 1),
        ("(B) because she moved there in 2022", 1),
        ("A) London", 0),
        # option text, normalised
        ("Paris", 1),
        ("paris.", 1),
        ("  PARIS!  ", 1),
        ("The Paris", 1),  # articles are ignored, as in normalize_answer
        ("Answer: Paris", 1),
        # unreadable
        ("", None),
        ("   ", None),
        ("?", None),
        ("E", None),  # past the last option
        ("E) Rome", None),
        ("(B", None),
        ("AB", None),
        ("B Paris", None),  # a letter needs a delimiter when text follows
        ("I think B", None),
        ("Paris or London", None),
        ("Rome", None),
        # contradictory readings
        ("B) London", None),
        ("Answer: A. Paris", None),
    ],
)
def test_parse_choice(answer: str, expected: int | None) -> None:
    assert parse_choice(answer, CITIES) == expected


def test_parse_choice_article_a_is_not_a_label() -> None:
    options = ["A cat", "A dog"]
    assert parse_choice("A dog", options) == 1  # "A" then a space: the article
    assert parse_choice("a cat", options) == 0
    assert parse_choice("A", options) == 0
    assert parse_choice("B.", options) == 1


def test_parse_choice_ambiguous_option_texts() -> None:
    options = ["cat", "The cat", "dog"]  # the first two normalise to "cat"
    assert parse_choice("cat", options) is None
    assert parse_choice("C", options) == 2
    assert parse_choice("dog", options) == 2


def test_parse_choice_options_that_are_letters() -> None:
    options = ["B", "C"]
    assert parse_choice("B", options) is None  # label B = 1, text B = 0
    assert parse_choice("C", options) == 1  # label C is past the last option, text C = 1
    assert parse_choice("(A) C", options) is None  # label 0, text after it 1
    assert parse_choice("(A) B", options) == 0  # label 0, text after it 0: they agree
    # "a" is an article to normalize_answer, so an option "A" has no text to match
    assert parse_choice("A", ["B", "A"]) == 0


def test_parse_choice_options_starting_like_labels_or_prefixes() -> None:
    presidents = ["A. Lincoln", "G. Washington"]
    assert parse_choice("G. Washington", presidents) == 1  # G is past the last option
    assert parse_choice("A. Lincoln", presidents) == 0  # label A and text agree
    phone = ["Answer the phone", "Ignore it"]
    assert parse_choice("Answer the phone", phone) == 0  # no colon or "is": not a prefix
    years = ["2021", "2022"]
    assert parse_choice("2022", years) == 1
    assert parse_choice("In 2022", years) is None  # only an option's exact text counts


def test_parse_choice_no_options() -> None:
    assert parse_choice("A", []) is None


@pytest.mark.parametrize(
    ("answer", "chosen", "correct"),
    [("B", 1, True), ("Paris", 1, True), ("A", 0, False), ("London", 0, False),
     ("maybe", None, None)],
)  # fmt: skip
def test_score_choice(answer: str, chosen: int | None, correct: bool | None) -> None:
    assert score_choice(answer, CITIES, "Paris") == (chosen, correct)


@pytest.mark.parametrize("gold", ["Rome", "paris", None])
def test_score_choice_rejects_a_gold_that_is_no_option(gold: str | None) -> None:
    with pytest.raises(ValueError, match="none of the options"):
        score_choice("B", CITIES, gold)
