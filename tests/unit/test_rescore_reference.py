"""`aml rescore --f1-variant f1-locomo-category-v1` equals LoCoMo's reference procedure per
question, on a generated predictions file covering all 1,986 questions of locomo10.

The reference is re-implemented here from its documented rules (snap-research/LoCoMo
`task_eval/evaluation.py`), independently of the production scorers: it reads the raw LoCoMo
JSON, not the platform's loader, and uses only nltk's Porter stemmer and the `regex` module, as
the reference does.
- token F1: remove commas, lowercase, drop ASCII punctuation, replace the words a/an/the/and by
  a space (word boundaries of the `regex` module), split on whitespace, Porter-stem; multiset
  overlap; no shared token gives 0;
- category 1: prediction and gold split on ","; mean over gold parts of the best F1 of any
  prediction part; categories 2 and 4: F1 against the gold; category 3: F1 against the gold up
  to its first ";"; category 5: 1 if the lowercased prediction contains "no information
  available" or "not mentioned", else 0.
BLEU-1 is checked the same way against nltk called directly as the mem0 harness calls it.
"""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import regex  # type: ignore[import-untyped]
from nltk import word_tokenize  # type: ignore[import-untyped]
from nltk.stem import PorterStemmer  # type: ignore[import-untyped]
from nltk.translate.bleu_score import (  # type: ignore[import-untyped]
    SmoothingFunction,
    sentence_bleu,
)

from aml_devtools.cli import main

LOCOMO = Path("locomo") / "locomo10.json"
_STEMMER = PorterStemmer()
_PUNCTUATION = set(string.punctuation)
_ABSTENTIONS = [
    "Not mentioned in the conversation.",
    "No information available",
    "That was NOT MENTIONED anywhere.",
    "I don't know.",  # an abstention the reference does not count
    "no information is available",  # nor this one
]
# Articles between characters where `re` and `regex` draw word boundaries differently
# (zero-width joiner, combining mark, superscript digit), so that the two engines leave a
# different number of tokens.
_UNICODE_EDGES = ["x\u200dthe\u200dy", "\u0301a\u0301", "\u00b2the\u00b2", "\u20ddand\u20dd"]


def _reference_tokens(text: str) -> list[str]:
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = regex.sub(r"\b(a|an|the|and)\b", " ", text)
    return [_STEMMER.stem(word) for word in text.split()]


def _reference_f1(prediction: str, gold: str) -> float:
    predicted, expected = _reference_tokens(prediction), _reference_tokens(gold)
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def _reference_score(qa: dict[str, Any], prediction: str) -> float:
    category = qa["category"]
    if category == 5:
        lowered = prediction.lower()
        return float("no information available" in lowered or "not mentioned" in lowered)
    answer = str(qa["answer"])
    if category == 3:
        answer = answer.split(";")[0].strip()
    if category in (2, 3, 4):
        return _reference_f1(prediction, answer)
    assert category == 1
    parts = [part.strip() for part in prediction.split(",")]
    golds = [gold.strip() for gold in answer.split(",")]
    best = [max(_reference_f1(part, gold) for part in parts) for gold in golds]
    return sum(best) / len(best)


def _reference_bleu1(prediction: str, gold: str) -> float:
    hypothesis, reference = word_tokenize(prediction.lower()), word_tokenize(gold.lower())
    if not hypothesis or not reference:
        return 0.0
    smoothing = SmoothingFunction().method1
    return float(sentence_bleu([reference], hypothesis, (1, 0, 0, 0), smoothing))


def _prediction(rng: random.Random, qa: dict[str, Any], others: list[str]) -> str:
    """One made-up answer, drawn so that every rule meets cases where it matters: comma-
    separated parts in another order or incomplete, the text after a ";", abstentions worded
    in and out of the reference's two phrases, the adversarial trap, several sentences, and
    articles next to characters where word boundaries depend on the regex engine."""
    gold = str(qa.get("answer", qa.get("adversarial_answer", "")))
    parts = [part.strip() for part in gold.split(",")]
    other = rng.choice(others)
    return [
        gold,
        ", ".join(reversed(parts)),
        parts[0],
        f"{gold}, {other}",
        other,
        rng.choice(_ABSTENTIONS),
        str(qa.get("adversarial_answer", gold.upper() + "!")),
        " ; ".join(reversed(gold.split(";"))),
        "",
        f"{gold}. Then, {other}; it was not mentioned again. Done.",
        f"Probably {parts[-1].lower()}, maybe {other}",
        f"{rng.choice(_UNICODE_EDGES)} {gold} {rng.choice(_UNICODE_EDGES)}",
    ][rng.randrange(12)]


@pytest.fixture(scope="module")
def locomo(datasets_root: Path) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = json.loads((datasets_root / LOCOMO).read_bytes())
    return samples


def test_rescoring_equals_the_reference_procedure_per_question(
    datasets_root: Path, locomo: list[dict[str, Any]], tmp_path: Path
) -> None:
    rng = random.Random(20240612)
    others = [str(qa.get("answer", qa.get("adversarial_answer"))) for s in locomo for qa in s["qa"]]
    expected: dict[str, tuple[dict[str, Any], str]] = {}
    predictions = tmp_path / "predictions.jsonl"
    with predictions.open("w", encoding="utf-8") as out:
        for sample in locomo:
            for index, qa in enumerate(sample["qa"]):
                qid = f"{sample['sample_id']}:q{index:04d}"
                answer = _prediction(rng, qa, others)
                expected[qid] = (qa, answer)
                out.write(json.dumps({"question_id": qid, "answer": answer}) + "\n")
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = main(
        [
            "rescore", "--dataset", "locomo", "--datasets-root", str(datasets_root),
            "--predictions", str(predictions), "--f1-variant", "f1-locomo-category-v1",
            "--rows", str(rows_path), "--json", str(results_path),
        ]
    )  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert len(rows) == len(expected) == 1986

    differs_from_plain: Counter[int] = Counter()
    for row in rows:
        qa, answer = expected[row["question_id"]]
        assert row["category"] == qa["category"]
        assert row["failure"] is None and not row["judged"]
        reference = _reference_score(qa, answer)
        assert row["f1"] == pytest.approx(reference, abs=1e-9), (row["question_id"], answer)
        # What the plain variant gave before: F1 against the whole gold, or the trap.
        plain = _reference_f1(answer, str(qa.get("answer", qa.get("adversarial_answer"))))
        differs_from_plain[qa["category"]] += abs(plain - reference) > 1e-9
        if "answer" in qa:
            assert row["bleu1"] == pytest.approx(
                _reference_bleu1(answer, str(qa["answer"])), abs=1e-9
            )
        else:
            assert row["bleu1"] is None  # no reference answer to compare with
    # The generated file exercises each rule that differs from plain token F1.
    assert differs_from_plain[1] > 50 and differs_from_plain[3] > 2
    assert differs_from_plain[5] > 100
    assert differs_from_plain[2] == differs_from_plain[4] == 0

    results = json.loads(results_path.read_text())
    assert results["datasets"]["locomo"]["f1_variant"] == "f1-locomo-category-v1"
    assert results["provenance"]["f1_variant"] == "f1-locomo-category-v1"
    assert results["provenance"]["f1_variant_declared"] == "f1-locomo-category-v1"
    adversarial = results["datasets"]["locomo"]["categories"]["adversarial"]
    adversarial_rows = [row["f1"] for row in rows if row["category"] == 5]
    assert adversarial["f1_mean"] == pytest.approx(sum(adversarial_rows) / len(adversarial_rows))


@pytest.mark.parametrize("variant", [None, "f1-locomo-v1"])
def test_zeps_published_predictions_score_as_the_reference_does(
    datasets_root: Path, locomo: list[dict[str, Any]], tmp_path: Path, variant: str | None
) -> None:
    """A real harness's answers (Zep's, long and multi-sentence): the k-th row of a sample is
    its k-th question outside category 5 (the grades file's documented order). By default the
    manifest's variant, LoCoMo's per-category procedure; `--f1-variant f1-locomo-v1` gives
    plain token F1 against the whole gold instead."""
    grades = json.loads(
        (datasets_root / "zep-locomo-grades" / "zep_locomo_grades.json").read_bytes()
    )
    expected: dict[str, tuple[dict[str, Any], str]] = {}
    predictions = tmp_path / "zep.jsonl"
    with predictions.open("w", encoding="utf-8") as out:
        for number, sample in enumerate(locomo):
            indexed = [(i, qa) for i, qa in enumerate(sample["qa"]) if qa["category"] != 5]
            rows = grades[f"locomo_experiment_user_{number}"]
            for (index, qa), row in zip(indexed, rows, strict=True):
                assert row["question"] == qa["question"]
                qid = f"{sample['sample_id']}:q{index:04d}"
                expected[qid] = (qa, row["answer"])
                out.write(json.dumps({"question_id": qid, "answer": row["answer"]}) + "\n")
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    chosen = ["--f1-variant", variant] if variant else []
    code = main(
        [
            "rescore", "--dataset", "locomo", "--datasets-root", str(datasets_root),
            "--predictions", str(predictions), "--rows", str(rows_path),
            "--json", str(results_path), *chosen,
        ]
    )  # fmt: skip
    assert code == 0
    used = variant or "f1-locomo-category-v1"
    results = json.loads(results_path.read_text())
    assert results["datasets"]["locomo"]["f1_variant"] == results["provenance"]["f1_variant"]
    assert results["provenance"]["f1_variant"] == used
    scored = [json.loads(line) for line in rows_path.read_text().splitlines()]
    scored = [row for row in scored if row["failure"] is None]
    assert len(scored) == len(expected) == 1540
    differs = 0
    for row in scored:
        qa, answer = expected[row["question_id"]]
        reference = _reference_score(qa, answer)
        plain = _reference_f1(answer, str(qa["answer"]))
        assert row["f1"] == pytest.approx(reference if variant is None else plain, abs=1e-9)
        differs += abs(reference - plain) > 1e-9
        assert row["bleu1"] == pytest.approx(_reference_bleu1(answer, str(qa["answer"])), abs=1e-9)
    assert differs == 242  # 232 multi-hop and 10 open-domain answers score differently
