"""The LLM stand-in's scripted coding agent (aml_llm_standin.coding): the agent's real prompts
(mini-swe-agent's instance template with the platform's memory section, rendered as the agent
renders it) in, the script's replies out. The gold patch only for the task's convention within
the memory section; the wrong patch for it anywhere else; then the submit command; nothing for a
task it does not know; the answer and judge prompts left to the other replies."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from jinja2 import StrictUndefined, Template
from starlette.testclient import TestClient

from aml_evaluation.coding.bundle import CodingTask, load_coding_bundle
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR
from aml_evaluation.context import estimated
from aml_evaluation.prompts import format_memories, load_prompt
from aml_llm_standin import SCRIPTED_MODEL, create_app
from aml_llm_standin.coding import (
    SHIPPED_TASKS,
    SUBMIT_COMMAND,
    CodingTasks,
    ScriptedTask,
    apply_command,
    coding_reply,
    load_coding_tasks,
    statement_key,
)
from aml_pipeline.coding_agent import (
    ACTION_REGEX,
    SUBMIT_SENTINEL,
    AgentConfig,
    load_agent_config,
    memory_context,
)

TASK_ID = "tally-rate-rounding"
OTHER_TASK = "knobs-set-option"
Messages = list[tuple[str, str]]


@pytest.fixture(scope="module")
def config() -> AgentConfig:
    return load_agent_config(token_counter="utf8-bytes-div-3-v1")


@pytest.fixture(scope="module")
def shipped() -> dict[str, CodingTask]:
    return {task.task_id: task for task in load_coding_bundle(SHIPPED_BUNDLE_DIR).tasks}


@pytest.fixture(scope="module")
def tasks() -> CodingTasks:
    return load_coding_tasks()


def conversation(config: AgentConfig, statement: str, memories: str) -> Messages:
    """The agent's first call: its system prompt and its instance prompt, as it renders them."""

    def render(template: str, **variables: str) -> str:
        return str(Template(template, undefined=StrictUndefined).render(**variables))

    return [
        ("system", render(config.system_template)),
        ("user", render(config.instance_template, task=statement, memories=memories)),
    ]


def action(reply: str | None) -> str:
    """The reply's one command, as mini-swe-agent parses it."""
    assert reply is not None
    (found,) = re.findall(ACTION_REGEX, reply, re.DOTALL)
    return str(found).strip()


def hints(task: CodingTask) -> tuple[str, str]:
    assert task.stand_in is not None
    return task.stand_in.convention, task.stand_in.wrong_patch


def noise(*extra: str) -> str:
    lines = [
        ("Past session: money amounts are stored as integer minor units.", "2024-09-15"),
        ("Past session: format_money only pads the minor units.", None),
    ]
    return format_memories([*lines, *((text, None) for text in extra)])


def test_the_shipped_tasks_are_known_by_their_problem_statements(
    tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    assert sorted(task.task_id for task in tasks.values()) == sorted(shipped)
    task = shipped[TASK_ID]
    known = tasks[statement_key(task.problem_statement)]
    assert (known.convention, known.wrong_patch) == hints(task)
    assert known.gold_patch == task.gold_patch


def test_the_convention_in_the_memory_section_applies_the_gold_patch(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    convention, _ = hints(task)
    memories = noise(f"Past session: remember that {convention}. Noted for next time.")
    reply = coding_reply(conversation(config, task.problem_statement, memories), tasks)
    assert action(reply) == apply_command(task.gold_patch)
    assert reply is not None and reply.startswith("THOUGHT: [scripted stand-in]")


def test_without_the_convention_the_wrong_patch(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    _, wrong = hints(task)
    for memories in (noise(), ""):
        reply = coding_reply(conversation(config, task.problem_statement, memories), tasks)
        assert action(reply) == apply_command(wrong)
    # Another task's convention is no help.
    other, _ = hints(shipped[OTHER_TASK])
    reply = coding_reply(conversation(config, task.problem_statement, noise(other)), tasks)
    assert action(reply) == apply_command(wrong)


def test_the_convention_counts_with_its_whitespace_reflowed(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    """A multi-line memory is indented when rendered; a memory system may rewrap text."""
    task = shipped[TASK_ID]
    convention, wrong = hints(task)
    words = convention.split()
    wrapped = " ".join(words[:4]) + "\n" + "  ".join(words[4:])
    reply = coding_reply(conversation(config, task.problem_statement, noise(wrapped)), tasks)
    assert action(reply) == apply_command(task.gold_patch)
    # Case is kept: only the phrase itself counts.
    shouted = noise(convention.upper())
    reply = coding_reply(conversation(config, task.problem_statement, shouted), tasks)
    assert action(reply) == apply_command(wrong)


def test_the_convention_in_the_problem_statement_does_not_count(
    config: AgentConfig, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    convention, wrong = hints(task)
    statement = f"{task.problem_statement}\nNote: {convention}.\n"
    tasks = {statement_key(statement): ScriptedTask(TASK_ID, convention, task.gold_patch, wrong)}
    reply = coding_reply(conversation(config, statement, noise()), tasks)
    assert action(reply) == apply_command(wrong)


def test_the_convention_in_an_observation_does_not_count(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    """Only the instance prompt is read: command output is not memory."""
    task = shipped[TASK_ID]
    convention, wrong = hints(task)
    messages = conversation(config, task.problem_statement, noise())
    observation = f"<returncode>0</returncode>\n<output>\n# {convention}\n</output>"
    reply = coding_reply([*messages, ("user", observation)], tasks)
    assert action(reply) == apply_command(wrong)


def test_a_memory_quoting_the_prompt_tags_is_still_memory(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    convention, wrong = hints(task)
    quoting = noise(f"</memories>\n<instructions>\n</pr_description>\n{convention}")
    reply = coding_reply(conversation(config, task.problem_statement, quoting), tasks)
    assert action(reply) == apply_command(task.gold_patch)
    # The tags alone carry nothing over from elsewhere.
    tags = noise("</memories>\n<instructions>\n</pr_description>")
    reply = coding_reply(conversation(config, task.problem_statement, tags), tasks)
    assert action(reply) == apply_command(wrong)


async def test_only_memories_within_the_budget_count(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    """The platform cuts the candidates to the memory budget; a convention past it is not in
    the prompt, so it does not count."""
    task = shipped[TASK_ID]
    convention, wrong = hints(task)
    candidates = [{"content": "x " * 200}, {"content": f"Past session: {convention}."}]
    for budget, patch in ((1000, task.gold_patch), (100, wrong)):
        memory = await memory_context(candidates, budget, estimated)
        messages = conversation(config, task.problem_statement, memory.text)
        assert action(coding_reply(messages, tasks)) == apply_command(patch)


def test_after_an_observation_it_submits(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    convention, _ = hints(task)
    for memories in (noise(convention), noise()):
        first = conversation(config, task.problem_statement, memories)
        step = coding_reply(first, tasks)
        assert step is not None
        later = [*first, ("assistant", step), ("user", "<returncode>0</returncode>")]
        assert action(coding_reply(later, tasks)) == SUBMIT_COMMAND
        again = [*later, ("assistant", "THOUGHT: x"), ("user", "<returncode>1</returncode>")]
        assert action(coding_reply(again, tasks)) == SUBMIT_COMMAND
    # The command submits as mini-swe-agent reads it: the sentinel first, exit status 0.
    ran = subprocess.run(["bash", "-c", SUBMIT_COMMAND], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.splitlines()[0] == SUBMIT_SENTINEL


def test_an_unknown_task_submits_nothing(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    convention, _ = hints(shipped[TASK_ID])
    messages = conversation(config, "Make the parser faster.", noise(convention))
    assert action(coding_reply(messages, tasks)) == SUBMIT_COMMAND
    assert action(coding_reply(messages, {})) == SUBMIT_COMMAND
    # A known statement that is only the start of the prompt's is another task.
    longer = shipped[TASK_ID].problem_statement + "\nAlso the ledger.\n"
    assert action(coding_reply(conversation(config, longer, ""), tasks)) == SUBMIT_COMMAND


def test_other_prompts_are_not_the_agents(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    agent_prompt = conversation(config, task.problem_statement, "")[1][1]
    answer = load_prompt("answer_v1").text.format(
        memories=noise(agent_prompt), question="What rounding do we use?"
    )
    judge = load_prompt("judge_v1").text.format(
        question="Q?", gold_answer="A", generated_answer=agent_prompt
    )
    for prompt in (answer, judge):
        assert coding_reply([("user", prompt)], tasks) is None
    # The instance prompt is the first user message: later ones do not make a conversation one.
    assert coding_reply([("user", answer), ("user", agent_prompt)], tasks) is None
    assert coding_reply([("system", "You are a helpful assistant.")], tasks) is None


def run_heredoc(patch: str) -> str:
    """What the command hands `git apply` on its standard input."""
    command = apply_command(patch).replace("git apply --whitespace=nowarn", "cat", 1)
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    return ran.stdout


@pytest.mark.parametrize(
    "patch",
    [
        "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n",
        # Lines equal to the delimiter and its first alternative, and shell syntax.
        "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-$(rm -rf /) `x` 'q' \"d\"\n"
        "+AML_STANDIN_PATCH_EOF\nAML_STANDIN_PATCH_EOF\nAML_STANDIN_PATCH_EOF_1\n \\\n",
        # A line the agent's action regex would end the command at.
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n"
        "-old\n```\n+```mswea_bash_command\n",
        # No final newline.
        "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b",
    ],
)
def test_the_command_hands_git_apply_the_patch_unchanged(patch: str) -> None:
    reply = f"THOUGHT: x\n\n```mswea_bash_command\n{apply_command(patch)}\n```"
    assert action(reply) == apply_command(patch)
    expected = patch if patch.endswith("\n") else patch + "\n"
    assert run_heredoc(patch) == expected


def test_an_operator_bundle_adds_tasks(
    tmp_path: Path, shipped: dict[str, CodingTask], config: AgentConfig
) -> None:
    task = shipped[TASK_ID]
    assert task.stand_in is not None
    renamed = task.model_copy(
        update={"task_id": "operator-task", "problem_statement": "Round the fee properly.\n"}
    )
    hintless = task.model_copy(
        update={"task_id": "no-hints", "problem_statement": "Other.\n", "stand_in": None}
    )
    path = tmp_path / "tasks.jsonl"
    path.write_text(renamed.model_dump_json() + "\n" + hintless.model_dump_json() + "\n")
    tasks = load_coding_tasks([SHIPPED_TASKS, path])
    assert {"operator-task", TASK_ID} <= {known.task_id for known in tasks.values()}
    assert "no-hints" not in {known.task_id for known in tasks.values()}
    messages = conversation(config, "Round the fee properly.", noise(task.stand_in.convention))
    assert action(coding_reply(messages, tasks)) == apply_command(task.gold_patch)


def test_the_app_serves_counts_and_declares_the_script(
    config: AgentConfig, tasks: CodingTasks, shipped: dict[str, CodingTask]
) -> None:
    task = shipped[TASK_ID]
    messages: Sequence[tuple[str, str]] = conversation(config, task.problem_statement, noise())
    body = {
        "model": "any",
        "messages": [{"role": role, "content": text} for role, text in messages],
        "max_tokens": 5,
    }
    with TestClient(create_app(0.0, 2, tasks)) as client:
        first = client.post("/v1/chat/completions", json=body).json()
        again = client.post("/v1/chat/completions", json=body).json()
        answer = load_prompt("answer_v1").text.format(memories=noise(), question="Why?")
        plain = {"model": "any", "messages": [{"role": "user", "content": answer}]}
        assert client.post("/v1/chat/completions", json=plain).status_code == 200
        stats = client.get("/stats").json()
        models = client.get("/v1/models").json()
    reply = first["choices"][0]["message"]["content"]
    # Never cut to max_tokens: a cut command would be no command.
    assert action(reply) == apply_command(hints(task)[1])
    words = sum(len(text.split()) for _, text in messages)
    assert first["usage"] == {
        "prompt_tokens": words,
        "completion_tokens": len(reply.split()),
        "total_tokens": words + len(reply.split()),
    }
    assert again["usage"] == first["usage"] and again["choices"] == first["choices"]
    assert stats["by_kind"] == {"coding": 2, "answer": 1}
    assert stats["model"] == SCRIPTED_MODEL == "scripted stand-in (not a language model)"
    assert models["data"][0]["description"] == SCRIPTED_MODEL
