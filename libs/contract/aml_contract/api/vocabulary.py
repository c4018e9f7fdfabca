"""Terms every part of the REST API shares: tracks, boards, modes, job states, stages, bounded
text."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

Track = Literal["textual", "multimodal", "coding"]
Board = Literal["academic", "industrial"]
AuthMethod = Literal["token", "bearer", "x-api-key", "none"]
Mode = Literal["smoke", "full"]
JobState = Literal["queued", "running", "completed", "failed"]
Stage = Literal["add", "search", "answer", "score", "aggregate"]
STAGES: tuple[Stage, ...] = ("add", "search", "answer", "score", "aggregate")

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Label = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
LongText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]


class ReasonBody(BaseModel):
    """A decision's body: only its reason. Subclasses give their own example."""

    model_config = ConfigDict(extra="forbid")
    reason: LongText
