"""Keeping a run's derived data past the 30 days of R-7.5."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from aml_contract.api.vocabulary import LongText


class RetentionExtension(BaseModel):
    """An admin keeps a run's derived data past the 30 days of R-7.5."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"keep_until": "2027-06-30T00:00:00Z", "reason": "integrity review"}]
        },
    )
    keep_until: datetime
    reason: LongText


class RetentionView(BaseModel):
    job_id: str
    keep_until: datetime
    reason: str
