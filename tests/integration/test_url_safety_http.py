"""`SafeTransport` against real local servers on 127.0.0.1 (SPEC R-4.1): it dials the checked
address while keeping the original Host header and TLS server name, checks again on every
request, and a redirect to a private address is never followed.

Only loopback is ever dialled: a guard on the connection backend fails the test before any
other address could be contacted, so a regression cannot send traffic to 10.0.0.1.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aml_pipeline.participants import CallFailed, Endpoint, ParticipantClient
from aml_pipeline.urlsafety import SafeTransport, UnsafeUrl
from aml_runtime.settings import ParticipantCallSettings

NAME = "participant.test"


@dataclass
class Server:
    port: int
    requests: list[dict[str, str]] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)


@pytest.fixture
def dialled(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    connect = httpcore.AnyIOBackend.connect_tcp

    async def loopback_only(self: Any, host: str, port: int, **kwargs: Any) -> Any:
        seen.append((host, port))
        if not ipaddress.ip_address(host).is_loopback:
            raise AssertionError(f"the client tried to connect to {host}:{port}")
        return await connect(self, host, port, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", loopback_only)
    return seen


async def serve(
    status: int, headers: dict[str, str], tls: ssl.SSLContext | None = None
) -> tuple[Server, asyncio.Server]:
    """A minimal HTTP/1.1 server: records each request's headers and answers `status`."""
    state = Server(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Connections are kept alive, so a client that reused one would be noticed.
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                request = {"request-line": lines[0]}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        request[name.strip().lower()] = value.strip()
                await reader.readexactly(int(request.get("content-length", "0")))
                state.requests.append(request)
                writer.write(
                    f"HTTP/1.1 {status} X\r\n{extra}Content-Length: 2\r\n\r\n{{}}".encode()
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    if tls is not None:

        def record_sni(sock: Any, server_name: str | None, context: Any) -> None:
            state.server_names.append(server_name)

        tls.sni_callback = record_sni
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    return state, server


@pytest.fixture
async def redirecting() -> AsyncIterator[Server]:
    state, server = await serve(302, {"Location": "http://10.0.0.1/search"})
    async with server:
        yield state


@pytest.fixture
async def plain() -> AsyncIterator[Server]:
    state, server = await serve(200, {"Content-Type": "application/json"})
    async with server:
        yield state


def mapping(*answers: Iterable[str]) -> Callable[[str, int], list[str]]:
    """A resolver that gives NAME the next answer on each lookup (the last one repeats)."""
    remaining = [list(answer) for answer in answers]

    def resolve(host: str, port: int) -> list[str]:
        assert host == NAME, host
        return remaining.pop(0) if len(remaining) > 1 else remaining[0]

    return resolve


async def test_a_redirect_to_a_private_address_is_not_followed(
    redirecting: Server, dialled: list[tuple[str, int]]
) -> None:
    settings = ParticipantCallSettings(allow_loopback_targets=True, participant_max_attempts=3)
    client = ParticipantClient.from_settings(settings)
    base = f"http://127.0.0.1:{redirecting.port}"
    endpoint = Endpoint(
        add_url=f"{base}/add",
        search_url=f"{base}/search",
        health_url=f"{base}/health",
        auth_method="none",
    )

    async def observe(attempt: object) -> None:
        pass

    with pytest.raises(CallFailed) as failed:
        await client.search(endpoint, b'{"query": "q"}', 10, observe)
    assert (failed.value.kind, failed.value.reason) == (
        "contract_error",
        "search: unexpected HTTP 302",
    )
    assert await client.health(endpoint) is False
    await client.aclose()
    assert [r["request-line"] for r in redirecting.requests] == [
        "POST /search HTTP/1.1",
        "GET /health HTTP/1.1",
    ]
    assert {host for host, _ in dialled} == {"127.0.0.1"}


async def test_a_followed_redirect_would_be_refused_before_connecting(
    redirecting: Server, dialled: list[tuple[str, int]]
) -> None:
    # A client that did follow redirects still cannot reach the private address: the
    # transport checks the redirect target like any other request.
    transport = SafeTransport(allow_loopback=True)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as client:
        with pytest.raises(UnsafeUrl, match=r"^10\.0\.0\.1 is a private address$"):
            await client.get(f"http://127.0.0.1:{redirecting.port}/search")
    assert len(redirecting.requests) == 1
    assert dialled == [("127.0.0.1", redirecting.port)]


async def test_the_checked_address_is_dialled_with_the_original_host_header(
    plain: Server, dialled: list[tuple[str, int]]
) -> None:
    transport = SafeTransport(allow_loopback=True, resolver=mapping(["127.0.0.1"]))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.post(f"http://{NAME}:{plain.port}/add?x=1", content=b"{}")
    assert response.status_code == 200
    # The caller sees the URL it asked for, not the address it was sent to.
    assert response.request.url == f"http://{NAME}:{plain.port}/add?x=1"
    assert plain.requests[0]["request-line"] == "POST /add?x=1 HTTP/1.1"
    assert plain.requests[0]["host"] == f"{NAME}:{plain.port}"
    assert dialled == [("127.0.0.1", plain.port)]


async def test_every_request_is_checked_again(
    plain: Server, dialled: list[tuple[str, int]]
) -> None:
    # The name changes its answer between two requests (DNS rebinding): the second one is
    # refused, and nothing is dialled for it.
    transport = SafeTransport(allow_loopback=True, resolver=mapping(["127.0.0.1"], ["10.0.0.1"]))
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(f"http://{NAME}:{plain.port}/health")).status_code == 200
        with pytest.raises(UnsafeUrl, match=r"participant\.test resolves to 10\.0\.0\.1"):
            await client.get(f"http://{NAME}:{plain.port}/health")
    assert len(plain.requests) == 1
    assert dialled == [("127.0.0.1", plain.port)]


async def test_loopback_is_refused_without_the_setting(
    plain: Server, dialled: list[tuple[str, int]]
) -> None:
    transport = SafeTransport(allow_loopback=False, resolver=mapping(["127.0.0.1"]))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(UnsafeUrl, match="loopback"):
            await client.get(f"http://{NAME}:{plain.port}/health")
    assert plain.requests == []
    assert dialled == []


def certificate_for(name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for `name` only: the server's context, and a client context
    that trusts it."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # load_cert_chain reads files only; an in-memory pair goes through a temporary directory.
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=cert_pem.decode())
    return server, client


async def test_https_keeps_the_original_name_for_sni_and_verification(
    dialled: list[tuple[str, int]],
) -> None:
    server_tls, client_tls = certificate_for(NAME)
    state, server = await serve(200, {}, tls=server_tls)

    def both_local(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async with server:
        transport = SafeTransport(allow_loopback=True, resolver=both_local, verify=client_tls)
        async with httpx.AsyncClient(transport=transport) as client:
            for _ in range(2):
                response = await client.get(f"https://{NAME}:{state.port}/health")
                assert response.status_code == 200
            # The same address under another name: the open connection, verified for NAME,
            # must not be reused, and a new one fails verification (the certificate is
            # NAME's only).
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"https://other.test:{state.port}/health")
    assert state.server_names == [NAME, "other.test"]
    assert [r["host"] for r in state.requests] == [f"{NAME}:{state.port}"] * 2
    assert dialled == [("127.0.0.1", state.port)] * 2
