"""LoCoMo's per-category F1 (`f1-locomo-category-v1`), the abstention rule and how every scorer
treats a question without a gold answer, each rule on hand-checked cases. Stemmed tokens are
written out in the comments; LoCoMo categories: 1 multi-hop, 2 temporal, 3 open-domain,
4 single-hop, 5 adversarial."""

from __future__ import annotations

import pytest

from aml_evaluation.judging import judge_prompt_for
from aml_evaluation.prompts import load_prompt
from aml_evaluation.scoring import (
    ABSTENTION_VERSION,
    F1Scorer,
    abstention_score,
    bleu1,
    f1_locomo,
    f1_locomo_category,
    f1_set,
    multi_answer_f1,
    open_answer_scores,
    token_f1,
)


def test_abstention_version_is_pinned() -> None:
    assert ABSTENTION_VERSION == "abstention-phrase-v1"


# --- category 5 / abstention: the lowercased answer contains one of the two phrases ---------


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("Not mentioned in the memories.", 1.0),  # the platform's own answer prompt wording
        ("Not mentioned in the conversation", 1.0),
        ("NO INFORMATION AVAILABLE", 1.0),
        ("Sorry, there is no information available on that.", 1.0),
        ("Her realisation is not mentioned anywhere.", 1.0),  # anywhere in the text
        ("I don't know", 0.0),  # other wordings of an abstention do not count
        ("Not in the conversation", 0.0),
        ("no information is available", 0.0),  # the phrase must be contiguous
        ("not  mentioned", 0.0),  # ... with one space
        ("Self-care is important", 0.0),  # the adversarial trap
        ("", 0.0),
    ],
)
def test_abstention_score(prediction: str, expected: float) -> None:
    assert abstention_score(prediction) == expected


# --- category 1 / multi-hop: split on ",", mean over gold parts of the best prediction part --


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        # gold parts [pari], [london]: each has an exact prediction part
        ("London, Paris", "Paris, London", 1.0),
        # [pari] -> 1, [london] -> 0; mean 1/2 (plain F1 over all tokens gives 2/3)
        ("Paris", "Paris, London", 0.5),
        # gold "paris": best of [pari, rome] (P 1/2, R 1 -> 2/3) and [london] (0) is 2/3;
        # gold "london": 1. Mean 5/6
        ("Paris and Rome, London", "Paris, London", 5 / 6),
        # gold "pottery": [she, like, potteri] -> 1/2; gold "painting": [paint, hike] -> 2/3
        ("She likes pottery, painting and hiking", "pottery, painting", (1 / 2 + 2 / 3) / 2),
        # a gold without a comma takes the best part, not the whole prediction (plain: 2/3)
        ("Paris, London", "Paris", 1.0),
        # an empty prediction part matches nothing; an empty gold part counts as a zero
        ("Paris,", "Paris", 1.0),
        ("Paris", "Paris,", 0.5),
        ("", "Paris, London", 0.0),
    ],
)
def test_multi_answer_f1(prediction: str, gold: str, expected: float) -> None:
    assert multi_answer_f1(prediction, gold) == pytest.approx(expected)
    assert f1_locomo_category(prediction, gold, 1) == pytest.approx(expected)


def test_multi_answer_f1_differs_from_plain_f1_where_the_split_matters() -> None:
    assert f1_locomo("Paris", "Paris, London", 1) == pytest.approx(2 / 3)
    assert f1_locomo_category("Paris", "Paris, London", 1) == pytest.approx(0.5)


# --- category 3 / open-domain: the gold up to its first ";" -----------------------------------


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        # gold "Likely yes" -> [like, ye]: exact
        ("likely yes", "Likely yes; she mentioned wanting to", 1.0),
        # the text after ";" is not part of the gold: [she, mention, want, to] vs [like, ye]
        ("she mentioned wanting to", "Likely yes; she mentioned wanting to", 0.0),
        # no ";": the whole gold
        ("likely yes", "Likely yes", 1.0),
        # nothing before the ";": an empty gold, which scores 0
        ("anything", "; something", 0.0),
    ],
)
def test_open_domain_keeps_the_gold_up_to_the_first_semicolon(
    prediction: str, gold: str, expected: float
) -> None:
    assert f1_locomo_category(prediction, gold, 3) == pytest.approx(expected)


def test_open_domain_rule_is_category_3_only() -> None:
    # [she, mention, want, to] vs all six gold tokens: P 1, R 4/6 -> 0.8 in the others
    gold = "Likely yes; she mentioned wanting to"
    for category in (2, 4):
        assert f1_locomo_category("she mentioned wanting to", gold, category) == pytest.approx(0.8)


# --- categories 2 and 4: plain token F1 against the whole gold -------------------------------


@pytest.mark.parametrize("category", [2, 4])
@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("Paris", "Paris, London"),  # no comma split outside category 1
        ("7 May 2023", "7 May 2023"),
        ("In 2022.", "2022"),
        ("She likes painting", "paints"),
    ],
)
def test_temporal_and_single_hop_are_plain_token_f1(
    category: int, prediction: str, gold: str
) -> None:
    assert f1_locomo_category(prediction, gold, category) == token_f1(prediction, gold)


# --- category 5 in the per-category variant: decided by category, whatever the gold -----------


@pytest.mark.parametrize("gold", [None, "No"])
def test_adversarial_is_scored_by_abstention_whatever_the_gold(gold: str | None) -> None:
    # "No" is the supported answer of two locomo10 adversarial items; LoCoMo's code still
    # applies the abstention rule to them, so this variant does too.
    assert f1_locomo_category("No", gold, 5) == 0.0
    assert f1_locomo_category("That is not mentioned.", gold, 5) == 1.0


def test_per_category_variant_refuses_what_it_cannot_score() -> None:
    with pytest.raises(ValueError, match="not 6"):
        f1_locomo_category("x", "x", 6)
    with pytest.raises(ValueError, match="only category 5"):
        f1_locomo_category("x", None, 2)


# --- a question without a gold (abstention) in the other variants, BLEU-1 and the judge ------


@pytest.mark.parametrize("variant", [f1_locomo, f1_set])
def test_other_variants_score_abstention_questions_by_the_abstention_rule(
    variant: F1Scorer,
) -> None:
    assert variant("Not mentioned in the memories.", None, 5) == 1.0
    # Repeating LoCoMo's trap earns nothing: it is not the gold.
    assert variant("self-care is important", None, 5) == 0.0
    # An adversarial item that has a supported gold is compared with it like any question.
    assert variant("No", "No", 5) == 1.0


def test_open_answer_scores() -> None:
    abstention = open_answer_scores("Not mentioned in the memories.", None, 5, "f1-locomo-v1")
    assert abstention == (1.0, None)  # no reference answer, no BLEU-1
    trap = open_answer_scores("self-care is important", None, 5, "f1-locomo-category-v1")
    assert trap == (0.0, None)
    answered = open_answer_scores("Paris", "Paris, London", 1, "f1-locomo-category-v1")
    assert answered.f1 == pytest.approx(0.5)
    assert answered.bleu1 == pytest.approx(bleu1("Paris", "Paris, London"))
    with pytest.raises(KeyError):
        open_answer_scores("Paris", "Paris", 4, "f1-unknown")


def test_judge_prompt_for_a_question_without_a_gold_is_the_abstention_prompt() -> None:
    judge_v1, abstention = load_prompt("judge_v1"), load_prompt("judge_abstention_v1")
    prompt, text = judge_prompt_for(
        "What did Caroline realize after her charity race?", None, "Self-care", judge_v1, abstention
    )
    assert prompt == abstention
    assert "cannot be answered from the conversations" in text
    assert "Generated answer: Self-care" in text
    prompt, text = judge_prompt_for("Where?", "Paris", "Paris", judge_v1, abstention)
    assert prompt == judge_v1
    assert "Gold answer: Paris" in text
