"""A participant's answers checked against the contract (R-4.9) and never repaired: anything its
bytes can make go wrong while parsing or validating them, or building the Add-status URL from
them, is a contract violation with a precise reason (final), never a platform error."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from aml_contract.participant import (
    MAX_JSON_DEPTH,
    MAX_STORED_SEARCH_ITEMS_BYTES,
    AddAccepted,
    AddResponse,
    SearchItem,
    SearchResponse,
)
from aml_pipeline.participants.failures import CallFailed, short
from aml_pipeline.participants.sizing import storage_problem
from aml_runtime.documents import FailureKind


def parse_json(body: bytes, what: str) -> Any:
    """A participant's JSON answer, or a contract violation: invalid JSON or encoding, nesting
    deeper than MAX_JSON_DEPTH, or an object key holding NUL (which no store can keep)."""
    try:
        payload = json.loads(body)
    except RecursionError:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR,
            f"{what} response: JSON nested deeper than {MAX_JSON_DEPTH} levels",
        ) from None
    except ValueError:
        # JSONDecodeError, UnicodeDecodeError, an integer beyond the digit limit.
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, f"{what} response: body is not valid JSON"
        ) from None
    # A NUL reaches a key only as the escape \u0000, or in a body that is not UTF-8 (json.loads
    # also reads UTF-16 and UTF-32, where every ASCII character has a zero byte): without either,
    # no key needs looking at.
    keys_may_hold_nul = b"\x00" in body or b"\\u0000" in body
    problem = _structure_problem(payload, keys_may_hold_nul)
    if problem is not None:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"{what} response: {problem}")
    return payload


def _structure_problem(payload: Any, keys_may_hold_nul: bool = True) -> str | None:
    # Iterative, containers only: bounded by the body size, never by Python's stack.
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(value, dict):
            if keys_may_hold_nul and any("\x00" in key for key in value):
                return "an object key contains a NUL character"
            stack.extend(
                (child, depth + 1) for child in value.values() if isinstance(child, dict | list)
            )
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value if isinstance(child, dict | list))
    return None


def validate_add_response(payload: Any, request_id: str, user_id: str, session_id: str) -> None:
    if not isinstance(payload, dict):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "add response: body must be a JSON object")
    try:
        response = AddResponse.model_validate(payload)
    except ValidationError as exc:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"add response: {_first_error(exc)}") from None
    if response.success is not True:
        raise CallFailed(FailureKind.CONTRACT_ERROR, "add response: success must be true")
    expected = {"request_id": request_id, "user_id": user_id, "session_id": session_id}
    for field, value in expected.items():
        if getattr(response, field) != value:
            raise CallFailed(
                FailureKind.CONTRACT_ERROR, f"add response: {field} must echo the request's"
            )


def validate_add_accepted(payload: Any) -> AddAccepted:
    if not isinstance(payload, dict) or "task_id" not in payload:
        raise CallFailed(FailureKind.CONTRACT_ERROR, "add 202 response: task_id missing")
    try:
        return AddAccepted.model_validate(payload)
    except ValidationError as exc:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, f"add 202 response: {_first_error(exc)}"
        ) from None


def status_url(template: str, task_id: str) -> str:
    """The Add-status URL for a task: the id percent-encoded into the template (all but
    letters, digits and `-._~`, so it cannot add a path, query, fragment or user), and the
    result a URL httpx accepts; else a contract violation."""
    if not task_id.isprintable():
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "add 202 response: task_id holds control characters"
        )
    url = template.replace("{task_id}", quote(task_id, safe="-._~"))
    try:
        httpx.URL(url)
    except httpx.InvalidURL:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "add 202 response: task_id does not make a valid status URL"
        ) from None
    return url


def validate_search_response(payload: Any, top_k: int) -> list[SearchItem]:
    if isinstance(payload, list):
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "search response: a top-level array is not allowed"
        )
    if not isinstance(payload, dict):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "search response: body must be a JSON object")
    if "data" not in payload:
        wrapper = " (an `items` wrapper is not allowed)" if "items" in payload else ""
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"search response: `data` is missing{wrapper}")
    if not isinstance(payload["data"], list):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "search response: `data` must be an array")
    if len(payload["data"]) > top_k:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR,
            f"search response: {len(payload['data'])} items exceed top_k={top_k}",
        )
    problem = storage_problem(payload["data"], MAX_STORED_SEARCH_ITEMS_BYTES)
    if problem is not None:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"search response: {problem}")
    try:
        return SearchResponse.model_validate(payload).data
    except ValidationError as exc:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, f"search response: {_first_error(exc)}"
        ) from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = list(error["loc"])
    if len(loc) >= 2 and loc[0] == "data" and isinstance(loc[1], int):
        # Items are numbered from 1 for people reading the error summary.
        where = f"item {loc[1] + 1}: " + ".".join(str(part) for part in loc[2:])
    else:
        where = ".".join(str(part) for part in loc)
    message = f"{where}: {error['msg']}" if where else str(error["msg"])
    return short(message)
