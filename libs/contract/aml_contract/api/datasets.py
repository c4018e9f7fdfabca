"""The datasets a job may run (`GET /v1/datasets`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from aml_contract.api.vocabulary import Track


class DatasetCategory(BaseModel):
    number: int
    name: str
    questions: int | None = Field(
        description="Questions of the category; null when this gateway cannot read the files."
    )
    in_overall: bool = Field(description="False: reported apart, not counted in Overall.")


class DatasetInfo(BaseModel):
    """A dataset of `GET /v1/datasets`: one a job may run, or one the operator registered."""

    dataset_id: str
    version: str
    track: Track
    questions: int | None = Field(
        description="Every question of the dataset (excluded categories included); null when "
        "this gateway cannot read the dataset's files (licensed data not mounted here)."
    )
    categories: list[DatasetCategory]
    smoke_default: bool = Field(description="Part of the smoke sample a run that names none uses.")
    smoke: bool = Field(description="May be named in a smoke run's `datasets`.")
    full_suite: bool = Field(description="Part of the fixed suite every full run uses.")
    runnable: bool = Field(
        description="A job may name it: configured for smoke or full runs. False: registered by "
        "the operator (`aml dataset add`) but not yet in AML_SMOKE_DATASETS or AML_FULL_SUITE."
    )
