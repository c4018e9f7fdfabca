"""OpenTelemetry tracing for every service (SPEC R-8.3 - R-8.5).

One trace per job item: the scheduler starts it when it releases the item (`item_trace`), the
NATS headers carry it from service to service (every publish of `aml_runtime.broker` writes the
current span's W3C trace context; a stage worker continues it with `continue_trace`, a FastStream
subscriber with the telemetry middleware of `aml_runtime.broker.make_broker`), each stage adds
its span (`stage_span`) and the outgoing HTTP calls to the participant and the LLM are child
spans (httpx instrumentation).

Spans go to an OTLP collector when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and, with
`AML_TRACE_DIR`, also to OTLP-JSON files (one `ExportTraceServiceRequest` per line) that
`aml trace` reads. Span attributes are ids, stages and attempts only: never a secret, a gold
answer or a memory body. URLs lose their query string and userinfo before any span is exported
(`SanitizingExporter`): the httpx and FastAPI instrumentations record `http.url` / `url.full` /
`http.target` / `url.query` as requested, and a key sent as `?key=` must not land in a trace.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from opentelemetry.util.types import Attributes

TRACER_NAME = "aml"
# How often the span files are appended to: `aml trace` sees an item's spans this long after
# they end at most. The export thread wakes this often even when there is nothing to write
# (a wake-up costs about 0.1 ms of CPU on a small virtual machine), and a busy service appends
# fewer, larger batches.
SPAN_FILE_EXPORT_MILLIS = 2000

log = structlog.get_logger()


class OtlpJsonFileExporter(SpanExporter):
    """Appends each batch as one OTLP-JSON line to `<dir>/<service>-<pid>.jsonl`: the format an
    OTLP/HTTP JSON receiver accepts, so the files can also be replayed into a collector."""

    def __init__(self, directory: Path, service: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{service}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(otlp_json(spans), separators=(",", ":"))
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


# The OTLP/JSON encoding is written here from the spans, not by printing the protobuf request
# (`encode_spans`) with protobuf's JSON printer, which was a noticeable share of every service's
# CPU. The document is the one that printer made, field for field (tests/unit/test_otlp_json.py
# compares the two): the protobuf JSON mapping, in which a field left at its default (0, "",
# an empty list) is omitted, a 64-bit integer is a string and an enum is its value's name, except
# that trace and span ids are hex, as OTLP/HTTP JSON has them, not base64.

_SPAN_KINDS = {
    SpanKind.INTERNAL: "SPAN_KIND_INTERNAL",
    SpanKind.SERVER: "SPAN_KIND_SERVER",
    SpanKind.CLIENT: "SPAN_KIND_CLIENT",
    SpanKind.PRODUCER: "SPAN_KIND_PRODUCER",
    SpanKind.CONSUMER: "SPAN_KIND_CONSUMER",
}
# STATUS_CODE_UNSET is the default: omitted.
_STATUS_CODES = {StatusCode.OK: "STATUS_CODE_OK", StatusCode.ERROR: "STATUS_CODE_ERROR"}
# SpanFlags: the flags say whether the parent (or a link's span) is remote, and that they say so.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The spans as one ExportTraceServiceRequest in the OTLP/HTTP JSON encoding: grouped by
    resource, then by instrumentation scope, in the order of their first span."""
    Scopes = dict[InstrumentationScope | None, list[dict[str, Any]]]
    grouped: dict[Resource, Scopes] = {}
    # A Resource hashes by serializing its attributes, a cost per span; the spans of one provider
    # share one Resource object, so it is looked up by equality once per object.
    by_identity: dict[int, Scopes] = {}
    for span in spans:
        scopes = by_identity.get(id(span.resource))
        if scopes is None:
            scopes = by_identity[id(span.resource)] = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(_span_json(span))
    if not grouped:
        return {}
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = [_scope_spans_json(scope, spans) for scope, spans in scopes.items()]
        entry: dict[str, Any] = {
            "resource": _with_attributes({}, resource.attributes),
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans}


def _scope_spans_json(
    scope: InstrumentationScope | None, spans: list[dict[str, Any]]
) -> dict[str, Any]:
    scope_json: dict[str, Any] = {}
    if scope is not None:
        if scope.name:
            scope_json["name"] = scope.name
        if scope.version:
            scope_json["version"] = scope.version
        _with_attributes(scope_json, scope.attributes)
    entry = {"scope": scope_json, "spans": spans}
    if scope is not None and scope.schema_url:
        entry["schemaUrl"] = scope.schema_url
    return entry


def _span_json(span: ReadableSpan) -> dict[str, Any]:
    span_context = span.context
    assert span_context is not None  # every span the SDK ends has one
    out: dict[str, Any] = {
        "traceId": format(span_context.trace_id, "032x"),
        "spanId": format(span_context.span_id, "016x"),
    }
    if span_context.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in span_context.trace_state.items())
    parent = span.parent
    if parent:
        out["parentSpanId"] = format(parent.span_id, "016x")
    if span.name:
        out["name"] = span.name
    out["kind"] = _SPAN_KINDS[span.kind]
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    _with_attributes(out, span.attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        out["events"] = [_event_json(event) for event in span.events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        out["links"] = [_link_json(link) for link in span.links]
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status: dict[str, Any] = {}
    if span.status.description:
        status["message"] = span.status.description
    if span.status.status_code in _STATUS_CODES:
        status["code"] = _STATUS_CODES[span.status.status_code]
    out["status"] = status
    out["flags"] = _flags(parent)
    return out


def _flags(parent: SpanContext | None) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if parent and parent.is_remote else _HAS_IS_REMOTE


def _event_json(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if event.timestamp:
        out["timeUnixNano"] = str(event.timestamp)
    if event.name:
        out["name"] = event.name
    _with_attributes(out, event.attributes)
    if event.dropped_attributes:
        out["droppedAttributesCount"] = event.dropped_attributes
    return out


def _link_json(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": format(link.context.trace_id, "032x"),
        "spanId": format(link.context.span_id, "016x"),
    }
    _with_attributes(out, link.attributes)
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    out["flags"] = _flags(link.context)
    return out


def _with_attributes(out: dict[str, Any], attributes: Attributes) -> dict[str, Any]:
    """`out` with the attributes' key-value list, when there is one. An attribute the protobuf
    encoder could not hold (an integer beyond 64 bits, a string that is not valid UTF-8) is left
    out with a warning, as that encoder does, instead of losing the batch."""
    if not attributes:
        return out
    encoded = []
    for key, value in attributes.items():
        try:
            encoded.append({"key": _utf8(key), "value": _any_value(value)})
        except (TypeError, ValueError) as exc:
            log.warning("trace_export.attribute_dropped", key=key, error=str(exc))
    if encoded:
        out["attributes"] = encoded
    return out


def _utf8(text: str) -> str:
    if not text.isascii():
        # A lone surrogate (text decoded with surrogateescape) raises UnicodeEncodeError, a
        # ValueError.
        text.encode("utf-8")
    return text


def _any_value(value: Any) -> dict[str, Any]:
    """An AnyValue: which of its fields is set is the value's type (bool before int, str and
    bytes before sequences, as they are also both)."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": _utf8(value)}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"Value out of range: {value}")
        return {"intValue": str(int(value))}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {
            "doubleValue": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        }
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        values = [_any_value(item) for item in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        pairs = [{"key": _utf8(str(k)), "value": _any_value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": pairs} if pairs else {}}
    raise TypeError(f"Invalid type {type(value)} of value {value}")


# A URL anywhere in a string: scheme, optional userinfo, host and path, query, fragment.
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/?#@\s]*@)?(?P<rest>[^?#\s]*)[^\s]*")
# Attributes that hold only a query string: dropped.
_QUERY_ONLY = frozenset({"url.query"})
# Attributes that hold a path with its query (the old semantic conventions' server target).
_TARGETS = frozenset({"http.target"})


def strip_url(text: str) -> str:
    """`text` with every URL in it cut to scheme, host and path: no userinfo, query or fragment."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: m.group("scheme") + m.group("rest"), text)


def _needs_scrubbing(key: str, value: object) -> bool:
    if key in _QUERY_ONLY:
        return True
    if not isinstance(value, str):
        return False
    if key in _TARGETS:
        return "?" in value or "#" in value
    return "://" in value and ("?" in value or "@" in value or "#" in value)


def scrub_attributes(attributes: Attributes) -> Attributes:
    """The attributes without query strings or userinfo in any URL (the same object when there
    is nothing to change)."""
    if not attributes or not any(_needs_scrubbing(k, v) for k, v in attributes.items()):
        return attributes
    clean: dict[str, Any] = {}
    for key, value in attributes.items():
        if key in _QUERY_ONLY:
            continue
        if isinstance(value, str) and key in _TARGETS:
            value = value.split("?", 1)[0].split("#", 1)[0]
        elif isinstance(value, str):
            value = strip_url(value)
        clean[key] = value
    return clean


def scrub_span(span: ReadableSpan) -> ReadableSpan:
    """The span as it may leave the process: URLs in its attributes, its events' attributes
    (exception messages name the URL) and its status description without query or userinfo."""
    attributes = scrub_attributes(span.attributes)
    events = [
        Event(event.name, scrub_attributes(event.attributes), event.timestamp)
        if scrub_attributes(event.attributes) is not event.attributes
        else event
        for event in span.events
    ]
    description = span.status.description
    status = span.status
    if description and strip_url(description) != description:
        status = Status(span.status.status_code, strip_url(description))
    changed = any(new is not old for new, old in zip(events, span.events, strict=True))
    if attributes is span.attributes and status is span.status and not changed:
        return span
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class SanitizingExporter(SpanExporter):
    """Hands spans on to `inner` with query strings and userinfo removed from every URL (the
    instrumentations record the URL as requested; their hooks run too late for attributes set
    at span start, and `OTEL_INSTRUMENTATION_HTTP_CAPTURE_*` concerns headers only)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([scrub_span(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def configure_tracing(
    service: str, trace_dir: Path | None, exporters: Sequence[SpanExporter] = ()
) -> TracerProvider:
    """The service's tracer provider, made global so instrumentations use it too. Every
    exporter (OTLP, the span files, `exporters` given by tests) sees spans through
    `SanitizingExporter`."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(SanitizingExporter(OTLPSpanExporter())))
    if trace_dir is not None:
        exporter = SanitizingExporter(OtlpJsonFileExporter(trace_dir, service))
        provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=SPAN_FILE_EXPORT_MILLIS)
        )
    for extra in exporters:
        provider.add_span_processor(BatchSpanProcessor(SanitizingExporter(extra)))
    trace.set_tracer_provider(provider)
    instrument_http(provider)
    return provider


def instrument_http(provider: TracerProvider) -> None:
    """Every httpx client (participant calls, LLM calls) makes a client span per request. Only
    method, URL and status are recorded: no headers, so no Authorization value."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    instrumentor = HTTPXClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)


# OpenTelemetry's proxy: it finds the provider `configure_tracing` makes global once there is
# one, and keeps it (asking the provider for a tracer on every span was a cost per item).
_TRACER = trace.get_tracer(TRACER_NAME)


def tracer() -> Tracer:
    return _TRACER


def _attributes(**ids: Any) -> dict[str, Any]:
    return {f"aml.{key}": value for key, value in ids.items() if value is not None}


def item_trace_ids(item_key: str) -> tuple[int, int]:
    """The trace id of a job item, and the id of its (never recorded) root: derived from the
    item's key, so every release of the item, however often and by whichever replica, lands in
    the same trace."""
    digest = hashlib.sha256(item_key.encode("utf-8")).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def item_trace_hex(item_key: str) -> str:
    """The trace id of a job item as auditors and `aml trace` read it (32 hex digits)."""
    return format(item_trace_ids(item_key)[0], "032x")


@contextmanager
def item_trace(name: str, item_key: str, **ids: Any) -> Iterator[Span]:
    """A span in the trace of one job item (see item_trace_ids), not a child of whatever event
    released it."""
    trace_id, root_id = item_trace_ids(item_key)
    root = SpanContext(
        trace_id=trace_id,
        span_id=root_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(root)))
    try:
        with tracer().start_as_current_span(name, attributes=_attributes(**ids)) as span:
            yield span
    finally:
        context.detach(token)


@contextmanager
def continue_trace(headers: dict[str, str] | None) -> Iterator[None]:
    """Continue the trace a message carries in its headers (the W3C trace context that
    `aml_runtime.broker.publish` and `publish_work` write)."""
    token = context.attach(propagate.extract(headers or {}))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def stage_span(name: str, **ids: Any) -> Iterator[Span]:
    """A stage's work on an item, inside the trace the message carried."""
    with tracer().start_as_current_span(name, attributes=_attributes(**ids)) as span:
        yield span


def current_trace_ids() -> dict[str, str]:
    """`trace_id` / `span_id` of the current span (for logs and stored documents), or {}."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    return {
        "trace_id": format(span_context.trace_id, "032x"),
        "span_id": format(span_context.span_id, "016x"),
    }
