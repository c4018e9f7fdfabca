"""The platform API's error body (SPEC R-5.1): `{"detail": {"reason": "..."}}`."""

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    reason: str


class ErrorBody(BaseModel):
    detail: ErrorDetail
