"""Memory System Keys at rest (R-7.2) and secret redaction in logs (R-5.1)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import structlog
from pydantic import SecretStr

from aml_runtime.logging import REDACTED, configure_logging, redact
from aml_runtime.secrets import SecretBox

SECRET = "msk_live_0123456789abcdef"


def _box(*keys: str) -> SecretBox:
    return SecretBox(SecretStr(",".join(keys)))


# --- SecretBox ------------------------------------------------------------------------------


def test_round_trip() -> None:
    box = _box(SecretBox.new_key())
    sealed = box.seal(SecretStr(SECRET))
    opened = box.open(sealed)
    assert isinstance(opened, SecretStr)
    assert opened.get_secret_value() == SECRET


def test_ciphertext_does_not_contain_the_secret() -> None:
    box = _box(SecretBox.new_key())
    sealed = box.seal(SecretStr(SECRET))
    assert SECRET.encode() not in sealed
    assert SECRET[:8].encode() not in sealed
    # Fresh IV each time.
    assert box.seal(SecretStr(SECRET)) != sealed


def test_older_keys_still_decrypt() -> None:
    old, new = SecretBox.new_key(), SecretBox.new_key()
    sealed_old = _box(old).seal(SecretStr(SECRET))
    assert _box(new, old).open(sealed_old).get_secret_value() == SECRET
    with pytest.raises(ValueError):
        _box(new).open(sealed_old)


def test_first_key_encrypts() -> None:
    old, new = SecretBox.new_key(), SecretBox.new_key()
    sealed = _box(new, old).seal(SecretStr(SECRET))
    assert _box(new).open(sealed).get_secret_value() == SECRET
    with pytest.raises(ValueError):
        _box(old).open(sealed)


def test_keys_are_trimmed_and_blank_entries_ignored() -> None:
    key = SecretBox.new_key()
    box = SecretBox(SecretStr(f" , {key} ,,"))
    assert box.open(_box(key).seal(SecretStr(SECRET))).get_secret_value() == SECRET


@pytest.mark.parametrize("keys", ["", " ", ",", " , ,"])
def test_empty_keys_rejected(keys: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        SecretBox(SecretStr(keys))


def test_wrong_key_raises_without_the_secret() -> None:
    sealed = _box(SecretBox.new_key()).seal(SecretStr(SECRET))
    with pytest.raises(ValueError) as info:
        _box(SecretBox.new_key()).open(sealed)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_tampered_ciphertext_rejected() -> None:
    key = SecretBox.new_key()
    sealed = bytearray(_box(key).seal(SecretStr(SECRET)))
    sealed[-5] ^= 0x01
    with pytest.raises(ValueError):
        _box(key).open(bytes(sealed))


# --- redaction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "authorization",
        "Authorization",
        "api_key",
        "api-key",
        "apikey",
        "llm_api_key",
        "X-Api-Key",
        "memory_system_key",
        "token",
        "leaderboard_token",
        "secret",
        "secret_keys",
        "password",
    ],
)
def test_sensitive_keys_redacted(key: str) -> None:
    event = redact(None, "info", {"event": "call", key: SECRET})
    assert event[key] == REDACTED
    assert event["event"] == "call"


def test_other_keys_kept() -> None:
    event = {"event": "add", "job_id": "j1", "status": 503, "attempt": 2, "user_id": "eval:x"}
    assert redact(None, "info", dict(event)) == event


def test_configure_logging_never_writes_the_secret(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("test-service", "DEBUG")
        log = structlog.get_logger("test")
        log.info(
            "participant call",
            authorization=f"Bearer {SECRET}",
            memory_system_key=SECRET,
            api_key=SECRET,
            token=SECRET,
            job_id="job-7",
        )
        captured = capsys.readouterr()
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.reset_defaults()
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    assert SECRET not in captured.err
    assert SECRET not in captured.out
    line = json.loads(captured.err.strip().splitlines()[-1])
    assert line["event"] == "participant call"
    assert line["job_id"] == "job-7"
    assert line["service"] == "test-service"
    for key in ("authorization", "memory_system_key", "api_key", "token"):
        assert line[key] == REDACTED


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_http_clients_log_no_line_per_request(level: str, caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs every request with its URL as it is: a credential in a participant's query
    string would be written in the clear (and the audit trail and spans keep the call)."""
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in ("httpx", "httpx2", "openai")}
    # pytest's handlers are on the root logger already, so basicConfig leaves its level alone.
    caplog.set_level(logging.DEBUG)
    try:
        configure_logging("test-service", level)
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
        with httpx.Client(transport=transport) as client:
            client.post(f"http://participant.test/search?token={SECRET}", json={})
    finally:
        structlog.reset_defaults()
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(root_level)
        for name, was in quiet.items():
            logging.getLogger(name).setLevel(was)
    assert SECRET not in caplog.text
    assert "HTTP Request" not in caplog.text
