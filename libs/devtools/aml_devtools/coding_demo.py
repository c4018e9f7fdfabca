"""What `aml demo` does differently for a dataset of the coding track (`aml demo --dataset
synthetic-coding`): the whole track on the embedded stack, every attempt solved by mini-swe-agent
in the bubblewrap sandbox and verified with the task's hidden tests.

The local SmolLM2 cannot solve a coding task, so the agent's model is the LLM stand-in's scripted
coding agent (`aml_llm_standin.coding`), which says it is no language model: it applies a task's
fix when the task's convention is among the memories the platform put in its prompt (within the
memory budget), a plausible wrong fix otherwise. The figures then say whether the memory system
returned the convention within the budget, not how well a model codes. llama.cpp is not started:
coding uses no judge, and the stand-in has no tokenizer, so memory tokens are counted with the
platform's stated estimate (AML_TOKEN_COUNTER=estimate).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from unittest import mock

import httpx

from aml_devtools.processes import free_port, http_ready
from aml_devtools.stack import HOST, EmbeddedStack
from aml_evaluation.registry import registered
from aml_runtime.settings import EvaluationSettings

STANDIN = "llm-standin"
# Requests the stand-in serves at once: more than the platform sends (AML_LLM_CONCURRENCY), so
# none is refused.
STANDIN_CAPACITY: Final = 8
WHY: Final = "the local SmolLM2 cannot solve coding tasks"


def is_coding(dataset_id: str, datasets_root: Path) -> bool:
    """Whether a registered dataset (checked by `demo_dataset_problem` first) is of the coding
    track."""
    return registered(dataset_id, datasets_root).manifest.track == "coding"


@dataclass(frozen=True)
class AgentModel:
    """The stand-in serving the coding agent's model, as the services are pointed at it."""

    base_url: str
    model: str
    description: str

    def env(self) -> dict[str, str]:
        return {
            "AML_LLM_BASE_URL": f"{self.base_url}/v1",
            "AML_ANSWER_MODEL": self.model,
            "AML_TOKEN_COUNTER": "estimate",
        }

    def note(self) -> str:
        return f"answer model: {self.description} — {WHY}"


def start_agent_model(stack: EmbeddedStack) -> AgentModel:
    """The stand-in as one of the stack's processes (stopped with it), answering at once; what
    it calls itself is read from its `/v1/models`."""
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    argv = [sys.executable, "-m", "aml_llm_standin", "--host", HOST, "--port", str(port),
            "--latency", "0", "--concurrency", str(STANDIN_CAPACITY)]  # fmt: skip
    stack.start_process(STANDIN, argv, ready=http_ready(f"{url}/health"))
    listed = httpx.get(f"{url}/v1/models", timeout=10, trust_env=False)
    listed.raise_for_status()
    (model,) = listed.json()["data"]
    return AgentModel(base_url=url, model=model["id"], description=model["description"])


def memory_budget(env: Mapping[str, str]) -> int:
    """The agent's memory budget (AML_CODING_MEMORY_TOKENS) as the services started with `env`
    read it: their environment is this process's plus `env`."""
    with mock.patch.dict(os.environ, env):
        return EvaluationSettings().coding_memory_tokens


def closing_note(env: Mapping[str, str]) -> str:
    """What the demo says under the table about where its figures come from."""
    return (
        f"the agent's model was {env['AML_ANSWER_MODEL']}, a scripted stand-in: it applies a "
        "task's fix when the task's convention is among the memories in its prompt, else a "
        "plausible wrong one, so the figures say whether the memory system returned the "
        f"convention within the memory budget ({memory_budget(env)} tokens), not how well a "
        "model codes; every patch was verified with its task's hidden tests in the sandbox"
    )
