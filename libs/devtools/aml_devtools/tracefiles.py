"""Reading the OTLP-JSON span files of the embedded stack (`aml trace ITEM_ID`): every trace
that touched a work item (an Add's request_id or a question's id), printed as a tree with
service, duration and status."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR", "STATUS_CODE_OK": "OK", "STATUS_CODE_ERROR": "ERROR"}


class TraceSpan(BaseModel):
    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any]

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(value: dict[str, Any]) -> Any:
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    if "intValue" in value:
        return int(value["intValue"])
    return None


def _attributes(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items}


def read_spans(directory: Path) -> Iterator[TraceSpan]:
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            for resource_spans in json.loads(line).get("resourceSpans", []):
                resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
                service = str(resource.get("service.name", "?"))
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        yield TraceSpan(
                            service=service,
                            trace_id=span["traceId"],
                            span_id=span["spanId"],
                            parent_id=span.get("parentSpanId") or None,
                            name=span["name"],
                            start_ns=int(span["startTimeUnixNano"]),
                            end_ns=int(span["endTimeUnixNano"]),
                            status=_STATUS.get(span.get("status", {}).get("code", 0), "UNSET"),
                            attributes=_attributes(span.get("attributes", [])),
                        )


def traces_of(spans: Iterable[TraceSpan], item_id: str) -> dict[str, list[TraceSpan]]:
    """Every trace holding a span of the work item `item_id` (an Add's request_id or a
    question's id), with all its spans."""
    by_trace: dict[str, list[TraceSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    return {
        trace_id: sorted(members, key=lambda s: s.start_ns)
        for trace_id, members in by_trace.items()
        if any(_item_of(s) == item_id for s in members)
    }


def _item_of(span: TraceSpan) -> Any:
    """The work item a span belongs to: `aml.item_id`; span files written before spans carried
    it name the item `aml.request_id` (a question's id too)."""
    return span.attributes.get("aml.item_id", span.attributes.get("aml.request_id"))


def render_tree(trace_id: str, spans: list[TraceSpan]) -> list[str]:
    ids = {span.span_id for span in spans}
    children: dict[str | None, list[TraceSpan]] = defaultdict(list)
    for span in spans:
        # A parent that is not in the files (not exported yet) makes a span a root here.
        children[span.parent_id if span.parent_id in ids else None].append(span)
    lines = [f"trace {trace_id}"]

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            lines.append(
                f"{'  ' * (depth + 1)}{span.name}  [{span.service}]  "
                f"{span.duration_ms:.1f} ms  {span.status}"
            )
            walk(span.span_id, depth + 1)

    walk(None, 0)
    return lines
