"""What the simulator saw: one record per request to a contract endpoint, kept in arrival order.
The JSON form (GET /_sim/requests) carries bodies as base64, since a body is arbitrary bytes and
the point of recording it is byte-exact comparison (R-4.10: retries resend identical bytes)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .script import Endpoint

# The scope that counts every contract endpoint together, next to the per-endpoint counts.
TOTAL = "total"


class RequestRecord(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")
    seq: int = Field(description="arrival order, from 0")
    endpoint: Endpoint
    method: str
    path: str
    query_string: str
    headers: list[tuple[str, str]] = Field(
        description="as the server received them: order and repeats kept, names lower-cased"
    )
    body: bytes
    arrived_monotonic: float = Field(description="time.monotonic() at arrival")
    arrived_at: datetime = Field(description="wall clock (UTC) at arrival")
    finished_monotonic: float
    concurrency_at_arrival: int = Field(
        description="requests in flight at this endpoint on arrival, this one included"
    )
    total_concurrency_at_arrival: int = Field(
        description="requests in flight at all contract endpoints on arrival, this one included"
    )
    sequence_key: str | None = Field(
        default=None, description="the key whose scripted sequence answered (None: not reached)"
    )
    attempt: int | None = Field(default=None, description="index within that key's sequence")
    outcome: str = Field(
        description="the mode applied (ok, status, drop, slow, async_202, a malformed mode) or "
        "what stopped the request first: unauthorized, reject_429, reject_503, invalid_request, "
        "not_found, cancelled"
    )
    status: int | None = Field(description="HTTP status sent; None when the connection dropped")
    latency_s: float = Field(description="the latency drawn for this request")

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for key, value in self.headers if key.lower() == lowered), None)


class SimulatorSnapshot(BaseModel):
    """GET /_sim/requests. Peaks are per endpoint plus `total`: `peak_concurrency` counts
    requests in flight (waiting for a slot included): what the client sent at once;
    `peak_active` counts those holding a slot: what the participant served at once."""

    model_config = ConfigDict(frozen=True)
    requests: list[RequestRecord]
    peak_concurrency: dict[str, int]
    peak_active: dict[str, int]
