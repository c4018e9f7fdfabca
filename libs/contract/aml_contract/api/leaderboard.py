"""The public leaderboard (R-2.4, R-5.3): its entries, one board, one system's history."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from aml_contract.api.access_requests import DeclaredModels
from aml_contract.api.results import DatasetResults, JobEfficiency, Metrics
from aml_contract.api.vocabulary import Board, Track


class LeaderboardEntry(BaseModel):
    """A public leaderboard submission record (R-3.8): only approved, not disqualified."""

    entry_id: str
    system_name: str
    version_label: str
    team_name: str
    board: Board
    track: Track
    overall: Metrics
    datasets: dict[str, DatasetResults]
    spec_hash: str
    code_hash: str
    dataset_bundle_hash: str
    answer_model: str
    published_at: datetime
    declared_models: DeclaredModels | None = Field(
        default=None, description="The models inside the system, as its team declared (R-2.2)."
    )
    repository_url: str | None = Field(
        default=None, description="The method's repository (academic board)."
    )
    efficiency: JobEfficiency | None = Field(
        default=None,
        description="What the results cost (latency as seen from the platform, network "
        "included; retrieved context; the platform's model use) and what they were measured "
        "under. Absent for results computed before it was reported.",
    )
    tied_with_above: bool | None = Field(
        default=None,
        description="On a board only: whether this entry's Overall is statistically "
        "indistinguishable from the entry ranked just above (paired bootstrap over the "
        "questions both answered, 95%; method and seed in the evaluation spec). null for the "
        "first entry and where no paired comparison is possible (no per-question outcomes "
        "kept, or no question in common).",
    )


class Leaderboard(BaseModel):
    """One public board (R-2.4, R-5.3): approved, not disqualified entries of one track."""

    track: Track
    board: Board | None = Field(description="null: the entries of every board of the track.")
    entries: list[LeaderboardEntry] = Field(
        description="Best Overall first (its headline: accuracy, else judge accuracy, or "
        "the mean token F1 where `headline` is `f1_mean`, or on the coding track the share of "
        "resolved attempts, `resolved_rate`, split by memory condition in each dataset's "
        "`categories` and by task type in its `task_types`; none last), then the earlier "
        "publication. Only entries of this track: scores are never compared across tracks."
    )


class SystemHistory(BaseModel):
    """Every public entry of one system, across its versions, tracks and boards (R-5.3)."""

    system_name: str
    entries: list[LeaderboardEntry] = Field(description="Oldest publication first.")
