"""`aml team watch`, `results` and `errors` on a job the platform spoiled: never a plain
"completed", but the API's words (`state_summary`: not publishable, why, not charged); a clean
job reads as before. The gateway is a stub answering what the real one answers."""

from __future__ import annotations

import io
from typing import Any

from aml_devtools.team_cli import Api, print_results, watch
from aml_evaluation.aggregate import QuestionOutcome, aggregate

SPOILED = "completed — not publishable: 1 question failed by the platform (platform_error); "
SPOILED += "not charged"


class StubApi(Api):
    def __init__(self, status: dict[str, Any]) -> None:  # no HTTP client: `call` is stubbed
        self.base_url, self._key = "http://gw.invalid", "aml_key"
        outcomes = [
            QuestionOutcome(dataset_id="synthetic", category_name="single-hop", scored=True,
                            judge_label="CORRECT", f1=1.0),
            QuestionOutcome(dataset_id="synthetic", category_name="single-hop", scored=False,
                            failure_kind="platform_error"),
        ]  # fmt: skip
        results = aggregate("j1", "completed", outcomes, {}).model_dump(mode="json")
        self.answers = {"/v1/jobs/j1": status, "/v1/jobs/j1/results": results}
        self.calls: list[str] = []

    def call(self, method: str, path: str, **_: Any) -> Any:
        self.calls.append(path)
        return self.answers[path]


def status(**changes: Any) -> dict[str, Any]:
    stages = {s: {"total": 2, "done": 2, "failed": 0} for s in ("search", "answer", "score")}
    return {
        "job_id": "j1",
        "state": "completed",
        "stage": None,
        "elapsed_seconds": 65.0,
        "stages": {"add": {"total": 1, "done": 1, "failed": 0}, **stages},
        "errors": [],
        **changes,
    }


def test_a_spoiled_job_is_not_shown_as_a_plain_completed() -> None:
    error = {"stage": "answer", "kind": "platform_error", "item": "j1/synthetic/q1",
             "reason": "the answer model did not answer"}  # fmt: skip
    api = StubApi(status(state_summary=SPOILED, errors=[error]))
    out = io.StringIO()
    assert watch(api, "j1", out, sleep=lambda _: None) == 0
    text = out.getvalue()
    assert f"job j1 {SPOILED}  elapsed 1:05" in text
    assert "[answer/platform_error] j1/synthetic/q1" in text
    # `aml team results`: the reason heads the table.
    out = io.StringIO()
    print_results(StubApi(status(state_summary=SPOILED)), "j1", out)
    assert out.getvalue().startswith(f"job j1 {SPOILED}\n")
    assert "Overall" in out.getvalue()


def test_a_clean_job_reads_as_before() -> None:
    for answer in (status(state_summary="completed"), status()):  # an older gateway: no summary
        out = io.StringIO()
        assert watch(StubApi(answer), "j1", out, sleep=lambda _: None) == 0
        assert "job j1 completed  elapsed 1:05" in out.getvalue()
        out = io.StringIO()
        print_results(StubApi(answer), "j1", out)
        assert not out.getvalue().startswith("job j1")
