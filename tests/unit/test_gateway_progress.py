"""`current_stage`: the stage a job waits on (R-3.6); `stage_progress`:
every stage's figures from the job document's counters alone; `status_of`: the status with the
version's names, the answer model and the timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aml_contract.api.jobs import StageProgress
from aml_contract.api.vocabulary import STAGES
from aml_gateway.progress import current_stage, stage_progress, status_of
from aml_scheduler.watchdog import stuck_stage


def _job_at(
    state: str = "running", chunks: int = 10, questions: int = 10, **counts: tuple[int, int]
) -> dict[str, object]:
    """A planned job whose stages are all final (every item done) unless given as (done,
    failed)."""
    defaults = {"add": (chunks, 0), "search": (questions, 0), "answer": (questions, 0),
                "score": (questions, 0)}  # fmt: skip
    progress = {
        stage: {"done": done, "failed": failed}
        for stage, (done, failed) in {**defaults, **counts}.items()
    }
    return {"state": state, "totals": {"add": chunks, "questions": questions},
            "progress": progress}  # fmt: skip


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_finished_jobs_have_no_stage(state: str) -> None:
    assert current_stage(_job_at(state, add=(0, 0))) is None
    assert current_stage(_job_at(state)) is None


def test_a_job_not_planned_yet_is_at_add() -> None:
    assert current_stage({"state": "queued"}) == "add"


def test_add_in_progress() -> None:
    assert current_stage(_job_at(add=(9, 0), search=(5, 0))) == "add"


def test_failed_items_count_as_final() -> None:
    assert current_stage(_job_at(add=(7, 3), search=(4, 1))) == "search"
    assert current_stage(_job_at(questions=4, add=(0, 10), search=(4, 0), answer=(0, 0))) == (
        "answer"
    )


def test_earliest_unfinished_stage_wins() -> None:
    # Later stages may already move (pipelining); the earliest unfinished one is reported.
    job = _job_at(questions=4, search=(3, 0), answer=(2, 0), score=(1, 0))
    assert current_stage(job) == "search"
    assert current_stage(_job_at(score=(9, 0))) == "score"


def test_a_question_failed_in_search_waits_for_no_answer() -> None:
    """Three of four questions searched, one failed: once the three are answered the job is
    scoring, not still answering (the failed question is final and is never answered)."""
    job = _job_at(questions=4, search=(3, 1), answer=(3, 0), score=(1, 0))
    assert current_stage(job) == "score"
    failed_answer = _job_at(questions=4, search=(3, 1), answer=(2, 1), score=(2, 0))
    assert current_stage(failed_answer) == "aggregate"


def test_all_item_stages_final_is_aggregate() -> None:
    assert current_stage(_job_at()) == "aggregate"


def test_the_watchdog_reports_the_same_stage() -> None:
    """The stall diagnosis and the status share the rule (aml_pipeline.progress.waiting_stage)."""
    jobs = [
        _job_at(add=(9, 0)),
        _job_at(questions=4, search=(3, 0)),
        _job_at(questions=4, search=(3, 1), answer=(3, 0), score=(1, 0)),
        _job_at(),
    ]
    for job in jobs:
        assert stuck_stage(job)[0] == current_stage(job)
    assert stuck_stage(jobs[2])[1] == "1 of 3 scored"


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
    assert current_stage({"state": "running", **job}) == "answer"


def test_stage_progress_of_a_job_not_planned_or_counted_yet() -> None:
    stages = stage_progress({"state": "queued"})
    assert all(stages[s] == StageProgress(total=0, done=0, failed=0) for s in STAGES[:-1])
    assert current_stage({"state": "queued"}) == "add"
    completed = stage_progress({"state": "completed", "totals": {"add": 1, "questions": 1}})
    assert completed["aggregate"] == StageProgress(total=1, done=1, failed=0)


def _job(**fields: object) -> dict[str, object]:
    return {
        "_id": "j1",
        "team_id": "team-1",
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


# -- the platform's failures: not publishable, not charged (R-3.5, R-3.8) ----------------------

FINISHED = datetime(2027, 1, 1, 11, 0, tzinfo=UTC)
SPOILED = "3 questions failed by the platform (platform_error)"


def _gate(passed: bool) -> dict[str, object]:
    checks = [
        {"name": "mode_full", "passed": True, "reason": "mode is 'full'"},
        {"name": "spec_hash", "passed": passed, "reason": "spec hash 'x' differs"},
    ]
    return {"checks": checks, "passed": passed, "at": FINISHED}


def test_a_clean_completed_job_is_charged_and_publishable_once_gated() -> None:
    completed = _job(state="completed", finished_at=FINISHED, platform_failures=0)
    status = status_of(completed, VERSION, [], NOW)
    assert (status.state, status.state_summary) == ("completed", "completed")
    assert (status.platform_failures, status.charged) == (0, True)
    # Not known before the gate ran.
    assert (status.publishable, status.not_publishable_reason) == (None, None)
    passed = status_of(completed | {"gate": _gate(True)}, VERSION, [], NOW)
    assert (passed.publishable, passed.not_publishable_reason) == (True, None)
    failed = status_of(completed | {"gate": _gate(False)}, VERSION, [], NOW)
    assert failed.publishable is False and failed.charged is True
    assert failed.not_publishable_reason == (
        "the publication gate failed: spec_hash: spec hash 'x' differs"
    )
    # Completed before the count was recorded: read as none.
    older = status_of(_job(state="completed", finished_at=FINISHED), VERSION, [], NOW)
    assert (older.state_summary, older.charged, older.platform_failures) == ("completed", True, 0)


def test_a_job_completed_with_platform_failures_is_not_publishable_nor_charged() -> None:
    spoiled = _job(state="completed", finished_at=FINISHED, platform_failures=3,
                   platform_failure_reason=SPOILED)  # fmt: skip
    for job in (spoiled, spoiled | {"gate": _gate(False)}):
        status = status_of(job, VERSION, [], NOW)
        assert status.state == "completed"  # its results stay visible
        assert status.platform_failures == 3
        assert status.publishable is False and status.charged is False
        assert status.not_publishable_reason == (
            f"{SPOILED}: not publishable; this run is not charged to your quota"
        )
        assert status.state_summary == f"completed — not publishable: {SPOILED}; not charged"


def test_a_job_processed_by_two_builds_is_not_publishable_nor_charged() -> None:
    """A rolling upgrade replaced the services mid-job: the platform's doing, not the team's."""
    mixed = _job(state="completed", finished_at=FINISHED, code_hash="a" * 64,
                 code_hashes={"a" * 64: True, "b" * 64: True})  # fmt: skip
    status = status_of(mixed, VERSION, [], NOW)
    assert status.code_hashes == ["a" * 64, "b" * 64]
    assert status.publishable is False and status.charged is False
    assert status.not_publishable_reason is not None
    assert status.not_publishable_reason.startswith("mixed code: ")
    assert status.not_publishable_reason.endswith("not charged to your quota")
    assert "(mixed code); not charged" in status.state_summary
    # One build throughout: as any completed job.
    single = status_of(mixed | {"code_hashes": {"a" * 64: True}}, VERSION, [], NOW)
    assert (single.charged, single.state_summary) == (True, "completed")


def test_failed_jobs_are_not_publishable_and_charged_when_the_participant_failed() -> None:
    theirs = _job(state="failed", finished_at=FINISHED, failure_kind="contract_error",
                  failure="add: the response is not JSON")  # fmt: skip
    status = status_of(theirs, VERSION, [], NOW)
    assert (status.state_summary, status.charged, status.publishable) == ("failed", True, False)
    assert status.not_publishable_reason == "the job failed: add: the response is not JSON"
    ours = theirs | {"failure_kind": "platform_error", "failure": "dataset files missing"}
    status = status_of(ours, VERSION, [], NOW)
    assert status.charged is False
    assert status.state_summary == "failed — by the platform (platform_error); not charged"
    assert status.not_publishable_reason == (
        "the job failed: dataset files missing; this run is not charged to your quota"
    )


def test_a_running_job_counts_until_it_ends() -> None:
    status = status_of(_job(), VERSION, [], NOW)
    assert (status.state_summary, status.charged, status.publishable) == ("running", True, None)


def test_a_pause_is_shown_in_words_with_its_start() -> None:
    """What the status, the job page and `aml team watch` say while an outage lasts."""
    from aml_devtools.team_cli import progress_lines
    from aml_gateway.progress import job_pause
    from aml_pipeline.outages import LanePause

    since = datetime(2026, 12, 5, 10, 1, 2, tzinfo=UTC).timestamp()
    common = {"since": since, "reason": "network error: ConnectError", "paused": True,
              "probe_at": since + 2, "interval": 2.0}  # fmt: skip
    participant = LanePause(key="ver-1", kind="participant", window=600, **common)
    llm = LanePause(key="llm", kind="llm", window=1800, **common)
    shown = [job_pause(participant), job_pause(llm)]
    assert [p.message for p in shown] == [
        "paused: participant unreachable since 2026-12-05 10:01:02 UTC",
        "paused: answer model unreachable since 2026-12-05 10:01:02 UTC",
    ]
    assert shown[0].since == datetime(2026, 12, 5, 10, 1, 2, tzinfo=UTC)
    assert shown[1].window_seconds == 1800
    status = {"job_id": "j1", "state": "running", "stage": "search", "elapsed_seconds": 61.0,
              "stages": {}, "paused": [p.model_dump(mode="json") for p in shown]}  # fmt: skip
    lines = progress_lines(status)
    assert lines[1:] == [p.message for p in shown]
    # In the status: what stops work now, not an outage resumed (its probe answered).
    resumed = llm.model_copy(update={"paused": False})
    status_now = status_of(_job(), VERSION, [], NOW, [participant, resumed])
    assert [p.kind for p in status_now.paused] == ["participant"]
