"""Reading a participant's answer defensively (SPEC R-4.9, project issue 15): JSON parsing with a
depth limit, the Add-status URL built from a task_id, bounded decompression, and short reasons.
Every failure caused by the participant's bytes is a `contract_error`, never another exception."""

from __future__ import annotations

import json
import zlib

import bson
import pytest
from pydantic import ValidationError

from aml_contract.participant import MAX_JSON_DEPTH, MAX_TASK_ID_LENGTH, AddAccepted
from aml_pipeline.participants import (
    BodyRejected,
    CallFailed,
    bson_size,
    parse_json,
    short,
    status_url,
    storage_problem,
    validate_search_response,
)
from aml_pipeline.participants.reading import _Decoder


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1, MAX_JSON_DEPTH])
def test_nesting_up_to_the_limit_is_accepted(depth: int) -> None:
    assert parse_json(_nested(depth), "add") is not None
    assert parse_json(b'{"a":' * (depth - 1) + b"1" + b"}" * (depth - 1), "add") is not None


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 999, 1000, 100_000])
def test_deeper_nesting_is_a_contract_error(depth: int) -> None:
    # Below Python's recursion limit the walk finds it; above it, json's RecursionError does.
    with pytest.raises(CallFailed) as failed:
        parse_json(_nested(depth), "add")
    assert (failed.value.kind, failed.value.reason) == (
        "contract_error",
        f"add response: JSON nested deeper than {MAX_JSON_DEPTH} levels",
    )


def test_deep_objects_inside_a_search_item_are_found() -> None:
    item = {"id": "x", "content": "y", "extra": json.loads(_nested(MAX_JSON_DEPTH))}
    with pytest.raises(CallFailed) as failed:
        parse_json(json.dumps({"data": [item]}).encode(), "search")
    assert "nested deeper" in failed.value.reason


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"success": true',
        b'{"x": "\xff\xfe"}',  # invalid UTF-8
        b'{"n": ' + b"9" * 5000 + b"}",  # beyond Python's integer digit limit
    ],
)
def test_invalid_json_is_a_contract_error(body: bytes) -> None:
    with pytest.raises(CallFailed) as failed:
        parse_json(body, "search")
    assert (failed.value.kind, failed.value.reason) == (
        "contract_error",
        "search response: body is not valid JSON",
    )


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_a_nul_in_an_object_key_is_a_contract_error(encoding: str) -> None:
    # json.loads reads UTF-16 and UTF-32 bodies too, where the escape is not the bytes b"\u0000".
    body = '{"data":[{"id":"x","content":"y","a\\u0000b":1}]}'.encode(encoding)
    with pytest.raises(CallFailed) as failed:
        parse_json(body, "search")
    assert failed.value.reason == "search response: an object key contains a NUL character"
    # A NUL inside a string value is only text.
    assert parse_json(b'{"id":"a\\u0000b"}', "search") == {"id": "a\x00b"}


def test_scalars_at_the_top_level_parse() -> None:
    assert parse_json(b"42", "add") == 42
    assert parse_json(b'"x"', "add") == "x"


# --- task_id and the status URL ---------------------------------------------------------------


@pytest.mark.parametrize("task_id", ["task\x00-1", "a\nb", "a\rb", "a\x7fb", "a\u2028b", ""])
def test_a_task_id_with_control_characters_is_refused_by_the_contract(task_id: str) -> None:
    with pytest.raises(ValidationError):
        AddAccepted.model_validate({"task_id": task_id})


def test_a_task_id_is_bounded() -> None:
    AddAccepted.model_validate({"task_id": "t" * MAX_TASK_ID_LENGTH})
    with pytest.raises(ValidationError):
        AddAccepted.model_validate({"task_id": "t" * (MAX_TASK_ID_LENGTH + 1)})


@pytest.mark.parametrize(
    ("task_id", "url"),
    [
        ("task-1", "https://m.example.com/tasks/task-1"),
        ("a:b@c", "https://m.example.com/tasks/a%3Ab%40c"),
        ("../admin?x=1#y", "https://m.example.com/tasks/..%2Fadmin%3Fx%3D1%23y"),
        ("zoë 1", "https://m.example.com/tasks/zo%C3%AB%201"),
    ],
)
def test_the_status_url_encodes_the_task_id(task_id: str, url: str) -> None:
    assert status_url("https://m.example.com/tasks/{task_id}", task_id) == url


@pytest.mark.parametrize("task_id", ["a\x00b", "a\nb"])
def test_the_status_url_refuses_control_characters(task_id: str) -> None:
    with pytest.raises(CallFailed) as failed:
        status_url("https://m.example.com/tasks/{task_id}", task_id)
    assert failed.value.kind == "contract_error"


def test_a_task_id_that_makes_an_invalid_url_is_a_contract_error() -> None:
    # A template with the id in the port: an id that makes the URL invalid is the participant's.
    with pytest.raises(CallFailed) as failed:
        status_url("https://m.example.com:{task_id}/status", "x")
    assert failed.value.kind == "contract_error"


# --- bounded decompression --------------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return packer.compress(data) + packer.flush()


def test_a_gzip_bomb_stops_at_the_limit() -> None:
    bomb = _gzip(b"0" * (32 * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    out = bytearray()
    with pytest.raises(BodyRejected) as rejected:
        _Decoder("gzip", "search response").feed(bomb, out, 1024)
    assert rejected.value.error_class == "ResponseTooLarge"
    # Never more than the limit plus one byte was produced.
    assert len(out) == rejected.value.size == 1025


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", _gzip(b'{"a":1}')),
        ("deflate", zlib.compress(b'{"a":1}')),
        ("deflate", zlib.compress(b'{"a":1}')[2:-4]),  # raw deflate, no zlib wrapper
        ("identity", b'{"a":1}'),
        ("", b'{"a":1}'),
    ],
)
def test_supported_encodings_decode(encoding: str, packed: bytes) -> None:
    out = bytearray()
    decoder = _Decoder(encoding, "add response")
    for i in range(0, len(packed), 3):
        decoder.feed(packed[i : i + 3], out, 1024)
    decoder.finish(out, 1024)
    assert bytes(out) == b'{"a":1}'


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress"])
def test_other_encodings_are_refused(encoding: str) -> None:
    with pytest.raises(BodyRejected) as rejected:
        _Decoder(encoding, "add response")
    assert rejected.value.error_class == "BadEncoding"


def test_short_bounds_and_escapes_quoted_text() -> None:
    assert short("abc") == "abc"
    assert short("a" * 500) == "a" * 200 + "…"
    assert short("a\x00b\nc") == "a\\x00b\\nc"


def test_the_documented_limits_are_the_clients() -> None:
    from pathlib import Path

    from aml_contract.participant import MAX_RESPONSE_BYTES
    from aml_pipeline.participants import CONNECT_TIMEOUT_SECONDS, HEALTH_TIMEOUT_SECONDS

    doc = (Path(__file__).parents[2] / "docs" / "participants.md").read_text()
    rows = {
        "health": "| Health | 64 KiB |",
        "add": "| Add (200 or 202) | 256 KiB |",
        "add_status": "| Add status (200) | 256 KiB |",
        "search": "| Search (200) | 4 MiB |",
    }
    sizes = {"64 KiB": 64 * 1024, "256 KiB": 256 * 1024, "4 MiB": 4 * 1024 * 1024}
    for operation, row in rows.items():
        assert row in doc
        assert MAX_RESPONSE_BYTES[operation] == sizes[row.split("|")[2].strip()]
    assert f"at most **{MAX_JSON_DEPTH} levels** deep" in doc
    assert f"longer than {MAX_TASK_ID_LENGTH} characters" in doc
    assert f"| connecting | {CONNECT_TIMEOUT_SECONDS:g} s |" in doc
    assert f"Health {HEALTH_TIMEOUT_SECONDS:g} s |" in doc


# --- what an answer takes to store, counted without encoding it ---------------------------------

_STORED_SHAPES: list[object] = [
    None,
    True,
    0,
    -(2**31),
    2**31 - 1,
    2**31,
    -(2**63),
    2**63 - 1,
    1.5,
    "",
    "ascii",
    "é€𝄞 multibyte",
    [],
    list(range(12)),
    [0] * 1001,
    {"id": "x", "content": "y", "extra": {"nested": [1, "two", 3.0, None, False, {"k": []}]}},
    [{"ключ": "значение", "n": [2**40] * 3}, [[[]]], {"": ""}],
]


@pytest.mark.parametrize("value", _STORED_SHAPES)
def test_the_counted_size_is_what_bson_stores(value: object) -> None:
    # The value inside a document: 4 length bytes, its element (type byte, key "v\0"), NUL.
    assert bson_size(value, 1 << 30) + 4 + 1 + 2 + 1 == len(bson.encode({"v": value}))


def test_a_swelling_object_passes_the_limit() -> None:
    swelling = {f"k{index}": 0 for index in range(300_000)}
    assert len(bson.encode({"v": swelling})) > 3_000_000
    assert bson_size(swelling, 1000) > 1000
    assert storage_problem(swelling, 1000) == "the items take more than 1000 bytes to store"
    assert bson_size(swelling, 1 << 30) + 4 + 1 + 2 + 1 == len(bson.encode({"v": swelling}))


def test_a_swelling_array_passes_the_limit() -> None:
    swelling = [0] * 2_000_000  # ~25 MB as BSON
    assert len(bson.encode({"v": swelling})) > 20_000_000
    assert bson_size(swelling, 1000) > 1000
    assert storage_problem(swelling, 1000) == "the items take more than 1000 bytes to store"
    assert storage_problem(swelling, 30_000_000) is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"data":[{"id":"x","content":"y","big":1' + b"0" * 30 + b"}]}", "64 bits"),
        (b'{"data":[{"id":"x","content":"y","z":["\\ud800"]}]}', "lone surrogate"),
        (b'{"data":[{"id":"x","content":"y","n":[' + b"0," * 800_000 + b"0]}]}", "to store"),
    ],
)
def test_an_answer_no_store_keeps_is_a_contract_error(body: bytes, problem: str) -> None:
    # Extra fields are the participant's, so the item model lets these through; the first two
    # used to fail only when stored, as a platform error retried instead of a contract error.
    with pytest.raises(CallFailed) as failed:
        validate_search_response(parse_json(body, "search"), top_k=3)
    assert failed.value.kind == "contract_error"
    assert failed.value.reason.startswith("search response: ")
    assert problem in failed.value.reason
