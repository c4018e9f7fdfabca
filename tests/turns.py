"""An admission whose turn alone the tests exercise: one concurrency slot and no capacity pool
read or written (no limiter). Importable from tests/unit and tests/integration alike (`tests/`
is on the path through its conftest)."""

from __future__ import annotations

import time
from typing import cast

from aml_pipeline.capacity import Admission, Capacity, CapacityLimiter


def turn_only_admission(key: str = "k") -> Admission:
    return Admission(
        cast(CapacityLimiter, None),
        Capacity(key=key, max_concurrency=1),
        holder="h",
        concurrency_slot=f"{key}/c/0",
        rate_slot=None,
        admitted_at=time.time(),
    )
