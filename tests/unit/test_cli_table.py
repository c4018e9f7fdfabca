from aml_contract.api.results import JobResults
from aml_devtools.tables import render_results
from aml_evaluation.aggregate import QuestionOutcome, aggregate


def test_results_table_lists_every_cell_with_counts() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="synthetic", category_name="single-hop", scored=True,
                        judge_label="CORRECT", f1=1.0),
        QuestionOutcome(dataset_id="synthetic", category_name="single-hop", scored=True,
                        judge_label="WRONG", f1=0.0),
        QuestionOutcome(dataset_id="synthetic", category_name="adversarial", scored=False),
    ]  # fmt: skip
    results: JobResults = aggregate("j1", "completed", outcomes, {"synthetic": ["adversarial"]})
    table = render_results(results.model_dump(mode="json")).splitlines()
    rows = {line.split()[1] if not line.startswith("Overall") else "Overall": line.split()
            for line in table[2:] if line.startswith(("synthetic", "Overall"))}  # fmt: skip
    assert rows["single-hop"][-6:] == ["2", "2", "0", "50.0", "50.0", "-"]
    assert rows["adversarial"][-6:] == ["1", "0", "1", "-", "-", "-"]
    assert rows["Overall"][-6:] == ["2", "2", "0", "50.0", "50.0", "-"]
    assert table[-2].startswith("* reported apart")
    assert table[-1] == "failed, by kind: failed 1"


def test_categories_in_numeric_order_with_their_numbers() -> None:
    names = ["single-hop", "adversarial", "multi-hop", "temporal", "open-domain"]
    outcomes = [
        QuestionOutcome(dataset_id="locomo", category_name=name, scored=True,
                        judge_label="CORRECT", f1=1.0)
        for name in names
    ]  # fmt: skip
    results = aggregate("j1", "completed", outcomes, {"locomo": ["adversarial"]})
    numbers = {"locomo": {"multi-hop": 1, "temporal": 2, "open-domain": 3, "single-hop": 4,
                          "adversarial": 5}}  # fmt: skip
    table = render_results(results.model_dump(mode="json"), numbers).splitlines()
    labels = [line[16:32].strip() for line in table if line.startswith("locomo")]
    assert labels == [
        "1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop", "5 adversarial *",
        "(dataset)",
    ]  # fmt: skip


def test_unjudged_questions_are_noted_not_failed() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="locomo", category_name="temporal", scored=True,
                        judged=False, f1=0.5, bleu1=0.5),
    ]  # fmt: skip
    results = aggregate("j1", "completed", outcomes, {})
    table = render_results(results.model_dump(mode="json"), {"locomo": {"temporal": 2}})
    row = next(line for line in table.splitlines() if "2 temporal" in line).split()
    assert row[-6:] == ["1", "1", "0", "-", "50.0", "50.0"]
    assert "J is over judged questions only: not computed for 1 scored question(s)" in table


def test_multiple_choice_adds_an_option_accuracy_column_and_the_track_heads_the_table() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="pm", category_name="recall", scored=True, multiple_choice=True,
                        choice_correct=correct, f1=None)
        for correct in (True, True, False, True)
    ]  # fmt: skip
    results = aggregate("j1", "completed", outcomes, {}).model_dump(mode="json")
    table = render_results(results | {"track": "textual"}).splitlines()
    assert table[0] == "track textual: compare only with results of the same track"
    assert table[1].split()[-1] == "MC"
    row = next(line for line in table if line.startswith("pm") and "recall" in line).split()
    assert row[-4:] == ["-", "-", "-", "75.0"]
    assert any(line.startswith("MC is option accuracy") for line in table)
    # Without multiple choice, no MC column and no note.
    plain = aggregate(
        "j2",
        "completed",
        [QuestionOutcome(dataset_id="s", category_name="c", scored=True, judge_label="CORRECT")],
        {},
    )
    assert "MC" not in render_results(plain.model_dump(mode="json"))


def test_a_dataset_scored_by_f1_alone_is_named_with_f1_as_its_headline() -> None:
    results = aggregate(
        "j1",
        "completed",
        [QuestionOutcome(dataset_id="gallery", category_name="c", scored=True, judged=False,
                         f1=0.5)],
        {},
    ).model_dump(mode="json")  # fmt: skip
    results["datasets"]["gallery"]["overall"]["headline"] = "f1_mean"
    table = render_results(results)
    assert "scored by token F1 alone (F1 is the headline): gallery" in table
    judged = aggregate(
        "j2",
        "completed",
        [QuestionOutcome(dataset_id="s", category_name="c", scored=True, judge_label="CORRECT")],
        {},
    )
    assert "F1 is the headline" not in render_results(judged.model_dump(mode="json"))


def test_a_streaming_dataset_lists_its_points_under_its_overall() -> None:
    # Two questions asked at two points each (right at the second point only) plus one asked
    # once, after the whole conversation (in the dataset's overall, in no point row).
    outcomes = [
        QuestionOutcome(dataset_id="stream", category_name="c", scored=True, point_index=index,
                        judge_label=label, f1=1.0 if label == "CORRECT" else 0.0)
        for _ in range(2)
        for index, label in ((1, "WRONG"), (2, "CORRECT"))
    ] + [QuestionOutcome(dataset_id="stream", category_name="c", scored=True,
                         judge_label="CORRECT", f1=1.0)]  # fmt: skip
    results = aggregate("j1", "completed", outcomes, {}).model_dump(mode="json")
    # Listed in the points' order whatever order the document holds them in.
    results["datasets"]["stream"]["points"] = dict(
        reversed(results["datasets"]["stream"]["points"].items())
    )
    table = render_results(results).splitlines()
    labels = [line[16:32].strip() for line in table if line.startswith("stream")]
    assert labels == ["c", "(dataset)", "(point 1)", "(point 2)"]
    rows = {line[16:32].strip(): line.split() for line in table if line.startswith("stream")}
    assert rows["(dataset)"][-6:] == ["5", "5", "0", "60.0", "60.0", "-"]
    assert rows["(point 1)"][-6:] == ["2", "2", "0", "0.0", "0.0", "-"]
    assert rows["(point 2)"][-6:] == ["2", "2", "0", "100.0", "100.0", "-"]


def test_failed_questions_are_listed_by_kind_under_the_table() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="s", category_name="c", scored=True, judge_label="CORRECT"),
        # Replied without a verdict: a judge failure, never WRONG.
        QuestionOutcome(dataset_id="s", category_name="c", scored=True, judge_labels=[None]),
        QuestionOutcome(dataset_id="s", category_name="c", scored=True, judge_labels=[None]),
        # In a category reported apart: still listed.
        QuestionOutcome(dataset_id="s", category_name="apart", scored=False,
                        failure_kind="participant_outage"),
    ]  # fmt: skip
    results = aggregate("j1", "completed", outcomes, {"s": ["apart"]}).model_dump(mode="json")
    table = render_results(results).splitlines()
    assert "failed, by kind: judge_failure 2, participant_outage 1" in table
    assert any(line.startswith("judge_failure: the judge model's reply held no") for line in table)
    clean = aggregate("j2", "completed", outcomes[:1], {}).model_dump(mode="json")
    assert not any("failed, by kind" in line for line in render_results(clean).splitlines())
