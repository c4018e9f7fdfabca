"""The whole platform on the embedded stack: every service as its own process, the gateway, and
(for demos and tests) the reference memory system as the participant."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
from pydantic import BaseModel

from aml_contract.api.publication import ReleaseBaseline
from aml_devtools.processes import free_port, http_ready
from aml_devtools.stack import HOST, EmbeddedStack
from aml_runtime.secrets import SecretBox

WORKERS = ("scheduler", "adder", "searcher", "answerer", "scorer", "publisher")
GATEWAY = "gateway"
MEMORY_SERVER = "memory-server"


class PlatformConfig(BaseModel):
    datasets_root: Path
    # Shorter than production defaults so a crashed worker's message comes back quickly.
    ack_wait_seconds: float = 10.0
    reconcile_interval_seconds: float = 5.0
    worker_concurrency: int = 8
    llm_concurrency: int = 1
    participant_max_attempts: int = 5
    # The local model is small and slow on CPU: a shorter context and answer keep a smoke run
    # at a few seconds per question. Production uses the evaluation spec's defaults
    # (EvaluationSettings).
    answer_context_tokens: int = 200
    # The local model at temperature 0 with a fixed seed gives the same reply when asked
    # again: re-asking an unreadable judge reply would only cost time.
    judge_retries: int = 0
    answer_max_tokens: int = 32
    judge_max_tokens: int = 24
    # The operator's release baseline for the publication gate; None: not configured,
    # so every finished job fails the baseline checks (AML_RELEASE_BASELINE is left unset).
    release_baseline: ReleaseBaseline | None = None
    # Without an explicit `release_baseline`: compute the stack's own (the scheduler's hashes
    # under this very environment) so its full runs can pass the gate; datasets that are not
    # available leave it unset, with a warning.
    own_release_baseline: bool = False
    extra_env: dict[str, str] = {}


@dataclass
class Platform:
    stack: EmbeddedStack
    gateway_url: str
    admin_token: str
    env: dict[str, str]

    def start_worker(self, name: str, replica: int = 0) -> None:
        """Start a worker; replicas beyond the first share its durable consumer."""
        process = name if replica == 0 else f"{name}-{replica}"
        self.stack.start_process(process, [sys.executable, "-m", f"aml_{name}"], self.env)


def _persistent_value(path: Path, make: str) -> str:
    """Operator secrets of a local stack live in its data dir, readable by the owner only."""
    if not path.exists():
        path.write_text(make, encoding="utf-8")
        path.chmod(0o600)
    return path.read_text(encoding="utf-8").strip()


def own_release_baseline(env: dict[str, str]) -> ReleaseBaseline | None:
    """The baseline of the services started with `env` (over the process's own environment,
    as the children see it), or None when its datasets cannot be read."""
    # Imported here: the services' settings are only needed for this.
    from aml_gateway.settings import GatewaySettings
    from aml_scheduler.baseline import release_baseline
    from aml_scheduler.settings import SchedulerSettings

    # Read exactly as the children will: their environment is this one plus `env` (JSON values
    # such as AML_FULL_SUITE are decoded by the settings' environment source only).
    with mock.patch.dict(os.environ, env):
        suite = GatewaySettings().full_suite
        settings = SchedulerSettings()
    try:
        return release_baseline(settings, suite).release
    except (OSError, ValueError, KeyError) as exc:
        print(f"no release baseline for {suite} ({type(exc).__name__}: {exc}): every job "
              "fails the gate's baseline checks", file=sys.stderr, flush=True)  # fmt: skip
        return None


def start_platform(stack: EmbeddedStack, config: PlatformConfig) -> Platform:
    data_dir = stack.data_dir
    gateway_port = free_port(HOST)
    admin_token = _persistent_value(data_dir / "admin.token", secrets.token_urlsafe(24))
    env = {
        "AML_SECRET_KEYS": _persistent_value(data_dir / "secret.keys", SecretBox.new_key()),
        "AML_ADMIN_TOKEN": admin_token,
        # The participant in a local stack is on loopback; production keeps this off.
        "AML_ALLOW_LOOPBACK_TARGETS": "true",
        "AML_DATASETS_ROOT": str(config.datasets_root),
        # Spans as OTLP-JSON files beside the other data, for `aml trace`.
        "AML_TRACE_DIR": str(data_dir / "traces"),
        "AML_ANSWER_MODEL": stack.llm_model,
        # The local model reads text only: images are shown to it as a placeholder.
        "AML_ANSWER_MODEL_IMAGES": "false",
        "AML_JUDGE_MODEL": stack.llm_model,
        "AML_ACK_WAIT_SECONDS": str(config.ack_wait_seconds),
        "AML_RECONCILE_INTERVAL_SECONDS": str(config.reconcile_interval_seconds),
        "AML_WORKER_CONCURRENCY": str(config.worker_concurrency),
        "AML_LLM_CONCURRENCY": str(config.llm_concurrency),
        "AML_PARTICIPANT_MAX_ATTEMPTS": str(config.participant_max_attempts),
        "AML_ANSWER_CONTEXT_TOKENS": str(config.answer_context_tokens),
        "AML_TOKEN_COUNTER": "llama.cpp",
        "AML_JUDGE_RETRIES": str(config.judge_retries),
        "AML_ANSWER_MAX_TOKENS": str(config.answer_max_tokens),
        "AML_JUDGE_MAX_TOKENS": str(config.judge_max_tokens),
        "AML_PORT": str(gateway_port),
        "AML_HOST": HOST,
        # Every service runs on this one host with this one environment: a shared metrics port
        # would collide, so the local stack serves none (the gateway's /ready still answers).
        "AML_METRICS_PORT": "0",
        **config.extra_env,
    }
    baseline = config.release_baseline
    if baseline is None and config.own_release_baseline:
        baseline = own_release_baseline(env)
    if baseline is not None:
        env["AML_RELEASE_BASELINE"] = baseline.model_dump_json()
    gateway_url = f"http://{HOST}:{gateway_port}"
    stack.start_process(
        GATEWAY,
        [sys.executable, "-m", "aml_gateway"],
        env,
        ready=http_ready(f"{gateway_url}/health"),
    )
    platform = Platform(stack=stack, gateway_url=gateway_url, admin_token=admin_token, env=env)
    for name in WORKERS:
        platform.start_worker(name)
    return platform


@dataclass
class MemoryServer:
    url: str
    key: str


def start_memory_server(
    stack: EmbeddedStack, name: str = MEMORY_SERVER, auth_method: str = "bearer"
) -> MemoryServer:
    port = free_port(HOST)
    key = secrets.token_urlsafe(24)
    url = f"http://{HOST}:{port}"
    stack.start_process(
        name,
        [
            sys.executable,
            "-m",
            "aml_memory_server",
            "--host",
            HOST,
            "--port",
            str(port),
            "--db",
            str(stack.data_dir / f"{name}.db"),
            "--auth-method",
            auth_method,
        ],
        {"AML_MEMORY_KEY": key},
        ready=http_ready(f"{url}/health"),
    )
    return MemoryServer(url=url, key=key)


def register_participant(
    platform: Platform,
    base_url: str,
    team: str,
    system_name: str,
    auth_method: str = "none",
    key: str | None = None,
    capacity: dict[str, float] | None = None,
    track: str = "textual",
) -> tuple[str, str]:
    """Bind a participant serving /add, /search and /health under `base_url` as a system
    version of `team` on `track`; returns (version_id, leaderboard key of a new team)."""
    version: dict[str, object] = {
        "team": team,
        "system_name": system_name,
        "version_label": "1.0",
        "track": track,
        "add_url": f"{base_url}/add",
        "search_url": f"{base_url}/search",
        "health_url": f"{base_url}/health",
        "auth_method": auth_method,
        "memory_system_key": key if auth_method != "none" else None,
    }
    if capacity is not None:
        version["capacity"] = capacity
    response = httpx.post(
        f"{platform.gateway_url}/v1/admin/versions",
        headers={"Authorization": f"Bearer {platform.admin_token}"},
        json=version,
        timeout=30,
    )
    response.raise_for_status()
    body = response.json()
    return body["version_id"], body["leaderboard_api_key"]


def register_memory_server(
    platform: Platform,
    memory: MemoryServer,
    team: str,
    auth_method: str = "bearer",
    track: str = "textual",
) -> tuple[str, str]:
    """Bind the reference memory server as a system version of `team` (a system name belongs
    to one team, so the team's name is part of it)."""
    return register_participant(
        platform, memory.url, team, f"reference-bm25-{team}", auth_method, memory.key, track=track
    )
