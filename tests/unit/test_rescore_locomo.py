"""`aml rescore` on the real LoCoMo file with a published harness's predictions and judge labels
(Zep's LoCoMo grades, shared/datasets/zep-locomo-grades): the per-category counts of the field
(282 / 321 / 96 / 841 scored, 446 adversarial reported apart), Zep's published figures
recomputed exactly, and every number recomputed again from the per-question rows."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import nltk  # type: ignore[import-untyped]
import pytest

from aml_devtools.cli import main
from aml_evaluation.punkt import MODEL_ID as PUNKT_MODEL_ID
from aml_evaluation.registry import bundle_hash, load_dataset, manifest_path, read_manifest
from aml_evaluation.scoring import bleu1, f1_locomo_category
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.settings import EvaluationSettings

ZEP = Path("zep-locomo-grades") / "zep_locomo_grades.json"


@pytest.fixture(scope="module")
def zep_files(datasets_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Zep's rows mapped onto AML question ids: the k-th row of a sample is the k-th
    non-adversarial question of that sample (checked by question text below)."""
    grades = json.loads((datasets_root / ZEP).read_text(encoding="utf-8"))
    dataset = load_dataset("locomo", datasets_root)
    by_sample: dict[str, list[Any]] = defaultdict(list)
    for question in dataset.questions:
        if question.category != 5:
            by_sample[question.conversation_id].append(question)
    samples = list(dict.fromkeys(q.conversation_id for q in dataset.questions))
    folder = tmp_path_factory.mktemp("rescore")
    predictions, labels = folder / "predictions.jsonl", folder / "labels.jsonl"
    with predictions.open("w") as p, labels.open("w") as lab:
        for index, sample in enumerate(samples):
            rows = grades[f"locomo_experiment_user_{index}"]
            assert len(rows) == len(by_sample[sample])
            for row, question in zip(rows, by_sample[sample], strict=True):
                assert row["question"] == question.question
                p.write(json.dumps({"question_id": question.question_id, "answer": row["answer"]}))
                p.write("\n")
                label = "CORRECT" if row["grade"] else "WRONG"
                lab.write(json.dumps({"question_id": question.question_id, "label": label}) + "\n")
    return predictions, labels


def test_rescoring_zep_predictions_recomputes_the_published_figures(
    datasets_root: Path,
    zep_files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    predictions, labels_path = zep_files
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = main(
        [
            "rescore",
            "--dataset", "locomo",
            "--datasets-root", str(datasets_root),
            "--predictions", str(predictions),
            "--judge-labels", str(labels_path),
            "--rows", str(rows_path),
            "--json", str(results_path),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "F1 variant f1-locomo-category-v1" in printed and "Overall" in printed
    # The table lists the categories by their LoCoMo numbers, in that order.
    names = [line[16:32].strip() for line in printed.splitlines() if line.startswith("locomo")]
    assert names == [
        "1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop", "5 adversarial *",
        "(dataset)",
    ]  # fmt: skip
    results = json.loads(results_path.read_text())
    # What produced the numbers: every scorer version, nltk, evaluation spec, bundle and label
    # source.
    origin = results["provenance"]
    manifest = read_manifest(manifest_path("locomo", None))
    assert origin["bundle_hash"] == bundle_hash(manifest)
    assert origin["spec_hash"] == build_evaluation_spec(EvaluationSettings()).content_hash
    assert origin["f1_variant"] == origin["f1_variant_declared"] == "f1-locomo-category-v1"
    assert origin["scorers"] == {
        "f1": "f1-locomo-category-v1", "abstention": "abstention-phrase-v1",
        "bleu1": "bleu1-nltk-word_tokenize-v2", "bleu1_sentence_model": PUNKT_MODEL_ID,
        "multiple_choice": "mc-parse-v1", "judge_parser": "judge-parse-v1",
    }  # fmt: skip
    assert origin["nltk"] == nltk.__version__
    assert origin["categories"] == {"1": "multi-hop", "2": "temporal", "3": "open-domain",
                                    "4": "single-hop", "5": "adversarial"}  # fmt: skip
    assert origin["predictions_sha256"] == hashlib.sha256(predictions.read_bytes()).hexdigest()
    assert origin["judge"] == {
        "kind": "labels", "labels_file": str(labels_path),
        "labels_sha256": hashlib.sha256(labels_path.read_bytes()).hexdigest(),
        "questions_labelled": 1540, "model": None, "prompt": None, "abstention_prompt": None,
    }  # fmt: skip
    locomo = results["datasets"]["locomo"]
    categories = locomo["categories"]

    scored = {name: categories[name]["scored"] for name in categories}
    assert scored == {
        "multi-hop": 282, "temporal": 321, "open-domain": 96, "single-hop": 841, "adversarial": 0,
    }  # fmt: skip
    adversarial = categories["adversarial"]
    assert adversarial["questions"] == 446
    assert adversarial["failures"] == {"no_prediction": 446}
    assert locomo["excluded_from_overall"] == ["adversarial"]
    # Zep's published single run: 209/282, 212/321, 65/96, 671/841, overall 1157/1540.
    correct = {name: categories[name]["judge_correct"] for name in categories}
    assert correct == {
        "multi-hop": 209, "temporal": 212, "open-domain": 65, "single-hop": 671, "adversarial": 0,
    }  # fmt: skip
    assert (results["overall"]["questions"], results["overall"]["scored"]) == (1540, 1540)
    assert results["overall"]["judge_correct"] == 1157
    assert results["overall"]["judge_accuracy"] == pytest.approx(0.751299, abs=1e-6)

    # The per-category numbers recompute from the per-question rows.
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert len(rows) == 1986
    cells: dict[str, Counter[str]] = defaultdict(Counter)
    f1: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        cell = cells[row["category_name"]]
        cell["questions"] += 1
        if row["failure"] is None:
            cell["scored"] += 1
            cell["correct"] += row["judge_label"] == "CORRECT"
            f1[row["category_name"]].append(row["f1"])
    for name, cell in cells.items():
        metrics = categories[name]
        assert (metrics["questions"], metrics["scored"], metrics["judge_correct"]) == (
            cell["questions"], cell["scored"], cell["correct"],
        )  # fmt: skip
        if f1[name]:
            assert metrics["f1_mean"] == pytest.approx(sum(f1[name]) / len(f1[name]))

    # Spot check: the row's F1 and BLEU-1 are the scorers' own on that prediction.
    dataset = load_dataset("locomo", datasets_root)
    first = dataset.questions[0]
    answer = next(
        json.loads(line)["answer"]
        for line in predictions.read_text().splitlines()
        if json.loads(line)["question_id"] == first.question_id
    )
    row = next(r for r in rows if r["question_id"] == first.question_id)
    assert first.answer is not None
    assert row["f1"] == pytest.approx(f1_locomo_category(answer, first.answer, first.category))
    assert row["bleu1"] == pytest.approx(bleu1(answer, first.answer))


def _rescore(datasets_root: Path, predictions: Path, *extra: str) -> int:
    return main(
        ["rescore", "--dataset", "locomo", "--datasets-root", str(datasets_root),
         "--predictions", str(predictions), *extra]
    )  # fmt: skip


def test_bad_input_is_refused_with_its_line(
    datasets_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    for content, message in (
        ('{"question_id": "conv-26:q0000", "answer": "x"}\nnot json\n', "bad.jsonl:2: not JSON"),
        ('{"question_id": "conv-99:q0000", "answer": "x"}\n', "unknown question_id"),
        ('{"question_id": "conv-26:q0000", "answer": "x"}\n' * 2, "given twice"),
        ('{"question_id": "conv-26:q0000", "answer": null}\n', "answer must be a string"),
        (
            '{"question_id": "conv-26:q7", "answer": "x"}\n',
            "bad.jsonl:1: unknown question_id 'conv-26:q7'; ids are zero-padded to four "
            "digits: 'conv-26:q0007'",
        ),
    ):
        bad.write_text(content)
        assert _rescore(datasets_root, bad, "--judge-labels", str(labels)) == 2
        assert message in capsys.readouterr().err


def test_bad_labels_are_refused_with_their_line(
    datasets_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text('{"question_id": "conv-26:q0000", "answer": "x"}\n')
    labels = tmp_path / "labels.jsonl"
    for content, message in (
        # A question labelled twice is an error, never "the last one wins".
        (
            '{"question_id": "conv-26:q0000", "label": "CORRECT"}\n'
            '{"question_id": "conv-26:q0000", "label": "WRONG"}\n',
            "labels.jsonl:2: question_id 'conv-26:q0000' given twice",
        ),
        (
            '{"question_id": "conv-26:q0", "label": "CORRECT"}\n',
            "unknown question_id 'conv-26:q0'; ids are zero-padded to four digits: 'conv-26:q0000'",
        ),
        ('{"question_id": "conv-26:q0000", "label": "MAYBE"}\n', "CORRECT, WRONG or null"),
    ):
        labels.write_text(content)
        assert _rescore(datasets_root, predictions, "--judge-labels", str(labels)) == 2
        assert message in capsys.readouterr().err


def test_without_labels_f1_and_bleu_are_computed_and_the_judge_is_not(
    datasets_root: Path,
    zep_files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    predictions, _ = zep_files
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = _rescore(
        datasets_root, predictions, "--rows", str(rows_path), "--json", str(results_path)
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "judge: not computed" in printed
    assert "not computed for 1540 scored question(s)" in printed
    results = json.loads(results_path.read_text())
    assert results["provenance"]["judge"]["kind"] == "none"
    overall = results["overall"]
    # Not judged is not failed: all 1540 are scored by F1 and BLEU-1, none has a verdict.
    assert (overall["scored"], overall["failed"], overall["unjudged"]) == (1540, 0, 1540)
    assert overall["judge_accuracy"] is None and overall["accuracy"] is None
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    answered = [row for row in rows if row["failure"] is None]
    assert len(answered) == 1540
    assert all(not row["judged"] and row["judge_label"] is None for row in answered)
    assert all(isinstance(row["f1"], float) and isinstance(row["bleu1"], float) for row in answered)
    assert overall["f1_mean"] == pytest.approx(sum(r["f1"] for r in answered) / 1540)
    assert overall["bleu1_mean"] == pytest.approx(sum(r["bleu1"] for r in answered) / 1540)


def test_a_question_without_a_label_keeps_its_f1_and_bleu(
    datasets_root: Path, zep_files: tuple[Path, Path], tmp_path: Path
) -> None:
    predictions, labels_path = zep_files
    lines = labels_path.read_text().splitlines()
    dropped = {json.loads(line)["question_id"] for line in lines[:40]}
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(line + "\n" for line in lines[40:]))
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = _rescore(
        datasets_root, predictions, "--judge-labels", str(partial),
        "--rows", str(rows_path), "--json", str(results_path),
    )  # fmt: skip
    assert code == 0
    results = json.loads(results_path.read_text())
    overall = results["overall"]
    assert (overall["scored"], overall["failed"], overall["unjudged"]) == (1540, 0, 40)
    assert results["provenance"]["judge"]["questions_labelled"] == 1500
    rows = {row["question_id"]: row for row in map(json.loads, rows_path.read_text().splitlines())}
    for qid in dropped:
        assert not rows[qid]["judged"] and rows[qid]["judge_label"] is None
        assert rows[qid]["f1"] is not None and rows[qid]["bleu1"] is not None
    judged = [row for row in rows.values() if row["judged"]]
    assert len(judged) == 1500
    correct = sum(row["judge_label"] == "CORRECT" for row in judged)
    assert overall["judge_correct"] == correct
    assert overall["judge_accuracy"] == pytest.approx(correct / 1500)
    scored = [row for row in rows.values() if row["failure"] is None]
    assert overall["f1_mean"] == pytest.approx(sum(r["f1"] for r in scored) / 1540)
