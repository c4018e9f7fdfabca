"""Participant URL safety (SPEC R-4.1): URL checks, address checks, IPv4 spellings, resolution
through an injected resolver, and the refusals of `SafeTransport`, the participant client and
the registration route.

Nothing here opens a connection: addresses are checked, never dialled, and a guard makes any
attempt to connect fail the test.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Iterable, Iterator

import httpcore
import httpx
import pytest
from fake_stores import MemoryLimitStore
from fastapi import FastAPI
from pydantic import SecretStr

from aml_gateway.deps import Services
from aml_gateway.limits import Limits
from aml_gateway.routes import admin
from aml_gateway.settings import GatewaySettings
from aml_pipeline.participants import Attempt, CallFailed, Endpoint, ParticipantClient, RetryPolicy
from aml_pipeline.urlsafety import (
    SafeTransport,
    UnresolvableHost,
    UnsafeUrl,
    UrlCheck,
    check_address,
    check_url,
    parse_ip_literal,
    resolve_and_check,
)

LOOPBACK_SPELLINGS = ["2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "0x7f000001", "127.0.1"]


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a unit test tried to connect: {args[1:]} {kwargs}")

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", refuse)


def resolver(table: dict[str, list[str]]) -> Callable[[str, int], Iterable[str]]:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host} must be read as an address, not resolved as a name")


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# --- check_url --------------------------------------------------------------------------------


def test_https_url_is_accepted_with_its_default_port() -> None:
    assert check_url("https://memory.example.com/v1/add", allow_loopback=False) == UrlCheck(
        scheme="https", host="memory.example.com", port=443, insecure=False
    )


def test_http_url_is_accepted_but_flagged_insecure() -> None:
    checked = check_url("HTTP://Memory.Example.com:8080/search?x=1", allow_loopback=False)
    assert (checked.scheme, checked.host, checked.port, checked.insecure) == (
        "http",
        "memory.example.com",
        8080,
        True,
    )


@pytest.mark.parametrize("scheme", ["ftp", "file", "gopher", "ws", "javascript"])
def test_non_http_schemes_are_refused(scheme: str) -> None:
    with pytest.raises(UnsafeUrl, match=f"^scheme {scheme} is not allowed"):
        check_url(f"{scheme}://memory.example.com/x", allow_loopback=False)


def test_url_without_scheme_is_refused() -> None:
    with pytest.raises(UnsafeUrl, match="no scheme"):
        check_url("//memory.example.com/x", allow_loopback=False)


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pass@memory.example.com/add",
        "https://user@memory.example.com/add",
        "https://:pass@memory.example.com/add",
        "https://@memory.example.com/add",
        "https://memory.example.com@10.0.0.1/add",
    ],
)
def test_credentials_in_the_url_are_refused(url: str) -> None:
    with pytest.raises(UnsafeUrl, match=r"^credentials in the URL are not allowed$"):
        check_url(url, allow_loopback=False)


@pytest.mark.parametrize("url", ["https:///add", "https://:8443/add", "https:add"])
def test_url_without_host_is_refused(url: str) -> None:
    with pytest.raises(UnsafeUrl, match="no host"):
        check_url(url, allow_loopback=False)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://memory.example.com:0/", "port 0 is not valid"),
        ("https://memory.example.com:65536/", "malformed"),
        ("https://memory.example.com:https/", "malformed"),
        ("https://[::1/", "malformed"),
    ],
)
def test_invalid_ports_and_malformed_urls_are_refused(url: str, reason: str) -> None:
    with pytest.raises(UnsafeUrl, match=reason):
        check_url(url, allow_loopback=False)


@pytest.mark.parametrize(
    "url",
    ["https://memory.example.com\\@10.0.0.1/", "https://memory.example.com /", "https://a\tb/"],
)
def test_characters_parsers_disagree_on_are_refused(url: str) -> None:
    with pytest.raises(UnsafeUrl, match="whitespace, control characters or backslashes"):
        check_url(url, allow_loopback=False)


def test_non_ascii_host_must_be_punycode() -> None:
    with pytest.raises(UnsafeUrl, match="punycode"):
        check_url("https://bücher.example/", allow_loopback=False)
    check_url("https://xn--bcher-kva.example/", allow_loopback=False)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/", "http://[::1]:8080/", "http://2130706433/"]
)
def test_literal_loopback_in_the_url_depends_on_the_setting(url: str) -> None:
    with pytest.raises(UnsafeUrl, match="loopback"):
        check_url(url, allow_loopback=False)
    assert check_url(url, allow_loopback=True).insecure


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://10.1.2.3/", "10.1.2.3"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://0x0a.0.0.1/", "10.0.0.1"),
        ("http://[::ffff:10.0.0.1]/", "10.0.0.1"),
    ],
)
def test_literal_private_addresses_are_refused_without_dns(url: str, address: str) -> None:
    with pytest.raises(UnsafeUrl, match=f"^{address}"):
        check_url(url, allow_loopback=True)


# --- check_address ----------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "127.255.0.9", "::1"])
def test_loopback_is_refused_unless_allowed(address: str) -> None:
    with pytest.raises(UnsafeUrl, match="loopback"):
        check_address(ip(address), allow_loopback=False)
    check_address(ip(address), allow_loopback=True)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.1", "a private address"),
        ("10.255.255.255", "a private address"),
        ("172.16.0.1", "a private address"),
        ("172.31.255.254", "a private address"),
        ("192.168.1.1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "an unspecified address"),
        ("100.64.0.1", "shared address space"),
        ("100.127.255.254", "shared address space"),
        ("224.0.0.1", "a multicast address"),
        ("239.255.255.250", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("192.0.2.1", "a documentation address"),
        ("198.51.100.7", "a documentation address"),
        ("203.0.113.9", "a documentation address"),
        ("2001:db8::1", "a documentation address"),
        ("3fff::1", "a documentation address"),
        ("198.18.0.1", "a benchmarking address"),
        ("192.0.0.8", "an IETF protocol assignment address"),
        ("fc00::1", "a unique-local address"),
        ("fd12:3456:789a::1", "a unique-local address"),
        ("fec0::1", "a site-local address"),
        ("100::1", "a discard-only address"),
        ("::10.0.0.1", "IPv4-compatible"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo address"),
        ("fe80::1%eth0", "zone index"),
    ],
)
def test_non_public_addresses_are_refused(address: str, reason: str) -> None:
    for allow_loopback in (False, True):
        with pytest.raises(UnsafeUrl, match=reason):
            check_address(ip(address), allow_loopback=allow_loopback)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("::ffff:10.0.0.1", r"^10\.0\.0\.1 \(mapped in .*\) is a private address$"),
        ("::ffff:169.254.169.254", r"^169\.254\.169\.254 \(mapped .* link-local"),
        ("::ffff:0.0.0.0", "unspecified"),
        ("::ffff:224.0.0.1", "multicast"),
        ("2002:a00:1::1", r"^10\.0\.0\.1 \(6to4 in 2002:a00:1::1\) is a private address$"),
        ("2002:a9fe:a9fe::1", r"^169\.254\.169\.254 \(6to4"),
        ("64:ff9b::a00:1", r"^10\.0\.0\.1 \(NAT64 in 64:ff9b::a00:1\) is a private address$"),
        ("64:ff9b::7f00:1", r"^127\.0\.0\.1 \(NAT64"),
        ("64:ff9b:1::a00:1", "local-use NAT64"),
    ],
)
def test_ipv6_embedding_a_refused_ipv4_is_refused(address: str, reason: str) -> None:
    for allow_loopback in (False, True):
        with pytest.raises(UnsafeUrl, match=reason):
            check_address(ip(address), allow_loopback=allow_loopback)


def test_ipv4_mapped_loopback_follows_the_loopback_setting() -> None:
    with pytest.raises(UnsafeUrl, match=r"^127\.0\.0\.1 \(mapped in .*\) is a loopback address$"):
        check_address(ip("::ffff:127.0.0.1"), allow_loopback=False)
    check_address(ip("::ffff:127.0.0.1"), allow_loopback=True)


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses_are_accepted(address: str) -> None:
    # Checked only: nothing is ever sent to these addresses.
    check_address(ip(address), allow_loopback=False)


# --- IPv4 spellings ---------------------------------------------------------------------------


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_ipv4_spellings_are_read_as_the_address_they_mean(host: str) -> None:
    assert parse_ip_literal(host) == ip("127.0.0.1")


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("3232235777", "192.168.1.1"),
        ("0300.0250.01.01", "192.168.1.1"),
        ("0xc0.0xa8.0x1.0x1", "192.168.1.1"),
        ("0xA9FEA9FE", "169.254.169.254"),
        ("10.1", "10.0.0.1"),
        ("10.0.1", "10.0.0.1"),
        ("0", "0.0.0.0"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("::1", "::1"),
    ],
)
def test_other_literal_spellings(host: str, address: str) -> None:
    assert parse_ip_literal(host) == ip(address)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with glibc inet_aton")
@pytest.mark.parametrize(
    "host",
    [*LOOPBACK_SPELLINGS, "3232235777", "0300.0250.01.01", "1.0x10.3", "1.16777215", "00", "0"],
)
def test_spellings_match_the_system_inet_aton(host: str) -> None:
    assert parse_ip_literal(host) == ipaddress.IPv4Address(socket.inet_aton(host))


@pytest.mark.parametrize("host", ["memory.example.com", "localhost", "1.example", "x0x7f"])
def test_names_are_not_literals(host: str) -> None:
    assert parse_ip_literal(host) is None


@pytest.mark.parametrize(
    "host", ["256.0.0.1", "1.2.3.4.5", "08.0.0.1", "0x100.0.0.1", "1.16777216", "a.123", "0x"]
)
def test_numeric_hosts_that_are_no_valid_address_are_refused(host: str) -> None:
    with pytest.raises(UnsafeUrl, match="looks like an IPv4 address"):
        parse_ip_literal(host)


# --- resolve_and_check ------------------------------------------------------------------------


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_literal_spellings_are_checked_and_never_resolved(host: str) -> None:
    with pytest.raises(UnsafeUrl, match=r"^127\.0\.0\.1 is a loopback address$"):
        resolve_and_check(host, 80, allow_loopback=False, resolver=no_dns)
    assert resolve_and_check(host, 80, allow_loopback=True, resolver=no_dns) == [ip("127.0.0.1")]


@pytest.mark.parametrize("answer", ["10.0.0.5", "172.20.1.1", "192.168.0.10", "fd00::5"])
def test_name_resolving_to_a_private_address_is_refused(answer: str) -> None:
    resolve = resolver({"internal.example.com": [answer]})
    with pytest.raises(UnsafeUrl, match=f"^host internal.example.com resolves to {answer} is"):
        resolve_and_check("internal.example.com", 443, allow_loopback=True, resolver=resolve)


def test_one_private_address_among_public_ones_refuses_the_name() -> None:
    resolve = resolver({"mixed.example.com": ["8.8.8.8", "10.0.0.1", "1.1.1.1"]})
    with pytest.raises(UnsafeUrl, match=r"resolves to 10\.0\.0\.1 is a private address"):
        resolve_and_check("mixed.example.com", 443, allow_loopback=False, resolver=resolve)


def test_public_name_returns_every_checked_address() -> None:
    resolve = resolver(
        {"memory.example.com": ["2001:4860:4860::8888", "8.8.8.8", "8.8.8.8", "8.8.4.4"]}
    )
    assert resolve_and_check("memory.example.com", 443, allow_loopback=False, resolver=resolve) == [
        ip("2001:4860:4860::8888"),
        ip("8.8.8.8"),
        ip("8.8.4.4"),
    ]


def test_loopback_name_is_accepted_only_with_the_setting() -> None:
    resolve = resolver({"localhost": ["::1", "127.0.0.1"]})
    with pytest.raises(UnsafeUrl, match="resolves to ::1 is a loopback address"):
        resolve_and_check("localhost", 8080, allow_loopback=False, resolver=resolve)
    assert resolve_and_check("localhost", 8080, allow_loopback=True, resolver=resolve) == [
        ip("::1"),
        ip("127.0.0.1"),
    ]


def test_unresolvable_name_is_its_own_error() -> None:
    with pytest.raises(UnresolvableHost, match="could not be resolved"):
        resolve_and_check("nowhere.example", 443, allow_loopback=False, resolver=resolver({}))
    empty = resolver({"empty.example": []})
    with pytest.raises(UnresolvableHost, match="no addresses"):
        resolve_and_check("empty.example", 443, allow_loopback=False, resolver=empty)


@pytest.mark.parametrize("host", ["a..b", "a" * 64 + ".example.com"])
def test_names_the_idna_codec_refuses_are_unresolvable_not_a_crash(host: str) -> None:
    # The real system resolver: it raises UnicodeError, not OSError, for these names.
    with pytest.raises(UnresolvableHost, match="could not be resolved"):
        resolve_and_check(host, 443, allow_loopback=False)


def test_resolver_answer_that_is_no_address_is_refused() -> None:
    resolve = resolver({"odd.example": ["not-an-ip"]})
    with pytest.raises(UnsafeUrl, match="not an address"):
        resolve_and_check("odd.example", 443, allow_loopback=False, resolver=resolve)


# --- SafeTransport and the participant client refuse before connecting -----------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://internal.example.com/health",
        "http://10.0.0.1/health",
        "http://2130706433/health",
        "http://[::ffff:10.0.0.1]/health",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
async def test_safe_transport_refuses_before_connecting(url: str) -> None:
    transport = SafeTransport(
        allow_loopback=False, resolver=resolver({"internal.example.com": ["10.0.0.1"]})
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(UnsafeUrl):
            await client.get(url)


async def test_safe_transport_maps_unresolvable_hosts_to_connect_errors() -> None:
    transport = SafeTransport(allow_loopback=False, resolver=resolver({}))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError, match="could not be resolved"):
            await client.get("https://nowhere.example/health")


async def test_participant_client_fails_an_unsafe_target_at_once() -> None:
    transport = SafeTransport(
        allow_loopback=False, resolver=resolver({"internal.example.com": ["192.168.7.7"]})
    )
    client = ParticipantClient(
        httpx.AsyncClient(transport=transport), RetryPolicy(max_attempts=5), timeout=5.0
    )
    endpoint = Endpoint(
        add_url="https://internal.example.com/add",
        search_url="https://internal.example.com/search",
        health_url="https://internal.example.com/health",
        auth_method="none",
    )
    attempts: list[Attempt] = []

    async def observe(attempt: Attempt) -> None:
        attempts.append(attempt)

    with pytest.raises(CallFailed) as failed:
        await client.search(endpoint, b"{}", 10, observe)
    assert failed.value.kind == "wrong_url"
    assert failed.value.reason == (
        "search: host internal.example.com resolves to 192.168.7.7 is a private address"
    )
    assert [(a.attempt, a.outcome, a.error_class) for a in attempts] == [(1, "final", "UnsafeUrl")]
    assert await client.health(endpoint) is False
    await client.aclose()


def test_participant_client_from_settings_uses_the_safe_transport() -> None:
    from aml_runtime.settings import ParticipantCallSettings

    client = ParticipantClient.from_settings(ParticipantCallSettings(allow_loopback_targets=True))
    transport = client._http._transport
    assert isinstance(transport, SafeTransport)
    assert transport._allow_loopback is True
    assert client._http.follow_redirects is False


# --- registration (gateway admin route) -------------------------------------------------------

ADMIN_TOKEN = "admin-token-for-tests"


@pytest.fixture
def gateway() -> Iterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(admin.router)
    settings = GatewaySettings(admin_token=SecretStr(ADMIN_TOKEN), allow_loopback_targets=False)
    # URLs are refused before any store is touched, so none is needed here.
    services = Services(settings, db=None, broker=None, box=None)  # type: ignore[arg-type]
    # The admin check reads the shared failed-authentication count: from a fake store here.
    services.limits = Limits.from_settings(settings, MemoryLimitStore())  # type: ignore[arg-type]
    app.state.services = services
    yield httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway.test",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )


def registration(**urls: str) -> dict[str, object]:
    return {
        "team": "t",
        "system_name": "s",
        "version_label": "v1",
        "add_url": "https://8.8.8.8/add",
        "search_url": "https://8.8.8.8/search",
        "health_url": "https://8.8.8.8/health",
        "memory_system_key": "msk-test",
    } | urls


@pytest.mark.parametrize(
    ("urls", "reason"),
    [
        ({"add_url": "http://127.0.0.1:9000/add"}, "add_url: 127.0.0.1 is a loopback address"),
        ({"search_url": "http://10.0.0.1/search"}, "search_url: 10.0.0.1 is a private address"),
        (
            {"health_url": "http://169.254.169.254/"},
            "health_url: 169.254.169.254 is a link-local address",
        ),
        ({"add_url": "http://2130706433/add"}, "add_url: 127.0.0.1 is a loopback address"),
        ({"add_url": "http://[::ffff:10.0.0.1]/add"}, "add_url: 10.0.0.1 (mapped in"),
        (
            {"search_url": "https://user:pw@8.8.8.8/search"},
            "search_url: credentials in the URL are not allowed",
        ),
    ],
)
async def test_registration_refuses_unsafe_urls(
    gateway: httpx.AsyncClient, urls: dict[str, str], reason: str
) -> None:
    response = await gateway.post("/v1/admin/versions", json=registration(**urls))
    assert response.status_code == 422
    assert response.json()["detail"]["reason"].startswith(reason)
