"""What parsed JSON takes once stored as BSON, counted without encoding it: an answer is checked
against the store's limits before anything tries to store it, and the count itself must not
cost more memory than the parse did."""

from __future__ import annotations

from typing import Any

_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)


def _decimal_keys_bytes(count: int) -> int:
    """Bytes of the keys "0".."count-1" with their NULs: how BSON names an array's elements."""
    total, digits, start = 0, 1, 0
    while start < count:
        end = min(count, 10**digits)
        total += (end - start) * (digits + 1)
        start, digits = end, digits + 1
    return total


def _utf8_length(text: str) -> int:
    # UnicodeEncodeError for a lone surrogate, which JSON's \\ud800 escapes can carry.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def bson_size(value: Any, stop_above: int) -> int:
    """The bytes parsed JSON takes as a BSON value, counted without encoding it; the count
    stops as soon as it passes `stop_above` (so an answer built to swell, a 4 MiB array of
    zeros being ~25 MiB of BSON, costs no more memory than it took to parse). OverflowError for
    an integer that needs more than 64 bits, UnicodeEncodeError for a lone surrogate."""
    total = 0
    stack = [value]
    while stack and total <= stop_above:
        current = stack.pop()
        if isinstance(current, dict):
            total += 5
            for key, child in current.items():
                total += 2 + _utf8_length(key)
                stack.append(child)
        elif isinstance(current, list):
            total += 5 + len(current) + _decimal_keys_bytes(len(current))
            for child in current:
                # Scalars inline: an array of millions of numbers never fills the stack.
                if isinstance(child, dict | list):
                    stack.append(child)
                else:
                    total += _scalar_bytes(child)
                    if total > stop_above:
                        break
        else:
            total += _scalar_bytes(current)
    return total


def _scalar_bytes(value: Any) -> int:
    if isinstance(value, str):
        return 5 + _utf8_length(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        if value in _INT32:
            return 4
        if value in _INT64:
            return 8
        raise OverflowError("an integer needs more than 64 bits")
    if isinstance(value, float):
        return 8
    return 0  # None


def storage_problem(value: Any, limit: int) -> str | None:
    """Why parsed JSON cannot be stored as it is, or None."""
    try:
        size = bson_size(value, limit)
    except OverflowError:
        return "an integer needs more than 64 bits (no store keeps it)"
    except UnicodeEncodeError:
        return "a string holds a lone surrogate (not valid Unicode, no store keeps it)"
    if size > limit:
        return f"the items take more than {limit} bytes to store"
    return None
