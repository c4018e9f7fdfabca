from aml_contract.api import JobResults
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_runtime.cli import render_results


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
    assert table[-1].startswith("* reported apart")
