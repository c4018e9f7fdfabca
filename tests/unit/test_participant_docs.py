"""docs/participants.md cannot drift from the contract: every JSON block in it is one of the
generated examples (named by the marker above it), and every example passes the platform's own
validators, the ones a run uses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import aml_memory_server.app as app
import aml_memory_server.auth as auth
import aml_memory_server.store as store
from aml_contract.examples import EXAMPLES, markdown
from aml_contract.participant import AddAccepted, AddRequest, SearchRequest, encode
from aml_memory_server.__main__ import build_parser
from aml_pipeline.participants import (
    ADD_RETRYABLE,
    SEARCH_RETRYABLE,
    validate_add_response,
    validate_search_response,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "participants.md"
_BLOCK = re.compile(r"(?:<!-- example: (\w+) -->\n)?```json\n(.*?)\n```", re.DOTALL)


def json_blocks() -> list[tuple[str | None, str]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text())]


def test_every_json_block_is_a_named_generated_example() -> None:
    blocks = json_blocks()
    assert blocks, "no JSON examples found"
    for name, text in blocks:
        assert name is not None, f"JSON block without an example marker: {text[:80]}"
        assert name in EXAMPLES, f"unknown example {name}"
        assert json.loads(text) == EXAMPLES[name], f"{name} differs from the generator's"
    # Every example is shown, exactly as the generator prints it.
    shown = DOC.read_text()
    for name in EXAMPLES:
        assert markdown(name) in shown, f"example {name} is missing or reformatted"


def _validate(name: str, value: Any) -> None:
    add = AddRequest.model_validate(EXAMPLES["add_request"])
    if name.startswith("add_request"):
        request = AddRequest.model_validate(value)
        # The example is exactly the bytes the platform sends for it.
        assert json.loads(encode(request)) == value
    elif name.startswith("search_request"):
        search = SearchRequest.model_validate(value)
        assert json.loads(encode(search)) == value
    elif name == "add_response":
        validate_add_response(value, add.request_id, add.user_id, add.session_id)
    elif name == "add_accepted":
        AddAccepted.model_validate(value)
    elif name == "add_status_done":
        validate_add_response(value["result"], add.request_id, add.user_id, add.session_id)
    elif name == "add_status_pending":
        assert value["status"] not in {"done", "completed", "succeeded", "success"}
    elif name.startswith("search_response"):
        top_k = SearchRequest.model_validate(EXAMPLES["search_request"]).top_k
        validate_search_response(value, top_k)
    else:
        raise AssertionError(f"no validation for example {name}")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_passes_the_contract(name: str) -> None:
    _validate(name, EXAMPLES[name])


def test_retry_table_matches_the_client() -> None:
    """The documented retry table lists the statuses the client retries, per method."""
    text = DOC.read_text()
    both = sorted(ADD_RETRYABLE & SEARCH_RETRYABLE)
    add_only = sorted(ADD_RETRYABLE - SEARCH_RETRYABLE)
    assert not SEARCH_RETRYABLE - ADD_RETRYABLE
    row = "| network error, " + ", ".join(map(str, both)) + " | retried | retried |"
    assert row in text
    assert "| " + ", ".join(map(str, add_only)) + " | retried | contract error |" in text


def test_starter_kit_names_what_exists() -> None:
    """The starter kit's README points teams at functions by name: they must exist."""
    readme = (DOC.parents[1] / "tools" / "memory_server" / "README.md").read_text()
    for module, names in (
        (app, ["create_app"]),
        (auth, ["is_authorized"]),
        (store, ["SqliteMemoryStore", "RequestIdConflict", "rows_from_add", "content_text"]),
        (store, ["fts_match_query"]),
    ):
        for name in names:
            assert f"`{name}" in readme and hasattr(module, name), name
    assert hasattr(store.SqliteMemoryStore, "add") and hasattr(store.SqliteMemoryStore, "search")
    for action in build_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert f"`{option}`" in readme, f"option {option} is not documented"
