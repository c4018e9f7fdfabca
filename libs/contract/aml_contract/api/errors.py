"""The platform API's error body (SPEC R-5.1): `{"detail": {"reason": "..."}}`."""

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    reason: str


class ErrorBody(BaseModel):
    detail: ErrorDetail


class FieldError(BaseModel):
    """One failed check of the request: where and what, never the value sent (a body may hold
    a Memory System Key)."""

    loc: list[str | int] = Field(
        description="Where: `body`, `query`, `path` or `header`, then the field path."
    )
    msg: str
    type: str = Field(description="pydantic's error type, e.g. `missing` or `string_too_long`.")


class ValidationErrorDetail(ErrorDetail):
    errors: list[FieldError] = Field(
        default_factory=list,
        description="Set when the request does not match its schema; absent when a valid "
        "request is refused for its content (e.g. an unsafe participant URL).",
    )


class ValidationErrorBody(BaseModel):
    """The 422 body: `reason` summarises the first failure, `errors` lists them all."""

    detail: ValidationErrorDetail
