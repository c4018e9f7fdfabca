"""Checking the auth header the platform sends (SPEC R-4.2)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from .settings import AuthMethod

# Which header carries the key, and with which scheme prefix (None: the bare key).
_HEADER_SCHEME: dict[AuthMethod, tuple[str, str | None]] = {
    "token": ("authorization", "token"),
    "bearer": ("authorization", "bearer"),
    "x-api-key": ("x-api-key", None),
}


def presented_key(method: AuthMethod, headers: Mapping[str, str]) -> str | None:
    """The key a request presents under `method`, or None when the header is absent or
    uses another scheme. Schemes compare case-insensitively as HTTP auth schemes do
    (RFC 9110 section 11.1); `headers` must be keyed by lower-case names."""
    if method == "none":
        return None
    header, scheme = _HEADER_SCHEME[method]
    value = headers.get(header)
    if value is None:
        return None
    if scheme is None:
        return value.strip()
    given_scheme, _, credentials = value.strip().partition(" ")
    if given_scheme.lower() != scheme:
        return None
    return credentials.strip()


def is_authorized(method: AuthMethod, expected_key: str | None, headers: Mapping[str, str]) -> bool:
    if method == "none":
        return True
    if not expected_key:
        return False
    given = presented_key(method, headers)
    # Constant-time comparison: response timing must not reveal a prefix of the key.
    return given is not None and hmac.compare_digest(given.encode(), expected_key.encode())
