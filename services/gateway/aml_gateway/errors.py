"""One error shape for every response (R-5.1): `{"detail": {"reason": "..."}}`.

The rule modules raise `aml_gateway.refusals` kinds without any HTTP; this module alone turns
them into statuses, bodies and headers (`refusal_response`).

Validation failures add structured field errors, but never the submitted values: a request
body may hold a Memory System Key, and an error must not echo a secret back or into logs. Ids
and keys from the request are quoted through `aml_gateway.refusals.echoed`, bounded.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.utils import is_body_allowed_for_status_code
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from aml_contract.api.errors import ErrorBody, ValidationErrorBody
from aml_gateway.refusals import Conflict, Invalid, NotFound, QuotaExceeded, Refused, echoed

_COMPONENTS = "#/components/schemas/"
# What FastAPI documents for 422 unless a route says otherwise: its own body, not ours.
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")
# The status of each kind of refusal.
REFUSAL_STATUS: dict[type[Refused], int] = {
    NotFound: 404,
    Conflict: 409,
    Invalid: 422,
    QuotaExceeded: 429,
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for the errors a route answers, so clients (and schema checks) know the
    body. 422 needs no entry: every route that validates input documents it already."""
    return {status: {"model": ErrorBody} for status in statuses}


def field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Only where, what and which kind: pydantic's `input` and `ctx` may carry the value sent.
    # A location names a key the caller sent when it is not allowed there: bounded, like any
    # echoed text.
    return [
        {
            "loc": [echoed(part) if isinstance(part, str) else part for part in error["loc"]],
            "msg": str(error["msg"]),
            "type": str(error["type"]),
        }
        for error in exc.errors()
    ]


def summarise(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "the request is invalid"
    first = errors[0]
    loc = first["loc"]
    # `body` is where nearly every error is; the field path alone reads better.
    path = loc[1:] if loc and loc[0] == "body" else loc
    where = ".".join(str(part) for part in path)
    reason = f"{where}: {first['msg']}" if where else str(first["msg"])
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more)"
    return reason


def refusal_status(refused: Refused) -> int:
    # By the nearest kind a refusal is, so a more specific one answers like its family.
    for kind in type(refused).__mro__:
        if kind in REFUSAL_STATUS:
            return REFUSAL_STATUS[kind]
    raise TypeError(f"no status for {type(refused).__name__}")


def refusal_response(refused: Refused) -> JSONResponse:
    detail: dict[str, Any] = {"reason": refused.reason, **refused.details}
    headers = None
    if isinstance(refused, QuotaExceeded):
        at = refused.next_allowed_at
        # `QuotaExceeded` in the OpenAPI document: the time is always there, null when unknown.
        detail["next_allowed_at"] = at.isoformat() if at else None
        if at is not None and refused.judged_at is not None:
            # Retry-After as well, for clients that honour it without reading the body.
            wait = (at - refused.judged_at).total_seconds()
            headers = {"Retry-After": str(max(1, math.ceil(wait)))}
    return JSONResponse({"detail": detail}, status_code=refusal_status(refused), headers=headers)


async def _refused(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return refusal_response(exc)


async def _validation_failed(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = field_errors(exc)
    return JSONResponse(
        status_code=422, content={"detail": {"reason": summarise(errors), "errors": errors}}
    )


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if not is_body_allowed_for_status_code(exc.status_code):
        return Response(status_code=exc.status_code, headers=exc.headers)
    detail: Any = exc.detail
    if not (isinstance(detail, dict) and "reason" in detail):
        # Framework errors (unknown route, wrong method) carry a plain string.
        detail = {"reason": str(detail)}
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def _replace_refs(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        if node.get("$ref") == old:
            node["$ref"] = new
        for value in node.values():
            _replace_refs(value, old, new)
    elif isinstance(node, list):
        for value in node:
            _replace_refs(value, old, new)


def _document_validation_errors(app: FastAPI) -> None:
    """FastAPI documents every 422 as its own `HTTPValidationError` (`detail` a list), but
    `_validation_failed` answers `ValidationErrorBody`: the document is corrected once, when
    it is first built, so every route says what it really sends."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        schemas = document.get("components", {}).get("schemas", {})
        if _FASTAPI_422[0] in schemas:
            _, defined = models_json_schema(
                [(ValidationErrorBody, "serialization")], ref_template=_COMPONENTS + "{model}"
            )
            for name in _FASTAPI_422:
                schemas.pop(name, None)
            schemas.update(defined["$defs"])
            _replace_refs(
                document["paths"],
                _COMPONENTS + _FASTAPI_422[0],
                _COMPONENTS + ValidationErrorBody.__name__,
            )
        # Every body is capped (`aml_gateway.limits.BodyLimit`), before any route runs.
        too_large = {
            "description": "The body is larger than AML_MAX_REQUEST_BYTES (not read)",
            "content": {"application/json": {"schema": {"$ref": _COMPONENTS + ErrorBody.__name__}}},
        }
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                if isinstance(operation, dict) and "requestBody" in operation:
                    operation.setdefault("responses", {}).setdefault("413", too_large)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Refused, _refused)
    _document_validation_errors(app)
