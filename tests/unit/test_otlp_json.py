"""The span files' OTLP/JSON is written straight from the spans (`aml_runtime.telemetry.otlp_json`)
and must be the document that protobuf's JSON printer made of the encoded request before
(`_reference` below, the former implementation): `aml trace`, `aml team audit` and a collector
the files are replayed into read it unchanged."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from aml_runtime.telemetry import OtlpJsonFileExporter, otlp_json, scrub_span

_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _reference(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The former encoding: the OTLP exporter's protobuf request, printed by protobuf's JSON
    mapping, with the trace and span ids turned from base64 into hex."""
    document: dict[str, Any] = MessageToDict(encode_spans(spans))

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


def _provider(
    resource: Resource, limits: SpanLimits | None = None
) -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


EVERY_TYPE: dict[str, Any] = {
    "aml.item_id": "job-1/q-7",
    "aml.attempt": 2,
    "aml.negative": -(2**63),
    "aml.zero": 0,
    "aml.empty": "",
    "aml.score": 0.25,
    "aml.integral_float": 3.0,
    "aml.zero_float": 0.0,
    "aml.inf": float("inf"),
    "aml.minus_inf": float("-inf"),
    "aml.nan": float("nan"),
    "aml.ok": True,
    "aml.not_ok": False,
    "aml.text": 'Où était-elle ? 東京 🎉 "quoted" \\ \n',
    "aml.strings": ["a", "", "é"],
    "aml.ints": [1, 0, -3],
    "aml.floats": [0.5, 0.0, 1e300],
    "aml.bools": [True, False],
    "aml.nones": ["a", None],
    "aml.nothing": [],
    # Neither encoding holds them: the attribute is dropped, the rest of the span kept.
    "aml.huge": 2**64,
    "aml.surrogate": "bad \udce9 byte",
}


def _spans() -> list[ReadableSpan]:
    """Spans as the services make them, and the odd ones: every attribute type, events, links,
    statuses, remote and local parents, several resources and scopes, dropped counts."""
    scheduler, scheduler_spans = _provider(
        Resource.create({"service.name": "scheduler", "service.version": "1.2"})
    )
    adder, adder_spans = _provider(
        Resource({"service.name": "adder"}, schema_url="https://opentelemetry.io/schemas/1.21.0"),
        SpanLimits(
            max_span_attributes=2,
            max_events=1,
            max_links=1,
            max_event_attributes=1,
            max_link_attributes=1,
        ),
    )
    bare, bare_spans = _provider(Resource({}))

    aml = scheduler.get_tracer("aml")
    httpx = scheduler.get_tracer("opentelemetry.instrumentation.httpx", "0.54b1")
    faststream = scheduler.get_tracer(
        "faststream",
        "0.7.8",
        schema_url="https://opentelemetry.io/schemas/1.11.0",
        attributes={"scope.kind": "broker", "scope.replicas": 3},
    )
    fastapi = scheduler.get_tracer("opentelemetry.instrumentation.fastapi", "")

    # A remote parent with a trace state, as a message's headers bring it.
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        with aml.start_as_current_span(
            "aml.search", kind=SpanKind.CONSUMER, attributes=EVERY_TYPE
        ) as stage:
            stage.add_event("aml.admitted", {"aml.wait_ms": 12.5, "aml.lane": "v1"})
            stage.add_event("aml.nothing")
            with httpx.start_as_current_span(
                "POST",
                kind=SpanKind.CLIENT,
                attributes={"http.request.method": "POST", "url.full": "http://p:8/search?k=1"},
            ) as call:
                call.set_status(Status(StatusCode.ERROR, "ReadTimeout: timed out"))
                call.record_exception(TimeoutError("read timed out"))
            with aml.start_as_current_span("aml.ok") as ok:
                ok.set_status(Status(StatusCode.OK))
    finally:
        context.detach(token)

    with fastapi.start_as_current_span("GET /health", kind=SpanKind.SERVER):
        pass
    with (
        faststream.start_as_current_span("aml.jobs.submitted process", kind=SpanKind.CONSUMER),
        faststream.start_as_current_span("publish", kind=SpanKind.PRODUCER) as producer,
    ):
        linked = producer.get_span_context()
    with aml.start_as_current_span(
        "aml.linked",
        links=[
            Link(linked, {"aml.why": "follows", "aml.n": 1}),
            Link(remote),
        ],
    ):
        pass
    with aml.start_as_current_span(""):  # no name, no attributes
        pass

    with adder.get_tracer("aml").start_as_current_span(
        "aml.add",
        attributes={"a": 1, "b": 2, "c": 3},
        links=[Link(linked, {"x": 1, "y": 2}), Link(remote)],
    ) as add:
        add.add_event("first", {"x": 1, "y": 2})
        add.add_event("second")
    with bare.get_tracer("").start_as_current_span("aml.bare"):
        pass

    spans = [*scheduler_spans.get_finished_spans(), *adder_spans.get_finished_spans()]
    spans += bare_spans.get_finished_spans()
    # As `SanitizingExporter` hands them on: a new ReadableSpan (plain attributes, no limits).
    spans += [scrub_span(span) for span in scheduler_spans.get_finished_spans()]
    # Built by hand: not ended, no scope, an unset status.
    spans.append(
        ReadableSpan(
            name="aml.open",
            context=SpanContext(1, 2, is_remote=False),
            resource=Resource({"service.name": "scheduler"}),
            # Past the SDK's attribute checks: the types only the encoder's own rules cover.
            attributes={"raw": b"\x00\xff", "map": {"k": 1, "n": {"x": [1]}}, "none": {}},
            start_time=1_700_000_000_000_000_000,
        )
    )
    spans.append(
        ReadableSpan(
            name="aml.scoped",
            context=SpanContext(2**128 - 1, 2**64 - 1, is_remote=False),
            parent=SpanContext(2**128 - 1, 0x10, is_remote=False),
            resource=Resource({"service.name": "scheduler"}),
            instrumentation_scope=InstrumentationScope("aml", None, None, {"k": ["v"]}),
            start_time=1,
            end_time=2,
        )
    )
    return spans


def test_the_encoding_is_the_protobuf_printers() -> None:
    spans = _spans()
    assert len({span.resource for span in spans}) == 4
    assert len({span.instrumentation_scope for span in spans}) >= 6
    assert {span.kind for span in spans} == set(SpanKind)
    assert otlp_json(spans) == _reference(spans)
    # Span by span too (a batch of one is the common case of a quiet service), and none at all.
    for span in spans:
        assert otlp_json([span]) == _reference([span])
    assert otlp_json([]) == _reference([]) == {}


def test_an_unencodable_attribute_is_dropped_alone() -> None:
    [stage] = [span for span in _spans() if span.name == "aml.search"][:1]
    [encoded] = otlp_json([stage])["resourceSpans"][0]["scopeSpans"][0]["spans"]
    keys = {attribute["key"] for attribute in encoded["attributes"]}
    assert keys == set(EVERY_TYPE) - {"aml.huge", "aml.surrogate"}


def test_the_file_holds_one_request_per_batch(tmp_path: Path) -> None:
    spans = _spans()
    exporter = OtlpJsonFileExporter(tmp_path, "scheduler")
    exporter.export(spans)
    exporter.export(spans[:1])
    [path] = tmp_path.glob("scheduler-*.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        json.loads(json.dumps(_reference(spans))),
        json.loads(json.dumps(_reference(spans[:1]))),
    ]
