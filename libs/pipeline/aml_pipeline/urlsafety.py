"""Participant URL safety (SPEC R-4.1), checked when a URL is registered and before every
connection.

A participant names its own endpoints, so a URL is untrusted input that could point AML at
its own infrastructure (a cloud metadata service, a database on the private network). The
checks are therefore made on addresses, never on names: a host is resolved once, every address
it resolves to is checked, and the connection is then made to a checked address, so a name
that changes its answer between check and connection (DNS rebinding) cannot steer AML
elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Literal
from urllib.parse import urlsplit

import anyio.to_thread
import httpx
from pydantic import BaseModel, ConfigDict

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Iterable[str]]


class UnsafeUrl(ValueError):
    """A URL or address AML must not connect to; `reason` is meant for the participant."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnresolvableHost(UnsafeUrl):
    """The host name has no address right now: possibly a passing DNS failure, so a caller may
    treat it as a network error rather than as a final refusal."""


class UrlCheck(BaseModel):
    model_config = ConfigDict(frozen=True)

    scheme: Literal["http", "https"]
    # Lower-cased, without IPv6 brackets: the form `resolve_and_check` expects.
    host: str
    port: int
    # Plain http is allowed but discouraged: callers warn when this is set.
    insecure: bool


# Ranges refused on top of `not is_global`. `is_global` alone is not enough: it calls
# multicast global, and its tables differ between Python releases, so the ranges names
# are listed here explicitly and stay refused whatever the interpreter thinks.
_V4_REFUSED: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "an unspecified/'this network' address"),
        ("10.0.0.0/8", "a private address"),
        ("100.64.0.0/10", "a shared address space (carrier-grade NAT) address"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", "a link-local address"),
        ("172.16.0.0/12", "a private address"),
        ("192.0.0.0/24", "an IETF protocol assignment address"),
        ("192.0.2.0/24", "a documentation address"),
        ("192.88.99.0/24", "a 6to4 relay anycast address"),
        ("192.168.0.0/16", "a private address"),
        ("198.18.0.0/15", "a benchmarking address"),
        ("198.51.100.0/24", "a documentation address"),
        ("203.0.113.0/24", "a documentation address"),
        ("224.0.0.0/4", "a multicast address"),
        ("240.0.0.0/4", "a reserved address"),
    )
)
_V6_REFUSED: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), why)
    for net, why in (
        ("::/96", "an IPv4-compatible (deprecated) or unspecified address"),
        ("64:ff9b:1::/48", "a local-use NAT64 address"),
        ("100::/64", "a discard-only address"),
        ("2001::/23", "an IETF protocol assignment address (Teredo, ORCHID, ...)"),
        ("2001:db8::/32", "a documentation address"),
        ("3fff::/20", "a documentation address"),
        ("5f00::/16", "a segment routing (SRv6) address"),
        ("fc00::/7", "a unique-local address"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a site-local address"),
        ("ff00::/8", "a multicast address"),
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

# inet_aton reads each dot-separated part as hex (0x...), octal (leading 0) or decimal.
_INET_ATON_PART = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")
# A last label that is a number means the host was meant as an IPv4 address, never a name
# (no top-level domain is numeric; the WHATWG URL standard reads hosts the same way).
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


def check_url(url: str, *, allow_loopback: bool) -> UrlCheck:
    """The checks that need no DNS: scheme, credentials, host and port, and the address
    itself when the host is a literal one (in any spelling)."""
    # Different URL parsers disagree about whitespace, control characters and backslashes;
    # refusing them means the host checked here is the host the HTTP client connects to.
    if _FORBIDDEN_CHARS.search(url):
        raise UnsafeUrl("the URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"the URL is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise UnsafeUrl("the URL has no scheme (only http and https are allowed)")
    if scheme not in ("http", "https"):
        raise UnsafeUrl(f"scheme {scheme} is not allowed (only http and https are allowed)")
    if "@" in parts.netloc:
        raise UnsafeUrl("credentials in the URL are not allowed")
    host = parts.hostname
    if not host:
        raise UnsafeUrl("the URL has no host")
    if not host.isascii():
        raise UnsafeUrl("the host must be ASCII (write international names in punycode)")
    if port == 0:
        raise UnsafeUrl("port 0 is not valid")
    if port is None:
        port = 443 if scheme == "https" else 80
    literal = parse_ip_literal(host)
    if literal is not None:
        check_address(literal, allow_loopback=allow_loopback)
    return UrlCheck(scheme=scheme, host=host, port=port, insecure=scheme == "http")


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a literal host means, or None when the host is a name.

    IPv4 is read as `inet_aton` reads it (`2130706433`, `0177.0.0.1`, `0x7f.0.0.1` and `127.1`
    all mean 127.0.0.1), because that is how the system resolver would read it if the host were
    passed on as a name. A host whose last label is numeric but that is no valid address is
    refused rather than sent to DNS as a name.
    """
    text = host.strip("[]") if host.startswith("[") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if ":" in text:
        raise UnsafeUrl(f"host {host} is not a valid IPv6 address")
    # A single trailing dot still means the same address to resolvers that accept it.
    text = text.removesuffix(".")
    if not _NUMERIC_LABEL.fullmatch(text.rsplit(".", 1)[-1]):
        return None
    address = _inet_aton(text)
    if address is None:
        raise UnsafeUrl(f"host {host} looks like an IPv4 address but is not a valid one")
    return address


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if len(parts) > 4 or not all(_INET_ATON_PART.fullmatch(part) for part in parts):
        return None
    values = [_part_value(part) for part in parts]
    *head, last = values
    # Leading parts are one byte each; the last one fills all the bytes that remain.
    if any(value > 0xFF for value in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for index, value in enumerate(head):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _part_value(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:], 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)
    return int(part)


def check_address(ip: IPAddress, *, allow_loopback: bool) -> None:
    """Refuse any address that is not plainly a public unicast one (R-4.1)."""
    if isinstance(ip, ipaddress.IPv6Address):
        _check_v6(ip, allow_loopback=allow_loopback)
    else:
        _check_v4(ip, allow_loopback=allow_loopback)


def _check_v4(ip: ipaddress.IPv4Address, *, allow_loopback: bool, via: str = "") -> None:
    if ip.is_loopback and allow_loopback:
        return
    for network, why in _V4_REFUSED:
        if ip in network:
            raise UnsafeUrl(f"{ip}{via} is {why}")
    if not ip.is_global:
        raise UnsafeUrl(f"{ip}{via} is not a public address")


def _check_v6(ip: ipaddress.IPv6Address, *, allow_loopback: bool) -> None:
    if ip.scope_id:
        raise UnsafeUrl(f"{ip} carries a zone index, which only local addresses use")
    if ip.is_unspecified:
        raise UnsafeUrl(f"{ip} is an unspecified address")
    if ip.is_loopback:
        if allow_loopback:
            return
        raise UnsafeUrl(f"{ip} is a loopback address")
    # Addresses that carry an IPv4 address are judged by that address: the packet ends up there.
    if ip.ipv4_mapped is not None:
        _check_v4(ip.ipv4_mapped, allow_loopback=allow_loopback, via=f" (mapped in {ip})")
        return
    if ip in _NAT64:
        embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        _check_v4(embedded, allow_loopback=False, via=f" (NAT64 in {ip})")
    if ip.sixtofour is not None:
        _check_v4(ip.sixtofour, allow_loopback=False, via=f" (6to4 in {ip})")
    if ip.teredo is not None:
        raise UnsafeUrl(f"{ip} is a Teredo address")
    for network, why in _V6_REFUSED:
        if ip in network:
            raise UnsafeUrl(f"{ip} is {why}")
    if not ip.is_global:
        raise UnsafeUrl(f"{ip} is not a public address")


def system_resolver(host: str, port: int) -> list[str]:
    """All addresses the system resolver gives for a TCP connection, in its preferred order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


def resolve_and_check(
    host: str, port: int, *, allow_loopback: bool, resolver: Resolver = system_resolver
) -> list[IPAddress]:
    """Resolve once and check every address: one unsafe address refuses the host, because the
    client could connect to any of them. Blocks on DNS: call it from a worker thread in async
    code (`aresolve_and_check`)."""
    literal = parse_ip_literal(host)
    if literal is not None:
        check_address(literal, allow_loopback=allow_loopback)
        return [literal]
    try:
        answers = list(resolver(host, port))
    except (OSError, UnicodeError) as exc:
        # UnicodeError: the IDNA codec refuses an empty label or one over 63 characters.
        raise UnresolvableHost(f"host {host} could not be resolved ({exc})") from None
    if not answers:
        raise UnresolvableHost(f"host {host} could not be resolved (no addresses)")
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            address = ipaddress.ip_address(answer)
        except ValueError:
            raise UnsafeUrl(f"host {host} resolved to {answer!r}, not an address") from None
        try:
            check_address(address, allow_loopback=allow_loopback)
        except UnsafeUrl as exc:
            raise UnsafeUrl(f"host {host} resolves to {exc.reason}") from None
        if address not in addresses:
            addresses.append(address)
    return addresses


async def aresolve_and_check(
    host: str, port: int, *, allow_loopback: bool, resolver: Resolver = system_resolver
) -> list[IPAddress]:
    literal = parse_ip_literal(host)
    if literal is not None:
        # Nothing to look up: no hop to a worker thread (one per participant request).
        check_address(literal, allow_loopback=allow_loopback)
        return [literal]

    def run() -> list[IPAddress]:
        return resolve_and_check(host, port, allow_loopback=allow_loopback, resolver=resolver)

    return await anyio.to_thread.run_sync(run)


async def check_target(
    url: str, *, allow_loopback: bool, resolver: Resolver = system_resolver
) -> tuple[UrlCheck, list[IPAddress]]:
    """`check_url` then `resolve_and_check`: the whole R-4.1 check of one URL."""
    checked = check_url(url, allow_loopback=allow_loopback)
    addresses = await aresolve_and_check(
        checked.host, checked.port, allow_loopback=allow_loopback, resolver=resolver
    )
    return checked, addresses


class SafeTransport(httpx.AsyncBaseTransport):
    """Checks every request's target (R-4.1) and connects to a checked address.

    The request is sent to the checked IP while keeping its `Host` header and, for https, the
    original name for SNI and certificate verification. Each host name gets its own connection
    pool: pools are keyed by the address they dial, and a connection whose certificate was
    verified for one name must not be reused for another name that shares the address.

    Refusals raise `UnsafeUrl` (not an `httpx` error): a refused target is final and must not
    be retried like a network error. A host that does not resolve is an `httpx.ConnectError`.
    """

    def __init__(
        self,
        *,
        allow_loopback: bool,
        resolver: Resolver = system_resolver,
        verify: ssl.SSLContext | bool = True,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._allow_loopback = allow_loopback
        self._resolver = resolver
        self._verify = verify
        self._limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        try:
            checked, addresses = await check_target(
                str(url), allow_loopback=self._allow_loopback, resolver=self._resolver
            )
        except UnresolvableHost as exc:
            raise httpx.ConnectError(exc.reason, request=request) from None
        # httpx parsed the URL it will use; the check parsed it again. Both must agree on the
        # host, or the check would have vouched for a different target.
        literal = parse_ip_literal(checked.host)
        if not _same_host(checked.host, literal, url.raw_host.decode("ascii")):
            raise UnsafeUrl("the URL's host is ambiguous")
        extensions = dict(request.extensions)
        if checked.scheme == "https" and literal is None:
            extensions["sni_hostname"] = checked.host
        pool = self._pools.get(checked.host)
        if pool is None:
            pool = httpx.AsyncHTTPTransport(verify=self._verify, limits=self._limits)
            self._pools[checked.host] = pool
        failure = httpx.ConnectError(f"no address of {checked.host} to connect to", request=request)
        # Addresses are tried in the resolver's order, as a plain client would; only a failed
        # connect moves on, since then nothing of the request has been sent.
        for address in addresses:
            forwarded = httpx.Request(
                request.method,
                url.copy_with(host=str(address)),
                headers=request.headers,
                stream=request.stream,
                extensions=extensions,
            )
            try:
                return await pool.handle_async_request(forwarded)
            except httpx.ConnectError as exc:
                failure = exc
        raise failure

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def _same_host(checked: str, literal: IPAddress | None, parsed_by_httpx: str) -> bool:
    if literal is not None:
        # An address may be spelled differently by the two parsers; what matters is its value.
        try:
            return parse_ip_literal(parsed_by_httpx) == literal
        except UnsafeUrl:
            return False
    return checked == parsed_by_httpx.lower()
