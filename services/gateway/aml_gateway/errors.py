"""One error shape for every response (R-5.1): `{"detail": {"reason": "..."}}`.

Validation failures add structured field errors, but never the submitted values: a request
body may hold a Memory System Key, and an error must not echo a secret back or into logs.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.utils import is_body_allowed_for_status_code
from starlette.exceptions import HTTPException as StarletteHTTPException


def field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Only where, what and which kind: pydantic's `input` and `ctx` may carry the value sent.
    return [
        {"loc": list(error["loc"]), "msg": str(error["msg"]), "type": str(error["type"])}
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


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(StarletteHTTPException, _http_error)
