"""What `aml rescore` says of the efficiency figures a job reports: its inputs carry no
participant calls, so latency and retrieved context are "not available", never invented; an LLM
judge asked by the rescoring has its tokens recorded per row and summarised (the judge is a
scripted fake)."""

from __future__ import annotations

import json
from pathlib import Path

from aml_devtools import rescore
from aml_evaluation.prompts import load_prompt
from aml_evaluation.registry import load_dataset


async def test_a_rescoring_reports_the_judges_tokens_and_nothing_it_cannot_know() -> None:
    dataset = load_dataset("synthetic", Path("/nonexistent"))
    items = list(rescore.asked_items(dataset))[:3]
    predictions = {key: "I do not know" for key in items}

    async def call(text: str) -> tuple[str, int, int]:
        return json.dumps({"label": "WRONG"}), len(text.split()), 4

    judge = rescore.llm_judge(
        call, load_prompt("judge_v1"), load_prompt("judge_abstention_v1"), 1, 0
    )
    rows = await rescore.score_questions(dataset, predictions, None, judge)
    judged = [row for row in rows if row.judge_tokens_in is not None]
    assert len(judged) == 3 and all(row.judge_tokens_out == 4 for row in judged)
    # Rows without an LLM verdict keep the rows file's earlier shape.
    assert "judge_tokens_in" not in rows[-1].model_dump()
    mean_in = sum(row.judge_tokens_in or 0 for row in judged) / 3
    assert rescore.efficiency_lines(rows) == [
        "efficiency: latency and retrieved context not available (a predictions file carries "
        "no participant calls or candidates)",
        f"judge model use: {mean_in:.1f} tokens in / 4.0 out per judged question "
        "(3 judged by the LLM here)",
    ]

    labelled = await rescore.score_questions(dataset, predictions, {}, None)
    assert rescore.efficiency_lines(labelled) == rescore.efficiency_lines([])[:1]
