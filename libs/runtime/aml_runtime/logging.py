"""structlog JSON logs for every service, with credentials redacted before anything is written."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

# Names of fields that hold credentials, compared after lower-casing and `-` -> `_`.
_SENSITIVE = frozenset(
    {
        "authorization", "proxy_authorization", "x_api_key", "api_key", "secret", "secrets",
        "secret_keys", "password", "token", "admin_token", "access_token", "memory_system_key",
        "leaderboard_api_key", "llm_api_key", "key",
    }
)  # fmt: skip
REDACTED = "[redacted]"


_SENSITIVE_SUFFIXES = ("_token", "_key", "apikey", "_secret", "password")


def _is_sensitive(key: object) -> bool:
    # Suffixes, not substrings: `max_tokens` or `prompt_tokens` are not credentials.
    name = str(key).lower().replace("-", "_")
    return name in _SENSITIVE or name.endswith(_SENSITIVE_SUFFIXES)


def _clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: REDACTED if _is_sensitive(k) else _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replaces the value of every credential-named field, nested ones included."""
    for key in list(event):
        event[key] = REDACTED if _is_sensitive(key) else _clean(event[key])
    return event


def add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`trace_id` / `span_id` of the span the line was logged in, so logs and traces join."""
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event.setdefault("span_id", format(span_context.span_id, "016x"))
    return event


# HTTP clients that log a line per request at INFO (httpx, and the openai client's own fork):
# that line repeats what the audit trail and the spans keep, costs a write per call, and prints
# the URL as it is, so a participant's query-string credential would be in the clear.
_PER_REQUEST_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai")


def configure_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    for name in _PER_REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_ids,
            redact,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
