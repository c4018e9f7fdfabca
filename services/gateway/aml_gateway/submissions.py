"""Whether a team may start a job now (R-3.3 - R-3.5, R-5.2): plain rules over the team's earlier
jobs and a clock, so every boundary is testable without a database.

Quotas are counted per Leaderboard API Key (a team) and per season; a job the platform itself
failed (`platform_error`), or that completed with items the platform failed, is not counted
(`charged`), so an outage on our side never costs a team a run. Such a run is void: it does not
start the wait for the next full run either, and a smoke run that completed with items the
platform failed is not a passed smoke (those items checked nothing of the participant end to
end; being uncharged, the smoke can be run again at once).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field, field_validator, model_validator

from aml_contract.api.vocabulary import JobState, Mode, Track
from aml_gateway.refusals import Conflict, Invalid, QuotaExceeded, Refused, echoed
from aml_runtime.documents import ACTIVE_JOB_STATES, FailureKind


class Season(BaseModel):
    """A competition season: quotas restart at `starts_at` (inclusive) and end at `ends_at`
    (exclusive). Configured by the operator."""

    name: str
    starts_at: datetime
    ends_at: datetime

    @field_validator("starts_at", "ends_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        # A naive time would be ambiguous across time zones; the platform runs on UTC.
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _ordered(self) -> Season:
        if self.ends_at <= self.starts_at:
            raise ValueError(f"season {self.name}: ends_at must be after starts_at")
        return self

    def contains(self, moment: datetime) -> bool:
        return self.starts_at <= moment < self.ends_at


class QuotaPolicy(BaseModel):
    """The quota rules of R-3.4 and R-3.5, with the numbers the operator may change."""

    smoke_interval: timedelta = Field(
        default=timedelta(hours=1), description="At most one smoke run per key in this span."
    )
    smoke_per_track_season: int = Field(default=30, ge=0)
    full_per_track_season: int = Field(default=2, ge=0)
    full_gap: timedelta = Field(
        default=timedelta(days=30),
        description="A further full run may start this long after the previous one ended.",
    )
    seasons: list[Season] = Field(
        default_factory=list,
        description="Empty: one season without bounds. Otherwise submissions outside every "
        "season are refused until the next one starts.",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> QuotaPolicy:
        ordered = sorted(self.seasons, key=lambda s: s.starts_at)
        for earlier, later in itertools.pairwise(ordered):
            if later.starts_at < earlier.ends_at:
                raise ValueError(f"seasons {earlier.name} and {later.name} overlap")
        return self

    def season_at(self, moment: datetime) -> Season | None:
        if not self.seasons:
            return _ALL_TIME
        return next((s for s in self.seasons if s.contains(moment)), None)

    def next_season_start(self, moment: datetime) -> datetime | None:
        starts = [s.starts_at for s in self.seasons if s.starts_at > moment]
        return min(starts, default=None)


_ALL_TIME = Season(
    name="all-time",
    starts_at=datetime(1970, 1, 1, tzinfo=UTC),
    ends_at=datetime(9999, 1, 1, tzinfo=UTC),
)


def charged(
    state: JobState,
    failure_kind: FailureKind | None,
    platform_failures: int,
    mixed_code: bool = False,
) -> bool:
    """Whether a job counts against its team's quota: not when the platform failed it
    (`platform_error`), nor when it completed with items the platform failed or on mixed code
    (a rolling upgrade replaced the services mid-job): its results cannot be published through
    no fault of the team's. A queued or running job counts until it ends."""
    if state == "failed":
        return failure_kind != FailureKind.PLATFORM_ERROR
    return not (state == "completed" and (platform_failures > 0 or mixed_code))


class PriorRun(BaseModel):
    """One of the team's earlier jobs, as far as the rules need it."""

    job_id: str
    version_id: str
    mode: Mode
    track: Track
    run_label: str
    state: JobState
    created_at: datetime
    finished_at: datetime | None = None
    failure_kind: FailureKind | None = None
    # Items of a completed job the platform itself failed (`platform_error`).
    platform_failures: int = 0
    # Its items were processed by more than one build (`JobDocument.mixed_code`).
    mixed_code: bool = False
    # A completed smoke in which no item failed because of the participant; it
    # qualifies a full run only if it is also charged (`qualifies`).
    passed: bool = False

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES

    @property
    def counts_against_quota(self) -> bool:
        return charged(self.state, self.failure_kind, self.platform_failures, self.mixed_code)

    @property
    def qualifies(self) -> bool:
        """A passed smoke that checked every item end to end: one with items the platform
        failed did not, and, not being charged, is simply run again."""
        return self.mode == "smoke" and self.passed and self.counts_against_quota


class Submission(BaseModel):
    mode: Mode
    version_id: str
    track: Track
    run_label: str


def check_submission(
    submission: Submission, prior: Sequence[PriorRun], now: datetime, policy: QuotaPolicy
) -> Refused | None:
    """None when the submission may start now, else the first rule it breaks, in this order
    (R-5.2): duplicate Run Label (`Conflict`), a job still running for the same version and
    track (`Conflict`), no open season (`QuotaExceeded`), for a full run a passed smoke
    (`Invalid`), then the mode's quota (`QuotaExceeded`)."""
    if any(run.run_label == submission.run_label for run in prior):
        return Conflict(f"run label {echoed(submission.run_label)!r} is taken")
    running = next(
        (
            run
            for run in prior
            if run.active
            and run.version_id == submission.version_id
            and run.track == submission.track
        ),
        None,
    )
    if running is not None:
        return Conflict(
            f"job {running.job_id} is still running for version {echoed(submission.version_id)} on "
            f"track {submission.track}; wait for it to end",
        )
    season = policy.season_at(now)
    if season is None:
        return QuotaExceeded("no season is open", policy.next_season_start(now), now)
    counted = [
        run
        for run in prior
        if run.mode == submission.mode
        and run.counts_against_quota
        and season.contains(run.created_at)
    ]
    if submission.mode == "smoke":
        return _smoke_quota(submission, counted, now, policy, season)
    return _full_rules(submission, prior, counted, now, policy, season)


def check_dataset_tracks(track: Track, dataset_tracks: Mapping[str, Track]) -> Refused | None:
    """None when every dataset of the job belongs to the job's track, else `Invalid` naming the
    datasets of another track and the ones of this track (`valid_datasets`). Scores are never
    compared across tracks (R-2.1): a job, its results and its leaderboard entry are one
    track's, so a job mixing tracks, or running another track's dataset, is refused."""
    foreign = {dataset: other for dataset, other in dataset_tracks.items() if other != track}
    if not foreign:
        return None
    named = ", ".join(f"{dataset} is {other}" for dataset, other in sorted(foreign.items()))
    own = sorted(dataset for dataset, other in dataset_tracks.items() if other == track)
    return Invalid(
        f"a job on track {track} runs datasets of track {track} only ({named}); scores are "
        "never compared across tracks: submit one job per track (`track`, GET /v1/datasets)",
        valid_datasets=own,
    )


def _season_over(policy: QuotaPolicy, season: Season) -> datetime | None:
    return policy.next_season_start(season.ends_at - timedelta(microseconds=1))


def _smoke_quota(
    submission: Submission,
    counted: list[PriorRun],
    now: datetime,
    policy: QuotaPolicy,
    season: Season,
) -> Refused | None:
    # The hourly limit is per key, whatever the track; the season limit is per track.
    latest = max((run.created_at for run in counted), default=None)
    if latest is not None and now < latest + policy.smoke_interval:
        return QuotaExceeded(
            f"at most one smoke run every {_span(policy.smoke_interval)}",
            latest + policy.smoke_interval,
            now,
        )
    on_track = [run for run in counted if run.track == submission.track]
    if len(on_track) >= policy.smoke_per_track_season:
        return QuotaExceeded(
            f"the {policy.smoke_per_track_season} smoke runs of season {season.name} on track "
            f"{submission.track} are used",
            _season_over(policy, season),
            now,
        )
    return None


def _full_rules(
    submission: Submission,
    prior: Sequence[PriorRun],
    counted: list[PriorRun],
    now: datetime,
    policy: QuotaPolicy,
    season: Season,
) -> Refused | None:
    smoke_passed = any(
        run.qualifies and run.version_id == submission.version_id and run.track == submission.track
        for run in prior
    )
    if not smoke_passed:
        void = [
            run.job_id
            for run in prior
            if run.mode == "smoke"
            and run.passed
            and not run.counts_against_quota
            and run.version_id == submission.version_id
            and run.track == submission.track
        ]
        why = (
            f" (smoke {', '.join(void)} completed with items failed by the platform: it did "
            "not check them end to end and was not charged; run the smoke again)"
            if void
            else ""
        )
        return Invalid(
            f"no passed smoke run for version {echoed(submission.version_id)} on track "
            f"{submission.track}; a full run needs one{why}",
        )
    on_track = sorted(
        (run for run in counted if run.track == submission.track), key=lambda r: r.created_at
    )
    if len(on_track) >= policy.full_per_track_season:
        return QuotaExceeded(
            f"the {policy.full_per_track_season} full runs of season {season.name} on track "
            f"{submission.track} are used",
            _season_over(policy, season),
            now,
        )
    if on_track:
        previous = on_track[-1]
        gap = _span(policy.full_gap)
        if previous.finished_at is None:
            return QuotaExceeded(
                f"full run {previous.job_id} on track {submission.track} has not completed; "
                f"the next may start {gap} after it does",
                None,
                now,
            )
        allowed = previous.finished_at + policy.full_gap
        if now < allowed:
            return QuotaExceeded(
                f"the next full run on track {submission.track} may start {gap} after "
                f"{previous.job_id} completed",
                allowed,
                now,
            )
    return None


def _span(span: timedelta) -> str:
    if span % timedelta(days=1) == timedelta(0):
        days = span // timedelta(days=1)
        return f"{days} day{'s' if days != 1 else ''}"
    if span % timedelta(hours=1) == timedelta(0):
        hours = span // timedelta(hours=1)
        return f"{hours} hour{'s' if hours != 1 else ''}"
    return f"{span.total_seconds():g} seconds"
