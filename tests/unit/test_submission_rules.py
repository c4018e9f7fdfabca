"""Quota and conflict rules of R-3.3 - R-3.5 at their boundaries (pure functions, fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from pydantic import ValidationError

from aml_contract.api.vocabulary import JobState
from aml_gateway.refusals import Conflict, Invalid, QuotaExceeded
from aml_gateway.submissions import (
    PriorRun,
    QuotaPolicy,
    Season,
    Submission,
    charged,
    check_dataset_tracks,
    check_submission,
)
from aml_pipeline.jobs import run_overdue
from aml_runtime.documents import FailureKind

T0 = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
POLICY = QuotaPolicy()


def run(n: int, **fields: Any) -> PriorRun:
    values: dict[str, Any] = {
        "job_id": f"j{n}",
        "version_id": "v1",
        "mode": "smoke",
        "track": "textual",
        "run_label": f"label-{n}",
        "state": "completed",
        "created_at": T0,
        "finished_at": T0 + HOUR,
        "passed": True,
    }
    values.update(fields)
    return PriorRun(**values)


def smoke(**fields: Any) -> Submission:
    return Submission(**{"mode": "smoke", "version_id": "v1", "track": "textual",
                         "run_label": "new", **fields})  # fmt: skip


def full(**fields: Any) -> Submission:
    return smoke(mode="full", **fields)


PASSED_SMOKE = run(0, created_at=T0 - 40 * DAY, finished_at=T0 - 40 * DAY + HOUR)


# -- labels and running jobs ---------------------------------------------------------------


def test_first_smoke_is_allowed() -> None:
    assert check_submission(smoke(), [], T0, POLICY) is None


def test_duplicate_run_label_is_409_whatever_the_mode_or_age() -> None:
    old = run(1, run_label="new", created_at=T0 - 400 * DAY, mode="full")
    refusal = check_submission(smoke(), [old], T0, POLICY)
    assert isinstance(refusal, Conflict) and "'new'" in refusal.reason


@pytest.mark.parametrize("state", ["queued", "running"])
def test_running_job_for_same_version_and_track_is_409(state: str) -> None:
    busy = run(1, state=state, finished_at=None, created_at=T0 - 5 * HOUR)
    refusal = check_submission(smoke(), [busy], T0, POLICY)
    assert isinstance(refusal, Conflict) and "j1" in refusal.reason


def test_running_job_of_another_version_or_track_is_no_conflict() -> None:
    busy = [
        run(1, state="running", version_id="v2", finished_at=None, created_at=T0 - 5 * HOUR),
        run(2, state="running", track="coding", finished_at=None, created_at=T0 - 5 * HOUR),
    ]
    assert check_submission(smoke(), busy, T0, POLICY) is None


# -- smoke: one per hour per key, 30 per track per season ----------------------------------


def test_second_smoke_within_the_hour_is_429_with_the_next_allowed_time() -> None:
    earlier = run(1, created_at=T0, finished_at=T0 + 10 * SECOND)
    refusal = check_submission(smoke(), [earlier], T0 + HOUR - SECOND, POLICY)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + HOUR
    # Judged at the time given, so the wait the caller is told is exact (here one second).
    assert refusal.judged_at == T0 + HOUR - SECOND
    assert check_submission(smoke(), [earlier], T0 + HOUR, POLICY) is None


def test_hourly_smoke_limit_spans_tracks() -> None:
    earlier = run(1, track="coding", created_at=T0)
    refusal = check_submission(smoke(), [earlier], T0 + 30 * 60 * SECOND, POLICY)
    assert isinstance(refusal, QuotaExceeded)


def test_smoke_failed_by_the_platform_consumes_no_quota() -> None:
    broken = run(1, state="failed", failure_kind="platform_error", created_at=T0)
    assert check_submission(smoke(), [broken], T0 + SECOND, POLICY) is None
    theirs = run(1, state="failed", failure_kind="participant_outage", created_at=T0)
    refusal = check_submission(smoke(), [theirs], T0 + SECOND, POLICY)
    assert isinstance(refusal, QuotaExceeded)


SEASONS = QuotaPolicy(
    seasons=[
        Season(name="S1", starts_at=T0 - 100 * DAY, ends_at=T0 + 100 * DAY),
        Season(name="S2", starts_at=T0 + 100 * DAY, ends_at=T0 + 300 * DAY),
    ]
)


def test_thirtieth_smoke_of_a_season_is_allowed_the_thirty_first_is_not() -> None:
    runs = [run(i, created_at=T0 - i * DAY) for i in range(1, 30)]
    assert check_submission(smoke(), runs, T0, SEASONS) is None
    runs.append(run(30, created_at=T0 - 30 * DAY))
    refusal = check_submission(smoke(), runs, T0, SEASONS)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + 100 * DAY  # when S2 starts
    assert "S1" in refusal.reason


def test_smoke_season_limit_is_per_track_and_restarts_with_the_season() -> None:
    runs = [run(i, created_at=T0 - i * DAY) for i in range(1, 31)]
    assert check_submission(smoke(track="coding"), runs, T0, SEASONS) is None
    assert check_submission(smoke(), runs, T0 + 100 * DAY, SEASONS) is None


def test_last_season_used_up_has_no_next_allowed_time() -> None:
    runs = [run(i, created_at=T0 + 100 * DAY + i * HOUR) for i in range(1, 31)]
    refusal = check_submission(smoke(), runs, T0 + 200 * DAY, SEASONS)
    assert isinstance(refusal, QuotaExceeded) and refusal.next_allowed_at is None


def test_outside_every_season_is_429_until_the_next_starts() -> None:
    gap = QuotaPolicy(
        seasons=[
            Season(name="S1", starts_at=T0 - 10 * DAY, ends_at=T0),
            Season(name="S2", starts_at=T0 + 5 * DAY, ends_at=T0 + 50 * DAY),
        ]
    )
    refusal = check_submission(smoke(), [], T0, gap)  # S1 ends at T0, exclusive
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + 5 * DAY
    assert check_submission(smoke(), [], T0 - SECOND, gap) is None
    assert check_submission(smoke(), [], T0 + 5 * DAY, gap) is None


def test_seasons_must_not_overlap_or_run_backwards() -> None:
    with pytest.raises(ValidationError, match="overlap"):
        QuotaPolicy(
            seasons=[
                Season(name="A", starts_at=T0, ends_at=T0 + 10 * DAY),
                Season(name="B", starts_at=T0 + 9 * DAY, ends_at=T0 + 20 * DAY),
            ]
        )
    with pytest.raises(ValidationError, match="after"):
        Season(name="A", starts_at=T0, ends_at=T0)


# -- full: a passed smoke, 2 per key per track per season, 30 days after completion -------


def test_full_needs_a_passed_smoke_of_the_same_version_and_track() -> None:
    refusal = check_submission(full(), [], T0, POLICY)
    assert isinstance(refusal, Invalid) and "smoke" in refusal.reason
    for other in (
        run(1, version_id="v2"),
        run(2, track="coding"),
        run(3, passed=False),
        run(4, state="failed", failure_kind="contract_error", passed=False),
    ):
        refusal = check_submission(full(), [other], T0 + 2 * HOUR, POLICY)
        assert isinstance(refusal, Invalid), other
    assert check_submission(full(), [PASSED_SMOKE], T0, POLICY) is None


def test_second_full_exactly_thirty_days_after_the_first_completed() -> None:
    first = run(1, mode="full", created_at=T0 - 35 * DAY, finished_at=T0 - 30 * DAY + SECOND)
    refusal = check_submission(full(), [PASSED_SMOKE, first], T0, POLICY)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + SECOND
    assert check_submission(full(), [PASSED_SMOKE, first], T0 + SECOND, POLICY) is None


def test_second_full_waits_for_the_first_to_complete() -> None:
    first = run(1, mode="full", version_id="v0", state="running", finished_at=None,
                created_at=T0 - 60 * DAY)  # fmt: skip
    refusal = check_submission(full(), [PASSED_SMOKE, first], T0, POLICY)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at is None and "not completed" in refusal.reason


def test_third_full_of_a_season_is_429_until_the_next_season() -> None:
    fulls = [
        run(1, mode="full", created_at=T0 - 90 * DAY, finished_at=T0 - 89 * DAY),
        run(2, mode="full", created_at=T0 - 50 * DAY, finished_at=T0 - 49 * DAY),
    ]
    refusal = check_submission(full(), [PASSED_SMOKE, *fulls], T0, SEASONS)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + 100 * DAY
    # Another track has its own two.
    coding_smoke = run(9, track="coding", created_at=T0 - 40 * DAY)
    assert check_submission(full(track="coding"), [coding_smoke, *fulls], T0, SEASONS) is None
    # The next season starts afresh.
    assert check_submission(full(), [PASSED_SMOKE, *fulls], T0 + 100 * DAY, SEASONS) is None


def test_full_runs_failed_by_the_platform_are_not_counted() -> None:
    fulls = [
        run(1, mode="full", created_at=T0 - 90 * DAY, finished_at=T0 - 89 * DAY),
        run(
            2,
            mode="full",
            state="failed",
            failure_kind="platform_error",
            created_at=T0 - 2 * DAY,
            finished_at=T0 - DAY,
        ),
    ]
    assert check_submission(full(), [PASSED_SMOKE, *fulls], T0, POLICY) is None


def test_a_full_run_completed_with_platform_failures_is_void() -> None:
    """The answer model was down for some questions: the run completed but is not charged, so
    it neither uses one of the two full runs nor starts the 30-day wait."""
    spoiled = run(1, mode="full", created_at=T0 - 3 * DAY, finished_at=T0 - DAY,
                  platform_failures=3)  # fmt: skip
    assert not spoiled.counts_against_quota
    assert check_submission(full(), [PASSED_SMOKE, spoiled], T0, POLICY) is None
    # With a charged run before it, the wait counts from that one, and only two charged runs
    # use the season's quota.
    charged_run = run(2, mode="full", created_at=T0 - 40 * DAY, finished_at=T0 - 35 * DAY)
    assert check_submission(full(), [PASSED_SMOKE, charged_run, spoiled], T0, POLICY) is None
    recent = run(3, mode="full", created_at=T0 - 12 * DAY, finished_at=T0 - 10 * DAY)
    refusal = check_submission(full(), [PASSED_SMOKE, recent, spoiled], T0, POLICY)
    assert isinstance(refusal, QuotaExceeded) and "j3" in refusal.reason
    assert refusal.next_allowed_at == T0 + 20 * DAY
    clean = run(1, mode="full", created_at=T0 - 3 * DAY, finished_at=T0 - DAY)
    assert isinstance(check_submission(full(), [PASSED_SMOKE, clean], T0, POLICY), QuotaExceeded)


@pytest.mark.parametrize(
    ("state", "failure_kind", "platform_failures", "expected"),
    [
        ("queued", None, 0, True),
        ("running", None, 0, True),
        ("completed", None, 0, True),
        ("completed", None, 1, False),
        ("failed", "platform_error", 0, False),
        ("failed", "contract_error", 0, True),
        ("failed", "job_stalled", 0, True),
    ],
)
def test_what_is_charged(
    state: str, failure_kind: str | None, platform_failures: int, expected: bool
) -> None:
    kind = FailureKind(failure_kind) if failure_kind else None
    assert charged(cast(JobState, state), kind, platform_failures) is expected


def test_a_run_on_mixed_code_is_not_charged() -> None:
    assert charged("completed", None, 0, mixed_code=True) is False
    assert run(1, mixed_code=True).counts_against_quota is False
    assert run(1).counts_against_quota is True


def test_a_smoke_completed_with_platform_failures_is_not_a_passed_smoke() -> None:
    """Those questions checked nothing of the participant end to end; not charged, the smoke
    is simply run again, at once."""
    spoiled = run(1, created_at=T0 - HOUR / 2, platform_failures=1)
    refusal = check_submission(full(), [spoiled], T0, POLICY)
    assert isinstance(refusal, Invalid)
    assert "smoke j1 completed with items failed by the platform" in refusal.reason
    assert check_submission(full(), [spoiled, PASSED_SMOKE], T0, POLICY) is None
    # Within the hour of the spoiled smoke, another smoke may start.
    assert check_submission(smoke(), [spoiled], T0, POLICY) is None


def test_full_failed_by_the_participant_is_counted_from_when_it_ended() -> None:
    first = run(1, mode="full", state="failed", failure_kind="contract_error",
                created_at=T0 - 20 * DAY, finished_at=T0 - 20 * DAY + HOUR)  # fmt: skip
    refusal = check_submission(full(), [PASSED_SMOKE, first], T0, POLICY)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.next_allowed_at == T0 + 10 * DAY + HOUR


def test_smoke_runs_do_not_count_against_full_quota_and_vice_versa() -> None:
    fulls = [run(i, mode="full", created_at=T0 - i * 40 * DAY) for i in (1, 2)]
    assert check_submission(smoke(), fulls, T0, POLICY) is None
    smokes = [run(i, created_at=T0 - i * DAY) for i in range(1, 40)]
    assert check_submission(full(), smokes, T0, POLICY) is None


# -- declared run limits (R-3.1) -----------------------------------------------------------


def test_run_overdue_at_its_declared_hours() -> None:
    version = {"run_limits": {"max_run_hours": 1.5}}
    assert run_overdue(version, T0, T0 + 90 * 60 * SECOND - SECOND) is None
    reason = run_overdue(version, T0, T0 + 90 * 60 * SECOND)
    assert reason == "the run exceeded its declared limit of 1.5 hours"
    assert run_overdue({"run_limits": {}}, T0, T0 + 1000 * DAY) is None
    assert run_overdue({}, T0, T0 + 1000 * DAY) is None
    assert run_overdue(version, None, T0) is None  # not started yet


def test_a_job_runs_datasets_of_its_own_track_only() -> None:
    assert check_dataset_tracks("textual", {"synthetic": "textual", "lme": "textual"}) is None
    assert check_dataset_tracks("coding", {"swe": "coding"}) is None
    assert check_dataset_tracks("textual", {}) is None
    # Mixing tracks is refused whichever track the job names, the foreign ones named.
    mixed = check_dataset_tracks("textual", {"synthetic": "textual", "swe": "coding"})
    assert isinstance(mixed, Invalid)
    assert "swe is coding" in mixed.reason and "never compared across tracks" in mixed.reason
    assert mixed.details == {"valid_datasets": ["synthetic"]}
    # A dataset of another track alone: refused too (the job's results would be that track's).
    other = check_dataset_tracks("textual", {"gallery": "multimodal"})
    assert isinstance(other, Invalid) and other.details == {"valid_datasets": []}
    assert "a job on track textual" in other.reason and "gallery is multimodal" in other.reason
