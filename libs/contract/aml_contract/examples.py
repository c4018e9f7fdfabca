"""Example bodies of the participant contract, built from the contract models themselves.

docs/participants.md shows exactly these (a unit test compares every JSON block there with
them), so the documentation cannot drift from what the platform sends and accepts.
`python -m aml_contract.examples` prints them as the Markdown blocks the document holds.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from aml_contract.participant import (
    AddAccepted,
    AddRequest,
    AddResponse,
    ImageUrl,
    ImageUrlPart,
    Message,
    SearchItem,
    SearchRequest,
    SearchResponse,
    TextPart,
    add_request_id,
    encode,
    memory_session_id,
    memory_user_id,
)

_RUN, _DATASET, _CONVERSATION = "run-7f3a", "locomo", "conv-26"
_USER = memory_user_id(_RUN, _DATASET, _CONVERSATION)

ADD_REQUEST = AddRequest(
    request_id=add_request_id(_RUN, _DATASET, _CONVERSATION, 0),
    user_id=_USER,
    session_id=memory_session_id(_RUN, _CONVERSATION, "session_1"),
    messages=[
        Message(
            role="Caroline",
            content="I went to the LGBTQ support group yesterday.",
            timestamp=1683554160000,
        ),
        Message(
            role="Melanie",
            content="That sounds powerful! How did it go?",
            timestamp=1683554220000,
        ),
    ],
)

ADD_REQUEST_MULTIMODAL = AddRequest(
    request_id=add_request_id(_RUN, "mmbench", "conv-3", 0),
    user_id=memory_user_id(_RUN, "mmbench", "conv-3"),
    session_id=memory_session_id(_RUN, "conv-3", "session_1"),
    messages=[
        Message(
            role="user",
            content=[
                TextPart(type="text", text="This is the bike I bought last week."),
                ImageUrlPart(
                    type="image_url",
                    image_url=ImageUrl(url="https://data.example.org/mmbench/bike.jpg"),
                ),
            ],
        )
    ],
)

ADD_RESPONSE = AddResponse(
    success=True,
    request_id=ADD_REQUEST.request_id,
    user_id=ADD_REQUEST.user_id,
    session_id=ADD_REQUEST.session_id,
)

ADD_ACCEPTED = AddAccepted(task_id="task-5521")

SEARCH_REQUEST = SearchRequest(
    query="When did Caroline go to the LGBTQ support group?", user_id=_USER, top_k=100
)

SEARCH_REQUEST_OPTIONS = SearchRequest(
    query="Which sport does Melanie play?",
    user_id=_USER,
    top_k=100,
    options=["tennis", "football", "chess", "swimming"],
)

SEARCH_RESPONSE = SearchResponse(
    data=[
        SearchItem(
            id="mem-81f2",
            content="Caroline went to the LGBTQ support group on 7 May 2023.",
            score=12.7,
            created_at="2023-05-08T13:56:00.000Z",
        ),
        SearchItem(id="mem-0c19", content="Melanie asked how the group went.", score=4.1),
    ]
)

SEARCH_RESPONSE_EMPTY = SearchResponse(data=[])


def _dump(model: BaseModel) -> Any:
    if isinstance(model, AddRequest | SearchRequest):
        # Requests exactly as sent: the bytes `encode` builds (sorted keys, no unset fields).
        return json.loads(encode(model))
    return model.model_dump(mode="json", exclude_none=True)


def _status(state: str, result: BaseModel | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": state}
    if result is not None:
        body["result"] = _dump(result)
    return body


# name → JSON value. The names are the markers (`<!-- example: NAME -->`) in the document.
EXAMPLES: dict[str, Any] = {
    "add_request": _dump(ADD_REQUEST),
    "add_request_multimodal": _dump(ADD_REQUEST_MULTIMODAL),
    "add_response": _dump(ADD_RESPONSE),
    "add_accepted": _dump(ADD_ACCEPTED),
    "add_status_pending": _status("pending"),
    "add_status_done": _status("done", ADD_RESPONSE),
    "search_request": _dump(SEARCH_REQUEST),
    "search_request_options": _dump(SEARCH_REQUEST_OPTIONS),
    "search_response": _dump(SEARCH_RESPONSE),
    "search_response_empty": _dump(SEARCH_RESPONSE_EMPTY),
}


def markdown(name: str) -> str:
    text = json.dumps(EXAMPLES[name], indent=2, ensure_ascii=False)
    return f"<!-- example: {name} -->\n```json\n{text}\n```"


def main() -> None:
    print("\n\n".join(markdown(name) for name in EXAMPLES))


if __name__ == "__main__":
    main()
