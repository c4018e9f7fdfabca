"""Settings shared by every service. Each service extends `CommonSettings` with its own fields;
everything comes from `AML_*` environment variables so any component can point at production
servers (a NATS cluster, MongoDB, OpenAI) instead of the embedded stack."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Twice the largest lag measured from a request's departure to the receiver's clock with three
# teams on a loaded two-core machine (52 ms; docs/performance.md). It costs 1% of a LoCoMo-10
# job's time (0.05 s: 302.2 s, 0.1 s: 305.2 s, back to back).
RATE_MARGIN_SECONDS = 0.1


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AML_", extra="ignore")

    # The NATS server (JetStream enabled) every service publishes to and consumes from; a
    # cluster's servers separated by commas (`nats://a:4222,nats://b:4222`), so that a client
    # can connect and reconnect while any one of them is down.
    nats_url: str = "nats://127.0.0.1:4222"
    # Copies of each stream the JetStream cluster keeps (1 on a single server; 3 on a
    # three-node cluster, which then survives the loss of any one node). Streams are created
    # and brought up to this at start-up; a service exits with one line saying so when the
    # cluster has fewer JetStream nodes.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # MongoDB (a replica set in production: the platform relies on majority writes).
    mongo_url: str = "mongodb://127.0.0.1:27017/?directConnection=true"
    # The database holding every job, item, audit and leaderboard document.
    mongo_db: str = "aml"
    # Spans are also written here as OTLP-JSON files (read by `aml trace`); unset: not written.
    trace_dir: Path | None = None
    # Structured (JSON) log level: DEBUG, INFO, WARNING, ERROR.
    log_level: str = "INFO"
    # A message is delivered at most this many times, the first delivery included, before its
    # item is marked failed.
    max_deliver: int = Field(default=5, ge=1)
    # Unacknowledged work is redelivered after this long; long calls send progress heartbeats.
    ack_wait_seconds: float = Field(default=15.0, gt=0)
    # Delay before a NACKed message is redelivered (doubles per delivery).
    redelivery_delay_seconds: float = Field(default=1.0, ge=0)
    # Added to every rate slot's period (aml_pipeline.capacity): covers the way from the socket
    # to the receiver's clock, so a declared rate holds as the participant or LLM measures it.
    rate_margin_seconds: float = Field(default=RATE_MARGIN_SECONDS, ge=0, le=5)
    # Worker processes serve /health, /ready and Prometheus /metrics on this port (0: off; the
    # gateway answers /health and /ready on its own port). Each process needs its own port, so
    # processes sharing one host (`aml up`) turn it off.
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # The address the metrics port listens on (all interfaces: probes and scrapers come from
    # outside the container).
    metrics_host: str = "0.0.0.0"
    # /ready gives each dependency (NATS, MongoDB, the LLM) this long to answer.
    ready_timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    # A worker whose NATS connection or MongoDB stays unreachable this long exits (status 3) for
    # its supervisor to restart it, instead of retrying for ever (aml_runtime.service).
    dependency_loss_exit_seconds: float = Field(default=300.0, gt=0)
    # Set by the embedded stack to its launcher's pid: a worker exits once the launcher is no
    # longer its parent (unset: no such check).
    stack_pid: int | None = None

    @property
    def nats_servers(self) -> list[str]:
        """`nats_url` as the server list every NATS client is given (nats-py takes one URL per
        entry; it does not split a comma-separated string)."""
        return nats_servers(self.nats_url)


def nats_servers(url: str) -> list[str]:
    return [server.strip() for server in url.split(",") if server.strip()]


class EvaluationSettings(CommonSettings):
    """The settings the evaluation spec is built from (`build_evaluation_spec`): what a release
    holds constant for every job (recorded on each job, SPEC R-6.4)."""

    # Candidates asked of every Search.
    top_k: int = Field(default=100, ge=1)
    # The fixed answer model.
    answer_model: str = "gpt-4o-mini"
    # The answer prompt's name (aml_evaluation/prompts/<name>.txt).
    answer_prompt: str = "answer_v1"
    # Longest answer, in tokens.
    answer_max_tokens: int = Field(default=128, ge=1)
    # Candidates are added in the participant's order while their tokens fit this budget
    # (aml_evaluation.context, rule context-v1).
    answer_context_tokens: int = Field(default=2000, ge=16)
    # `llama.cpp`: the answer model's own tokenizer through the server's /tokenize; `estimate`:
    # the stated conservative estimate, for models whose tokenizer is not available offline.
    token_counter: Literal["estimate", "llama.cpp"] = "estimate"
    # Whether the answer model reads images (gpt-4o-mini does): multimodal candidates and
    # questions then reach it as image parts; false (a text-only model, such as the local
    # stack's) shows each image as the placeholder "[image]" (aml_evaluation.context).
    answer_model_images: bool = True
    # The fixed judge model.
    judge_model: str = "gpt-4o-mini"
    # The judge prompt's name (aml_evaluation/prompts/<name>.txt).
    judge_prompt: str = "judge_v1"
    # For questions whose gold is that the conversation does not contain the answer (LoCoMo's
    # adversarial category): the judge is told so and checks that the answer abstains.
    judge_abstention_prompt: str = "judge_abstention_v1"
    # Longest judge reply, in tokens.
    judge_max_tokens: int = Field(default=64, ge=1)
    # Judge calls per question (majority vote), and re-asks of a run whose reply is unreadable.
    judge_runs: int = Field(default=1, ge=1, le=9)
    # Re-asks of a judge run whose reply is unreadable.
    judge_retries: int = Field(default=1, ge=0, le=5)
    # The coding track's fixed agent (R-2.5, recorded in the evaluation spec of coding jobs):
    # model calls one attempt may make (mini-swe-agent's SWE-bench config has 250).
    coding_step_limit: int = Field(default=250, ge=1)
    # Seconds one of the agent's commands may run in its sandbox (wall clock and CPU).
    coding_command_timeout_seconds: float = Field(default=60.0, gt=0)
    # Wall-clock seconds of one attempt, its model calls and commands together.
    coding_wall_seconds: float = Field(default=1800.0, gt=0)
    # Tokens of the participant's candidates in the agent's task prompt, in its order (rule
    # coding-context-v1, counted as `token_counter` counts).
    coding_memory_tokens: int = Field(default=2000, ge=1)
    # Longest reply of the agent's model (the answer model), in tokens.
    coding_reply_max_tokens: int = Field(default=4096, ge=1)
    # Seconds the verify step's test command may run (wall clock and CPU; SWE-bench's harness
    # allows 1,800): a run cut there leaves the attempt unresolved.
    coding_test_timeout_seconds: float = Field(default=1800.0, gt=0)


class LLMSettings(EvaluationSettings):
    # Any OpenAI-compatible endpoint serving the answer and judge models.
    llm_base_url: str = "https://api.openai.com/v1"
    # The endpoint's API key (a secret: from the secret store only).
    llm_api_key: SecretStr = SecretStr("")
    # One LLM call gives up after this long (the work item is then redelivered).
    llm_timeout_seconds: float = 120.0
    # The LLM's declared capacity: ONE budget for the deployment, shared by every answerer and
    # scorer replica (not per process): at most this many questions at the LLM at once, and at
    # most `llm_requests_per_minute` calls (unset: the provider sets no request rate).
    llm_concurrency: int = Field(default=2, ge=1)
    # The provider's request rate limit for the whole deployment (unset: none).
    llm_requests_per_minute: float | None = Field(default=None, gt=0)
    # An LLM call failing with a connection error, a timeout, 5xx or 429 pauses the answer and
    # score stages of every replica (one budget, one pause), probes the endpoint at growing
    # intervals and retries when it answers; only an outage longer than this fails the
    # questions waiting on it, as platform_error (never charged to the team).
    llm_outage_seconds: float = Field(default=1800.0, gt=0)


class CodingWorkerSettings(LLMSettings):
    """The answerer's and the scorer's: they run the coding track's sandboxes (solve, verify)."""

    # Where the registered benchmark files live, as the scheduler's `datasets_root`: the coding
    # track reads a task's repository snapshot and hidden tests from its bundle there
    # (aml_evaluation.coding.source).
    datasets_root: Path = Path("../shared/datasets")
    # Where a coding attempt's commands and tests run: "bwrap" (bubblewrap, inside this
    # process's container) or "kubernetes" (one pod per sandbox in `sandbox_namespace`, under
    # gVisor, from `sandbox_image`; aml_pipeline.sandbox.pods).
    sandbox_backend: Literal["bwrap", "kubernetes"] = "bwrap"
    # The coding image the sandbox pods run (the Dockerfile's `coding` target, as the nodes pull
    # it); required with the kubernetes backend.
    sandbox_image: str = ""
    # The namespace the sandbox pods are created in (deploy/k8s/sandbox).
    sandbox_namespace: str = Field(default="aml-sandbox", min_length=1)

    @model_validator(mode="after")
    def _pods_need_an_image(self) -> CodingWorkerSettings:
        if self.sandbox_backend == "kubernetes" and not self.sandbox_image.strip():
            raise ValueError("AML_SANDBOX_BACKEND=kubernetes needs AML_SANDBOX_IMAGE")
        return self


class ParticipantCallSettings(CommonSettings):
    # Memory System Keys are encrypted at rest with these (first one encrypts; all decrypt).
    secret_keys: SecretStr = SecretStr("")
    # One participant HTTP call (Add, Search) gives up after this long; Health after 10 s.
    participant_timeout_seconds: float = 1800.0
    # HTTP attempts of one participant call, retries of transient failures included.
    participant_max_attempts: int = Field(default=5, ge=1)
    # Back-off before a retried attempt: between half and all of base · 2^(attempt-1), at most
    # the maximum (five attempts span 22.5 to 45 s with the defaults, so a participant's
    # restart or a load balancer's blip is ridden through by the retries alone).
    participant_backoff_base_seconds: float = Field(default=3.0, gt=0)
    # The longest back-off between two attempts of one call.
    participant_backoff_max_seconds: float = 30.0
    # A participant whose calls fail as unreachable (no connection, timeouts, 429, 502, 503,
    # 504, 524) once the retry table's attempts are spent is paused, not failed: no work is taken
    # for it, its Health URL is probed at growing intervals and the calls in flight retry when it
    # answers. Only an outage longer than this fails its jobs, as participant_outage.
    participant_outage_seconds: float = Field(default=600.0, gt=0)
    # Allow participant URLs on loopback/private addresses (local stacks and tests only).
    allow_loopback_targets: bool = False
    # Items one adder/searcher process works on at once, over all participants together: a
    # safety bound only. Each participant's declared capacity is what limits its calls, so this
    # is large enough that slow participants cannot take every place from the others.
    worker_concurrency: int = Field(default=256, ge=1)
