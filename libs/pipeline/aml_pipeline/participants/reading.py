"""A participant's answer read as a stream, bounded by its operation's size limit counted after
decompression: a participant cannot grow a shared process, not even with a small compressed
body that expands."""

from __future__ import annotations

import zlib
from typing import Any

import httpx

from aml_pipeline.participants.failures import short


class BodyRejected(Exception):
    """The answer's body broke a reading limit: too large, or an undecodable encoding."""

    def __init__(self, reason: str, size: int, error_class: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.size = size
        self.error_class = error_class
        # The answer's HTTP status, set by the client.
        self.status: int | None = None


async def read_capped(
    response: httpx.Response, cap: int, operation: str, *, decode: bool = True
) -> bytes:
    """The body of a streamed response, decoded (gzip, deflate or none) and at most `cap`
    bytes: reading stops as soon as it would exceed it."""
    what = f"{operation.replace('_', ' ')} response"
    declared = response.headers.get("Content-Length", "")
    encoding = response.headers.get("Content-Encoding", "") if decode else ""
    if declared.isascii() and declared.isdigit() and int(declared) > cap and not encoding:
        raise BodyRejected(
            f"{what}: body larger than the {_size(cap)} limit", 0, "ResponseTooLarge"
        )
    out = bytearray()
    if response.is_stream_consumed:
        # Already in memory, decoded (an in-process transport such as httpx.MockTransport).
        _Decoder("", what).feed(response.content, out, cap)
        return bytes(out)
    decoder = _Decoder(encoding, what)
    async for raw in response.aiter_raw():
        decoder.feed(raw, out, cap)
    decoder.finish(out, cap)
    return bytes(out)


class _Decoder:
    """Content-Encoding decoding whose output is bounded as it is produced: a small compressed
    body cannot expand past the limit in memory."""

    def __init__(self, encoding: str, what: str) -> None:
        self._what = what
        names = [n.strip().lower() for n in encoding.split(",") if n.strip()]
        names = [n for n in names if n != "identity"]
        self._raw_deflate_tried = False
        self._deflate = names == ["deflate"]
        if not names:
            self._z: Any = None
        elif names in (["gzip"], ["x-gzip"]):
            self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self._deflate:
            self._z = zlib.decompressobj()
        else:
            raise BodyRejected(
                f"{what}: unsupported Content-Encoding {short(encoding, 40)!r}", 0, "BadEncoding"
            )

    def feed(self, data: bytes, out: bytearray, cap: int) -> None:
        if self._z is None:
            out += data
            self._check(out, cap)
            return
        while data:
            try:
                out += self._z.decompress(data, cap + 1 - len(out))
            except zlib.error:
                if self._deflate and not self._raw_deflate_tried and not out:
                    # "deflate" is sometimes sent without its zlib wrapper.
                    self._raw_deflate_tried = True
                    self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise BodyRejected(
                    f"{self._what}: body is not valid {'deflate' if self._deflate else 'gzip'}",
                    len(out),
                    "BadEncoding",
                ) from None
            self._check(out, cap)
            data = self._z.unconsumed_tail

    def finish(self, out: bytearray, cap: int) -> None:
        if self._z is not None:
            out += self._z.flush()
            self._check(out, cap)

    def _check(self, out: bytearray, cap: int) -> None:
        if len(out) > cap:
            raise BodyRejected(
                f"{self._what}: body larger than the {_size(cap)} limit",
                len(out),
                "ResponseTooLarge",
            )


def _size(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} bytes"
