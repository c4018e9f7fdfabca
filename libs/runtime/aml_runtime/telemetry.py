"""OpenTelemetry tracing for every service (SPEC R-8.3 - R-8.5).

One trace per job item: the scheduler starts it when it releases the item (`item_trace`), the
NATS headers carry it from service to service (FastStream's telemetry middleware, installed by
`aml_runtime.broker.make_broker`), each stage adds its span (`stage_span`) and the outgoing HTTP
calls to the participant and the LLM are child spans (httpx instrumentation).

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
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry import context, propagate, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, TraceFlags, Tracer
from opentelemetry.util.types import Attributes

TRACER_NAME = "aml"


class OtlpJsonFileExporter(SpanExporter):
    """Appends each batch as one OTLP-JSON line to `<dir>/<service>-<pid>.jsonl`: the format an
    OTLP/HTTP JSON receiver accepts, so the files can also be replayed into a collector."""

    def __init__(self, directory: Path, service: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{service}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(otlp_json(encode_spans(spans)), separators=(",", ":"))
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def otlp_json(request: Any) -> dict[str, Any]:
    """An ExportTraceServiceRequest in the OTLP/HTTP JSON encoding: the protobuf JSON mapping,
    except that trace and span ids are hex strings, not base64."""
    document: dict[str, Any] = MessageToDict(request)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_FIELDS and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    fix(document)
    return document


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
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
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


def tracer() -> Tracer:
    return trace.get_tracer(TRACER_NAME)


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
    """Continue the trace a message carries in its headers (W3C trace context, as FastStream's
    telemetry middleware writes it on publish)."""
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
