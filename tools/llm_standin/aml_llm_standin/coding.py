"""The scripted coding agent model: what the stand-in answers a coding agent's conversation.

A local small model cannot solve a coding task, so the coding track's tests and demo drive the
real agent (mini-swe-agent, text-based: one ```mswea_bash_command``` block a reply) with this
script instead. It is not a language model and does not read the task: it looks the task up by
its problem statement among the tasks it was given (each with its `StandInHints`, which exist
for it alone) and decides one thing, whether the task's convention phrase is among the memories
the platform put in the prompt:

- first reply (no assistant turn yet): a command that applies the task's gold patch when the
  convention is there, its stand-in's wrong patch (plausible, misses the convention) otherwise;
- every later reply: the submit command (the sentinel as the first line of output, exit 0);
  the platform takes the patch from the working copy's diff, so nothing else is submitted;
- a task it does not know: the submit command at once, having changed nothing (unresolved).

**Recognising the agent.** A conversation is a coding agent's when its first user message, the
agent's instance prompt, starts with `<pr_description>` (mini-swe-agent's SWE-bench template
begins so; the answer and judge prompts never do). Only that message is read: observations are
command output, where the phrase may show up for reasons that say nothing about memory.

**The memory section.** The instance prompt is `<pr_description>`, "Consider the following PR
description:", the problem statement, `</pr_description>`, then the platform's optional
`<memories>` block, then `<instructions>` (upstream's fixed text). The problem statement ends
at the first `</pr_description>` that makes what precedes it a known task's statement; the
memory section is what lies between that and the last `<instructions>` (a memory may quote the
tags, the fixed instructions do not), inside `<memories>` ... `</memories>`. So the phrase
counts only where the platform put it, within its memory budget, never in the problem
statement. Whitespace is compared collapsed (a multi-line memory is indented when rendered, and
a memory system may reflow text); case is kept.

**The command.** The patch goes to `git apply` through a here-doc with a quoted delimiter (no
expansion) chosen so that no line of the patch equals it. mini-swe-agent ends the action at the
first line that starts with three backticks; no line of a unified diff does, but a patch that
breaks the rule anyway is handed in base64 instead, so the action is always the whole command.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aml_evaluation.coding.bundle import TASKS_FILE, read_tasks
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR

SCRIPTED_MODEL: Final = "scripted stand-in (not a language model)"
# mini-swe-agent's (upstream's, not the platform's): the first output line that submits.
SUBMIT_SENTINEL: Final = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_COMMAND: Final = f"echo {SUBMIT_SENTINEL}"
SHIPPED_TASKS: Final = SHIPPED_BUNDLE_DIR / TASKS_FILE

_PR_OPEN: Final = "<pr_description>"
_PR_CLOSE: Final = "</pr_description>"
_PR_PREAMBLE: Final = "Consider the following PR description:"
_MEMORIES_OPEN: Final = "<memories>"
_MEMORIES_CLOSE: Final = "</memories>"
_INSTRUCTIONS: Final = "<instructions>"
_FENCE: Final = "```"
_DELIMITER: Final = "AML_STANDIN_PATCH_EOF"
_BASE64_LINE: Final = 76

_WITH_CONVENTION: Final = (
    "THOUGHT: [scripted stand-in] The memories state the convention this task depends on, so I "
    "apply the fix that follows it."
)
_WITHOUT_CONVENTION: Final = (
    "THOUGHT: [scripted stand-in] The memories do not state the convention this task depends "
    "on, so I apply the fix the problem statement suggests."
)
_SUBMIT: Final = "THOUGHT: [scripted stand-in] The change is in place; I submit it."
_UNKNOWN: Final = (
    "THOUGHT: [scripted stand-in] I have no script for this task, so I submit without changes."
)


@dataclass(frozen=True)
class ScriptedTask:
    """What the script needs of a task (from its CodingTask and StandInHints)."""

    task_id: str
    convention: str
    gold_patch: str
    wrong_patch: str


# A known task by its problem statement, whitespace collapsed (`statement_key`).
CodingTasks = Mapping[str, ScriptedTask]


def _collapsed(text: str) -> str:
    return " ".join(text.split())


def statement_key(problem_statement: str) -> str:
    return _collapsed(problem_statement)


def load_coding_tasks(paths: Iterable[Path] = (SHIPPED_TASKS,)) -> dict[str, ScriptedTask]:
    """The tasks of these tasks.jsonl files (read and validated by the bundle's own reader) that
    carry stand-in hints, by problem statement; for one statement a later file's task wins, so
    an operator's bundle given after the shipped one replaces its task. Raises the reader's
    CodingBundleError for a file it refuses."""
    tasks: dict[str, ScriptedTask] = {}
    for path in paths:
        for task in read_tasks(path):
            if task.stand_in is None:
                continue
            tasks[statement_key(task.problem_statement)] = ScriptedTask(
                task_id=task.task_id,
                convention=task.stand_in.convention,
                gold_patch=task.gold_patch,
                wrong_patch=task.stand_in.wrong_patch,
            )
    return tasks


def instance_prompt(messages: Sequence[tuple[str, str]]) -> str | None:
    """The agent's instance prompt when `messages` ((role, text) pairs) are a coding agent's
    conversation, else None."""
    first_user = next((text for role, text in messages if role == "user"), None)
    if first_user is None or not first_user.lstrip().startswith(_PR_OPEN):
        return None
    return first_user


def _task_and_memories(prompt: str, tasks: CodingTasks) -> tuple[ScriptedTask | None, str]:
    """The task whose problem statement the prompt shows, and the memory section's text."""
    body = prompt.lstrip().removeprefix(_PR_OPEN).lstrip().removeprefix(_PR_PREAMBLE)
    end = body.find(_PR_CLOSE)
    while end >= 0:
        task = tasks.get(statement_key(body[:end]))
        if task is not None:
            rest = body[end + len(_PR_CLOSE) :]
            instructions = rest.rfind(_INSTRUCTIONS)
            section = rest if instructions < 0 else rest[:instructions]
            opened = section.find(_MEMORIES_OPEN)
            if opened < 0:
                return task, ""
            inside = section[opened + len(_MEMORIES_OPEN) :]
            closed = inside.rfind(_MEMORIES_CLOSE)
            return task, inside if closed < 0 else inside[:closed]
        end = body.find(_PR_CLOSE, end + 1)
    return None, ""


def apply_command(patch: str) -> str:
    """A bash command that applies `patch` to the working directory with `git apply`."""
    if not patch.endswith("\n"):
        patch += "\n"
    if ("\n" + patch).find("\n" + _FENCE) >= 0:
        encoded = base64.b64encode(patch.encode("utf-8")).decode("ascii")
        lines = [encoded[i : i + _BASE64_LINE] for i in range(0, len(encoded), _BASE64_LINE)]
        # The base64 alphabet has no '_': the delimiter cannot be one of its lines.
        body = "\n".join(lines)
        return f"base64 -d <<'{_DELIMITER}' | git apply --whitespace=nowarn\n{body}\n{_DELIMITER}"
    taken = set(patch.split("\n"))
    delimiter, number = _DELIMITER, 0
    while delimiter in taken:
        number += 1
        delimiter = f"{_DELIMITER}_{number}"
    return f"git apply --whitespace=nowarn <<'{delimiter}'\n{patch}{delimiter}"


def _reply(thought: str, command: str) -> str:
    return f"{thought}\n\n```mswea_bash_command\n{command}\n```"


def coding_reply(messages: Sequence[tuple[str, str]], tasks: CodingTasks) -> str | None:
    """The script's reply to a coding agent's conversation ((role, text) pairs, as sent), or
    None when the conversation is not a coding agent's."""
    prompt = instance_prompt(messages)
    if prompt is None:
        return None
    task, memories = _task_and_memories(prompt, tasks)
    if task is None:
        return _reply(_UNKNOWN, SUBMIT_COMMAND)
    if any(role == "assistant" for role, _ in messages):
        return _reply(_SUBMIT, SUBMIT_COMMAND)
    if _collapsed(task.convention) in _collapsed(memories):
        return _reply(_WITH_CONVENTION, apply_command(task.gold_patch))
    return _reply(_WITHOUT_CONVENTION, apply_command(task.wrong_patch))


def word_count(texts: Iterable[str]) -> int:
    """The usage the script reports: words, a deterministic count for any text."""
    return sum(len(text.split()) for text in texts)
