"""`aml rescore` on the real LoCoMo file with a published harness's predictions and judge labels
(Zep's LoCoMo grades, shared/datasets/zep-locomo-grades): the per-category counts of the field
(282 / 321 / 96 / 841 scored, 446 adversarial reported apart), Zep's published figures
recomputed exactly, and every number recomputed again from the per-question rows."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from aml_evaluation.datasets import load_dataset
from aml_evaluation.scoring import bleu1, token_f1
from aml_runtime.cli import main

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
    predictions, labels = zep_files
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = main(
        [
            "rescore",
            "--dataset", "locomo",
            "--datasets-root", str(datasets_root),
            "--predictions", str(predictions),
            "--judge-labels", str(labels),
            "--rows", str(rows_path),
            "--json", str(results_path),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "F1 variant f1-locomo-v1" in printed and "Overall" in printed
    results = json.loads(results_path.read_text())
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
    assert row["f1"] == pytest.approx(token_f1(answer, first.answer))
    assert row["bleu1"] == pytest.approx(bleu1(answer, first.answer))


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
    ):
        bad.write_text(content)
        args = ["rescore", "--dataset", "locomo", "--datasets-root", str(datasets_root),
                "--predictions", str(bad), "--judge-labels", str(labels)]  # fmt: skip
        assert main(args) == 2
        assert message in capsys.readouterr().err
