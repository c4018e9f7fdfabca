"""The script of a simulated participant: per endpoint, how long it takes, how much it accepts at
once and what it answers, attempt by attempt. JSON-loadable, so a benchmark can keep scripts as
files and a test can build them inline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Base64Bytes, BaseModel, ConfigDict, Field, SecretStr, model_validator

from aml_memory_server.settings import AuthMethod

Endpoint = Literal["add", "search", "health", "tasks"]
ENDPOINTS: tuple[Endpoint, ...] = ("add", "search", "health", "tasks")

# Bodies that break the participant contract on purpose, for contract tests.
# Their exact shapes are documented in responses.py.
MalformedMode = Literal[
    "missing_ids",
    "success_false",
    "wrong_request_id",
    "items_wrapper",
    "top_level_array",
    "too_many_items",
    "empty_id",
    "empty_content",
    "non_numeric_score",
    "not_json",
]
Mode = Literal["ok", "status", "drop", "slow", "async_202"] | MalformedMode

# Which modes make sense where: a mode an endpoint cannot honour is a script error at load time,
# not a silent fallback at request time.
_COMMON: frozenset[str] = frozenset({"ok", "status", "drop", "slow", "not_json"})
ALLOWED_MODES: dict[Endpoint, frozenset[str]] = {
    "add": _COMMON | {"async_202", "missing_ids", "success_false", "wrong_request_id"},
    "search": _COMMON
    | {
        "missing_ids",
        "items_wrapper",
        "top_level_array",
        "too_many_items",
        "empty_id",
        "empty_content",
        "non_numeric_score",
    },
    "health": _COMMON,
    "tasks": _COMMON,
}

NonNegative = Annotated[float, Field(ge=0)]


class FixedLatency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["fixed"]
    seconds: NonNegative


class UniformLatency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["uniform"]
    low: NonNegative
    high: NonNegative
    seed: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise ValueError(f"uniform latency: low {self.low} > high {self.high}")
        return self


class LognormalLatency(BaseModel):
    """exp(N(mu, sigma)) seconds: the long right tail of real services. `max_seconds` caps the
    tail so that one unlucky draw cannot outlast a test's timeout."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["lognormal"]
    mu: float
    sigma: NonNegative
    max_seconds: NonNegative | None = None
    seed: int = 0


LatencyDistribution = Annotated[
    FixedLatency | UniformLatency | LognormalLatency, Field(discriminator="kind")
]


class ScriptedCapacity(BaseModel):
    """At most `max_concurrency` requests are served at once; above that a request waits for a
    slot (`queue`) or is turned away at once with 429 (optionally with Retry-After) or 503."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_concurrency: Annotated[int, Field(ge=1)]
    on_excess: Literal["queue", "reject_429", "reject_503"] = "queue"
    retry_after: str | int | None = Field(
        default=None, description="Retry-After header value sent with a rejection"
    )


class Outcome(BaseModel):
    """One scripted answer. Without `mode`: a `status` other than 200, or a custom body, answers
    exactly that (status mode); otherwise the normal correct answer (ok mode). So
    `[{"status": 429, "headers": {"Retry-After": "2"}}, {"status": 200}]` is "429, then normal"."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Mode | None = None
    status: Annotated[int, Field(ge=100, le=599)] | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = Field(default=None, description="status mode: UTF-8 body text")
    body_base64: Base64Bytes | None = Field(
        default=None, description="status mode: arbitrary body bytes, base64 in JSON"
    )
    delay_s: NonNegative = Field(
        default=0.0, description="sleep before answering (any mode; required > 0 for slow)"
    )
    abort: bool = Field(default=False, description="drop: reset (RST) instead of close (FIN)")
    persist: bool = Field(
        default=False,
        description="add, any non-ok mode: store the memory anyway (processed, answer lost)",
    )
    pending_polls: Annotated[int, Field(ge=0)] = Field(
        default=0, description="async_202: how many polls answer pending before the result"
    )
    task_result: Literal["done", "failed"] = "done"

    @property
    def effective_mode(self) -> Mode:
        if self.mode is not None:
            return self.mode
        custom_body = self.body is not None or self.body_base64 is not None
        return "status" if custom_body or self.status not in (None, 200) else "ok"

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        mode = self.effective_mode
        if self.body is not None and self.body_base64 is not None:
            raise ValueError("give body or body_base64, not both")
        if (self.body is not None or self.body_base64 is not None) and mode != "status":
            raise ValueError(f"a custom body needs status mode, not {mode!r}")
        if mode == "slow" and self.delay_s <= 0:
            raise ValueError("slow mode needs delay_s > 0")
        if self.abort and mode != "drop":
            raise ValueError("abort applies to drop mode only")
        return self


class ScriptedLeak(BaseModel):
    """Cross-user leakage (R-4.11): every normal Search answer puts `count` memories stored under
    another user_id (`from_user_id`, or any other) first in its results."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    count: Annotated[int, Field(ge=1)] = 1
    from_user_id: str | None = None


class EndpointScript(BaseModel):
    """`responses` is consumed attempt by attempt per sequence key: the request_id for Add, the
    query for Search, the task_id for task polls (or one global sequence, or per user_id).
    `by_key` gives specific keys their own sequence; once a sequence is used up, `then` applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    latency: NonNegative | LatencyDistribution = 0.0
    capacity: ScriptedCapacity | None = None
    responses: list[Outcome] = Field(default_factory=list)
    by_key: dict[str, list[Outcome]] = Field(default_factory=dict)
    then: Outcome = Field(default_factory=Outcome)
    sequence: Literal["default", "global", "user_id"] = "default"
    leak: ScriptedLeak | None = None

    def outcomes(self) -> list[Outcome]:
        return [*self.responses, *(o for seq in self.by_key.values() for o in seq), self.then]


class ScriptedAuth(BaseModel):
    """What the simulated participant expects (R-4.2); a mismatch answers 401."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: AuthMethod
    key: SecretStr | None = None

    @model_validator(mode="after")
    def _key_matches_method(self) -> Self:
        if self.method != "none" and not (self.key and self.key.get_secret_value()):
            raise ValueError(f"auth method {self.method!r} needs a non-empty key")
        return self


class Script(BaseModel):
    """`capacity` at the top is the participant-wide limit over Add, Search and task polls, the
    way a participant declares its capacity (R-3.1, R-4.12); each endpoint may have its own too."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    add: EndpointScript = Field(default_factory=EndpointScript)
    search: EndpointScript = Field(default_factory=EndpointScript)
    health: EndpointScript = Field(default_factory=EndpointScript)
    tasks: EndpointScript = Field(default_factory=EndpointScript)
    capacity: ScriptedCapacity | None = None
    auth: ScriptedAuth | None = None

    @model_validator(mode="after")
    def _modes_fit_endpoints(self) -> Self:
        for endpoint in ENDPOINTS:
            part = self.endpoint(endpoint)
            for outcome in part.outcomes():
                mode = outcome.effective_mode
                if mode not in ALLOWED_MODES[endpoint]:
                    raise ValueError(f"{endpoint}: mode {mode!r} is not available here")
                if outcome.persist and endpoint != "add":
                    raise ValueError(f"{endpoint}: persist applies to add only")
            if part.leak is not None and endpoint != "search":
                raise ValueError(f"{endpoint}: leak applies to search only")
        return self

    def endpoint(self, name: Endpoint) -> EndpointScript:
        part: EndpointScript = getattr(self, name)
        return part

    @classmethod
    def load(cls, path: Path) -> Script:
        return cls.model_validate_json(path.read_bytes())
