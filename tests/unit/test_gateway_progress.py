"""`current_stage`: the earliest stage of a job that has not finished (R-3.6); `stage_progress`:
every stage's figures from the job document's counters alone; `status_of`: the status with the
version's names, the answer model and the timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aml_contract.api.jobs import StageProgress
from aml_contract.api.vocabulary import STAGES, Stage
from aml_gateway.progress import current_stage, stage_progress, status_of


def _stages(**progress: tuple[int, int, int]) -> dict[Stage, StageProgress]:
    """Every stage finished (10 of 10, aggregate 1 of 1) unless given as (total, done, failed)."""
    stages: dict[Stage, StageProgress] = {}
    for stage in STAGES:
        default = (1, 0, 0) if stage == "aggregate" else (10, 10, 0)
        total, done, failed = progress.get(stage, default)
        stages[stage] = StageProgress(total=total, done=done, failed=failed)
    return stages


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_finished_jobs_have_no_stage(state: str) -> None:
    assert current_stage(state, _stages(add=(10, 0, 0))) is None
    assert current_stage(state, _stages()) is None


def test_fresh_job_is_at_add() -> None:
    empty = {stage: StageProgress(total=0, done=0, failed=0) for stage in STAGES}
    assert current_stage("queued", empty) == "add"
    assert current_stage("running", _stages(add=(10, 0, 0), search=(5, 0, 0))) == "add"


def test_add_in_progress() -> None:
    assert current_stage("running", _stages(add=(10, 9, 0))) == "add"


def test_failed_items_count_as_finished() -> None:
    assert current_stage("running", _stages(add=(10, 7, 3), search=(4, 1, 0))) == "search"
    all_failed = _stages(add=(10, 0, 10), search=(4, 0, 4), answer=(4, 0, 0))
    assert current_stage("running", all_failed) == "answer"


def test_earliest_unfinished_stage_wins() -> None:
    # Later stages may already move (pipelining); the earliest unfinished one is reported.
    stages = _stages(add=(10, 10, 0), search=(4, 3, 0), answer=(4, 2, 0), score=(4, 1, 0))
    assert current_stage("running", stages) == "search"
    assert current_stage("running", _stages(score=(10, 9, 0))) == "score"


def test_stage_with_unknown_total_is_current() -> None:
    # A total of 0 means the stage has not been planned yet, not that it is done.
    assert current_stage("running", _stages(search=(0, 0, 0))) == "search"


def test_all_item_stages_done_is_aggregate() -> None:
    assert current_stage("running", _stages()) == "aggregate"


def test_aggregate_done_but_state_not_yet_completed() -> None:
    assert current_stage("running", _stages(aggregate=(1, 1, 0))) == "aggregate"


def test_stage_progress_from_the_job_counters() -> None:
    job = {
        "state": "running",
        "totals": {"add": 2, "questions": 4},
        "progress": {
            "add": {"done": 2},
            "search": {"done": 3, "failed": 1},
            "answer": {"done": 1},
            "questions_final": 1,
        },
    }
    stages = stage_progress(job)
    assert stages["add"] == StageProgress(total=2, done=2, failed=0)
    assert stages["search"] == StageProgress(total=4, done=3, failed=1)
    assert stages["answer"] == StageProgress(total=4, done=1, failed=0)
    assert stages["score"] == StageProgress(total=4, done=0, failed=0)
    assert stages["aggregate"] == StageProgress(total=1, done=0, failed=0)
    assert current_stage("running", stages) == "answer"


def test_stage_progress_of_a_job_not_planned_or_counted_yet() -> None:
    stages = stage_progress({"state": "queued"})
    assert all(stages[s] == StageProgress(total=0, done=0, failed=0) for s in STAGES[:-1])
    assert current_stage("queued", stages) == "add"
    completed = stage_progress({"state": "completed", "totals": {"add": 1, "questions": 1}})
    assert completed["aggregate"] == StageProgress(total=1, done=1, failed=0)


def _job(**fields: object) -> dict[str, object]:
    return {
        "_id": "j1",
        "state": "running",
        "mode": "full",
        "track": "textual",
        "version_id": "ver-1",
        "run_label": "full-1",
        "datasets": ["locomo_refined"],
        "created_at": datetime(2027, 1, 1, 8, 0, tzinfo=UTC),
        "spec": {"answer_model": "gpt-4o-mini", "top_k": "100"},
        **fields,
    }


VERSION = {
    "_id": "ver-1",
    "system_name": "recall-graph",
    "version_label": "2.0",
    "board": "academic",
}
NOW = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def test_status_names_the_version_and_the_answer_model() -> None:
    status = status_of(_job(), VERSION, [], NOW)
    assert (status.system_name, status.version_label, status.board) == (
        "recall-graph",
        "2.0",
        "academic",
    )
    assert status.answer_model == "gpt-4o-mini"
    # A version no longer there, a job not planned yet: nothing to show, no failure.
    bare = status_of(_job(spec={}), None, [], NOW)
    assert (bare.system_name, bare.version_label, bare.board, bare.answer_model) == (
        None,
        None,
        None,
        None,
    )


def test_status_timings() -> None:
    started = datetime(2027, 1, 1, 9, 0, tzinfo=UTC)
    queued = status_of(_job(state="queued"), VERSION, [], NOW)
    assert (queued.started_at, queued.elapsed_seconds, queued.duration_seconds) == (None, 0.0, None)
    running = status_of(_job(started_at=started), VERSION, [], NOW)
    # Running: elapsed up to now, no duration yet.
    assert (running.elapsed_seconds, running.duration_seconds) == (3 * 3600.0, None)
    finished = started + timedelta(hours=2, minutes=5, seconds=7)
    done = status_of(
        _job(state="completed", started_at=started, finished_at=finished), VERSION, [], NOW
    )
    assert done.finished_at == finished
    assert done.duration_seconds == done.elapsed_seconds == 7507.0
