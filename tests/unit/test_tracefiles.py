"""Spans written as OTLP-JSON files by the real OpenTelemetry SDK and read back by `aml trace`."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from aml_devtools.tracefiles import read_spans, render_tree, traces_of
from aml_runtime.telemetry import (
    OtlpJsonFileExporter,
    current_trace_ids,
    item_trace,
    item_trace_ids,
)


def _provider(directory: Path, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(directory, service)))
    return provider


def test_an_items_trace_is_read_back_as_a_tree(tmp_path: Path) -> None:
    scheduler = _provider(tmp_path, "scheduler").get_tracer("t")
    adder = _provider(tmp_path, "adder").get_tracer("t")
    add = {"aml.item_id": "r1", "aml.request_id": "r1"}
    with (
        scheduler.start_as_current_span("aml.release", attributes=add),
        adder.start_as_current_span("aml.add", attributes=add),
        adder.start_as_current_span("participant.add", attributes={"aml.attempt": 1}),
    ):
        pass
    with scheduler.start_as_current_span("aml.release", attributes={"aml.item_id": "r2"}):
        pass

    lines = [json.loads(x) for p in tmp_path.glob("*.jsonl") for x in p.read_text().splitlines()]
    first = lines[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(first["traceId"]) == 32 and len(first["spanId"]) == 16  # hex, as OTLP/JSON

    found = traces_of(read_spans(tmp_path), "r1")
    assert len(found) == 1
    [(trace_id, spans)] = found.items()
    assert {s.service for s in spans} == {"scheduler", "adder"}
    tree = render_tree(trace_id, spans)
    assert tree[0] == f"trace {trace_id}"
    assert [line.split("  [")[0] for line in tree[1:]] == [
        "  aml.release",
        "    aml.add",
        "      participant.add",
    ]
    assert "[adder]" in tree[3] and tree[3].endswith("UNSET")
    assert traces_of(read_spans(tmp_path), "nope") == {}


def test_a_question_is_found_by_its_item_id_also_in_old_span_files(tmp_path: Path) -> None:
    searcher = _provider(tmp_path, "searcher").get_tracer("t")
    with searcher.start_as_current_span("aml.search", attributes={"aml.item_id": "j/q1"}):
        pass
    # Written before spans carried `aml.item_id`: a question's id was its `aml.request_id`.
    with searcher.start_as_current_span("aml.search", attributes={"aml.request_id": "j/q0"}):
        pass
    spans = list(read_spans(tmp_path))
    for item_id in ("j/q1", "j/q0"):
        [(_, found)] = traces_of(spans, item_id).items()
        assert [s.name for s in found] == ["aml.search"], item_id


def test_every_release_of_an_item_is_in_the_items_trace(tmp_path: Path) -> None:
    # The global provider can be set once per process; whichever SDK provider holds it records.
    trace.set_tracer_provider(_provider(tmp_path, "scheduler"))
    trace_id, root_id = item_trace_ids("job/item-1")
    with item_trace("aml.release", "job/item-1", item_id="item-1") as first:
        ids = current_trace_ids()
    assert ids, "spans are recorded"
    assert ids["trace_id"] == format(trace_id, "032x")
    with item_trace("aml.release", "job/item-1", item_id="item-1") as again:
        assert current_trace_ids()["trace_id"] == ids["trace_id"]
    for span in (first, again):
        assert span.parent is not None and span.parent.span_id == root_id  # type: ignore[attr-defined]
    with item_trace("aml.release", "job/item-2"):
        assert current_trace_ids()["trace_id"] != ids["trace_id"]
