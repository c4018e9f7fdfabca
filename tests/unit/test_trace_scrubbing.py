"""No query string or userinfo of a URL reaches an exported span (issue 15, item 6): a key sent
as `?key=` is recorded by the httpx client and FastAPI server instrumentations as requested, and
`aml_runtime.telemetry.SanitizingExporter` cuts it before any exporter sees the span."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aml_runtime.telemetry import SanitizingExporter, scrub_attributes, strip_url

SECRET = "s3cr3t-value"


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def exported() -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SanitizingExporter(memory)))
    return provider, memory


def _everything(span: ReadableSpan) -> str:
    """All a span carries, as text (what an exporter could write)."""
    return str(span.to_json())


def test_client_span_of_a_url_with_a_key_holds_no_secret(
    server: str, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exported
    with httpx.Client(trust_env=False) as client:
        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
        client.get(f"http://user:{SECRET}@{server}/search?key={SECRET}&x=1#frag-{SECRET}")
        with pytest.raises(httpx.ConnectError):
            # An error event carries the exception's message (with the URL in it for some).
            client.get(f"http://127.0.0.1:1/add?key={SECRET}")
    spans = memory.get_finished_spans()
    assert len(spans) == 2
    for span in spans:
        text = _everything(span)
        assert SECRET not in text, text
    url = spans[0].attributes or {}
    recorded = url.get("url.full") or url.get("http.url")
    assert recorded == f"http://{server}/search"


def test_server_span_of_a_request_with_a_key_holds_no_secret(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exported
    app = FastAPI()

    @app.get("/v1/jobs")
    def jobs() -> dict[str, str]:
        return {"ok": "yes"}

    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    try:
        with TestClient(app) as client:
            assert client.get(f"/v1/jobs?key={SECRET}").status_code == 200
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    spans = memory.get_finished_spans()
    assert spans
    for span in spans:
        assert SECRET not in _everything(span), _everything(span)
    attributes = {k: v for span in spans for k, v in (span.attributes or {}).items()}
    assert "url.query" not in attributes
    assert any(str(v).endswith("/v1/jobs") for v in attributes.values())


def test_scrubbing_rules() -> None:
    assert strip_url("GET https://u:p@h.example/a/b?key=1#f failed") == (
        "GET https://h.example/a/b failed"
    )
    assert strip_url("no url ? here") == "no url ? here"
    plain = {"aml.job_id": "j1", "http.url": "http://h/x"}
    assert scrub_attributes(plain) is plain
    assert scrub_attributes({"http.target": "/x?key=1", "url.query": "key=1", "n": 3}) == {
        "http.target": "/x",
        "n": 3,
    }
    assert json.dumps(scrub_attributes({"url.full": f"http://h/?key={SECRET}"})).count(SECRET) == 0
