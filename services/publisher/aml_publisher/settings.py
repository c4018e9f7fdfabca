from typing import Any

from pydantic import Field, field_validator

from aml_contract.api.publication import ReleaseBaseline
from aml_runtime.settings import CommonSettings


class PublisherSettings(CommonSettings):
    # The operator's current release (`AML_RELEASE_BASELINE`, JSON): what a publishable job must
    # have been evaluated with. Unset or empty: no job passes the baseline checks.
    release_baseline: ReleaseBaseline | None = None
    # Finished jobs not gated yet (an event that ran out of deliveries, a crash) are looked for
    # this often.
    reconcile_interval_seconds: float = Field(default=60.0, gt=0)
    # Finished-job events gated at once by one publisher process.
    consumer_concurrency: int = Field(default=4, ge=1)

    @field_validator("release_baseline", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        # compose passes `${AML_RELEASE_BASELINE:-}`: an empty value means "not configured".
        if isinstance(value, str) and not value.strip():
            return None
        return value
