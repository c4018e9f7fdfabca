"""Test doubles of the coding track (R-2.5), shared by its unit and integration tests: the answer
model behind the openai client's one method the platform uses (`post`), replying from a script;
the coding agent's replies that apply a patch with a here-doc and submit; a task source over a
materialised bundle; a bundle's Adds as a job writes them; and, for unit tests only, a workspace
that stands in for the sandbox (the snapshot unpacked into a temporary directory, commands run
with bash there, no isolation)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from openai import AsyncOpenAI

from aml_evaluation.chunker import AddChunk, plan_adds
from aml_evaluation.coding.bundle import CodingBundle, CodingTask, extract_snapshot
from aml_evaluation.coding.dataset import coding_dataset
from aml_evaluation.datasets import DEFAULT_F1_VARIANT
from aml_evaluation.scoring import CODING_SCORER
from aml_pipeline.coding_agent import SUBMIT_SENTINEL
from aml_pipeline.coding_track import OpenTask, TaskFiles
from aml_pipeline.sandbox import CommandResult, SandboxLimits

_PATCH_END = "AML_PATCH_END"


def bash(command: str) -> str:
    """A reply of the agent's model in mini-swe-agent's text-based format."""
    return f"THOUGHT: next.\n\n```mswea_bash_command\n{command}\n```"


def apply_with_heredoc(patch: str) -> str:
    """The reply that edits the working copy: the patch handed to `git apply` by a here-doc."""
    assert _PATCH_END not in patch
    return bash(f"git apply --whitespace=nowarn <<'{_PATCH_END}'\n{patch}{_PATCH_END}")


SUBMIT = bash(f"echo {SUBMIT_SENTINEL} && echo submitted")


class ScriptedLLM:
    """The answer model: replies from `replies` in turn (the last one repeats), or raises
    `failure`; counts the usage it reports as the characters sent and replied."""

    def __init__(self, replies: Sequence[str], failure: Exception | None = None) -> None:
        self.replies = list(replies)
        self.failure = failure
        self.bodies: list[dict[str, Any]] = []

    @property
    def client(self) -> AsyncOpenAI:
        return cast(AsyncOpenAI, self)

    async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/chat/completions"
        self.bodies.append(body)
        if self.failure is not None:
            raise self.failure
        reply = self.replies[min(len(self.bodies), len(self.replies)) - 1]
        sent = sum(len(message["content"]) for message in body["messages"])
        return {
            "choices": [{"message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": sent, "completion_tokens": len(reply)},
        }


@dataclass(frozen=True)
class Files:
    task: CodingTask
    snapshot: Path


@dataclass(frozen=True)
class CodingManifest:
    """What the coding parser reads of a manifest (`aml_evaluation.datasets.BundleManifest`)."""

    dataset_id: str
    version: str = "1"
    scorer: str = CODING_SCORER
    f1_variant: str = DEFAULT_F1_VARIANT
    categories: Mapping[int, str] = field(default_factory=dict)


def bundle_adds(bundle: CodingBundle, run: str, dataset_id: str) -> list[AddChunk]:
    """A bundle's Adds for one run by the one path a job's take: the registry's mapping of the
    bundle to a dataset, then the chunker."""
    return plan_adds(coding_dataset(bundle, CodingManifest(dataset_id)), run)


def bundle_tasks(bundle: CodingBundle, root: Path) -> OpenTask:
    """A task source over a bundle materialised under `root` (any dataset id)."""

    def open_task(dataset_id: str, task_id: str) -> TaskFiles:
        task = bundle.task(task_id)
        return Files(task, root / task.snapshot)

    return open_task


class LocalWorkspace:
    """The sandbox's stand-in for unit tests: the snapshot unpacked into a temporary directory
    that is a git repository (its first commit the snapshot), so that `patch` is `git diff`
    against it; commands run with bash there, patches apply with `git apply`."""

    def __init__(self, archive: Path, limits: SandboxLimits) -> None:
        self.limits = limits
        self.root = Path(tempfile.mkdtemp(prefix="aml-workspace-"))
        self.tree = self.root / "repo"
        extract_snapshot(archive, self.tree)
        self._git("init", "-q")
        self._git("add", "-A")
        self._git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "snapshot")
        self.commands: list[str] = []
        self.closed = False

    def _git(self, *args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=self.tree, capture_output=True, text=True, check=True
        )
        return done.stdout

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        started = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=self.tree,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout or self.limits.wall_seconds,
                env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"},
                check=False,
            )
        except subprocess.TimeoutExpired as expired:
            output = expired.output or ""
            text = output if isinstance(output, str) else output.decode("utf-8", "replace")
            return CommandResult(
                exit_code=-1,
                output=text,
                truncated=False,
                output_bytes=len(text),
                timed_out=True,
                duration_seconds=time.monotonic() - started,
            )
        return CommandResult(
            exit_code=done.returncode,
            output=done.stdout,
            truncated=False,
            output_bytes=len(done.stdout.encode()),
            timed_out=False,
            duration_seconds=time.monotonic() - started,
        )

    def apply(self, patch: str) -> CommandResult:
        (self.root / "patch.diff").write_text(patch)
        return self.run(f"git apply --whitespace=nowarn {self.root / 'patch.diff'}")

    def patch(self) -> str:
        self._git("add", "-A")
        return self._git("diff", "--cached", "--binary", "--full-index")

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self.root, ignore_errors=True)
