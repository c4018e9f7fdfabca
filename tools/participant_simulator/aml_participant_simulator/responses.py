"""The bodies the simulator answers with: the contract's correct shapes (R-4.6, R-4.8) and the
deliberately malformed ones. Malformed bodies, exactly:

Add (200 unless the outcome gives a status):
- missing_ids: `{"success":true}`
- success_false: the correct body with `"success":false`
- wrong_request_id: the correct body with `":wrong"` appended to request_id
Search (200 unless the outcome gives a status; `items` = the normal results, and when those are
empty one padding item, so that the defect always has an item to sit in):
- missing_ids: every item without `id`
- items_wrapper: `{"items":[...]}` instead of `{"data":[...]}`
- top_level_array: `[...]`
- too_many_items: `{"data":[...]}` with exactly top_k+1 items (normal results, then padding)
- empty_id / empty_content: the first item's `id` / `content` is `""`
- non_numeric_score: the first item's `score` is `"high"`
Any endpoint:
- not_json: NOT_JSON_BODY, labelled `application/json` (the worst case: a client that trusts the
  content type still has to fail cleanly)
"""

from __future__ import annotations

import json
from typing import Any

from aml_contract.participant import AddRequest

from .script import Mode

NOT_JSON_BODY = b"<html>this is not JSON</html>"
JSON_TYPE = "application/json"


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def padding_item(index: int) -> dict[str, Any]:
    return {"id": f"sim-pad-{index}", "content": f"padding memory {index}", "score": 0.0}


def add_ok(request: AddRequest) -> dict[str, Any]:
    return {
        "success": True,
        "request_id": request.request_id,
        "user_id": request.user_id,
        "session_id": request.session_id,
    }


def add_body(mode: Mode, request: AddRequest) -> bytes:
    body = add_ok(request)
    if mode == "missing_ids":
        return json_bytes({"success": True})
    if mode == "success_false":
        body["success"] = False
    elif mode == "wrong_request_id":
        body["request_id"] = f"{request.request_id}:wrong"
    return json_bytes(body)


def search_body(mode: Mode, items: list[dict[str, Any]], top_k: int) -> bytes:
    if mode in ("ok", "slow"):
        return json_bytes({"data": items})
    if mode == "too_many_items":
        padded = items + [padding_item(i) for i in range(top_k + 1 - len(items))]
        return json_bytes({"data": padded[: top_k + 1]})
    broken = [dict(entry) for entry in items] or [padding_item(0)]
    if mode == "items_wrapper":
        return json_bytes({"items": broken})
    if mode == "top_level_array":
        return json_bytes(broken)
    if mode == "missing_ids":
        for entry in broken:
            del entry["id"]
    elif mode == "empty_id":
        broken[0]["id"] = ""
    elif mode == "empty_content":
        broken[0]["content"] = ""
    elif mode == "non_numeric_score":
        broken[0]["score"] = "high"
    else:
        raise ValueError(f"search cannot answer in mode {mode!r}")
    return json_bytes({"data": broken})
