"""What a sandbox is asked for and what it answers: its limits, a command's result, and the two
kinds of failure the coding track must count apart."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

MIB = 1 << 20
TIMED_OUT = -1
GIB = 1 << 30


class SandboxFault(RuntimeError):
    """The platform failed, not the agent: bwrap did not start, a snapshot archive is unreadable or
    hostile, a working copy could not be diffed or removed. The track counts these as platform
    failures; everything a command does to itself (a non-zero exit, a timeout, too much output)
    is a `CommandResult` instead."""


class SandboxUnavailable(SandboxFault):
    """This machine cannot run sandboxes at all (bwrap missing or unable to create namespaces).
    The message is one line, meant to be the reason a process refuses to start."""


class WorkingCopyRejected(Exception):
    """The agent left a working copy `Sandbox.patch` will not diff (too many files or bytes, a
    path too long for the host): the agent's failure, with the reason, never a `SandboxFault`."""


class SandboxLimits(BaseModel):
    """Per-command limits. Every command runs in a fresh set of namespaces, so each one gets the
    whole budget; `wall_seconds` can be overridden per call (`Sandbox.run(timeout=...)`)."""

    model_config = ConfigDict(frozen=True)

    # A coding agent's step (a test run of a small project) takes seconds; a minute is generous
    # and still bounds what a hostile `sleep` costs.
    wall_seconds: float = Field(default=60.0, gt=0)
    # RLIMIT_CPU, per process: a busy loop dies even when its wall limit was raised.
    cpu_seconds: int = Field(default=60, gt=0)
    # RLIMIT_AS, per process (cgroup v1 here, so no memory cgroup): the stdlib test suites of small
    # projects stay far below 1 GiB; a 4 GiB allocation fails with MemoryError.
    address_space_bytes: int = Field(default=GIB, gt=0)
    # RLIMIT_NPROC inside the sandbox's own user namespace: it counts only this sandbox's
    # processes, so a fork bomb stops at this many while other sandboxes are unaffected.
    processes: int = Field(default=64, gt=1)
    # Output kept per command (its first and last halves); the rest is read and dropped.
    output_bytes: int = Field(default=MIB, gt=0)
    # RLIMIT_FSIZE: the largest file a command can write (in the working copy or /tmp).
    file_size_bytes: int = Field(default=64 * MIB, gt=0)
    # RLIMIT_NOFILE.
    open_files: int = Field(default=256, gt=2)
    # Size of each private tmpfs (/tmp and /dev/shm): host memory, hence capped.
    tmp_bytes: int = Field(default=64 * MIB, gt=0)
    # What `Sandbox.patch` reads of a working copy, so a command cannot make the diff (done on
    # the host) arbitrarily long.
    working_copy_files: int = Field(default=100_000, gt=0)
    working_copy_bytes: int = Field(default=GIB, gt=0)
    # A fork bomb or a busy test run should lose to the platform's own processes for CPU.
    niceness: int = Field(default=10, ge=0, le=19)


class CommandResult(BaseModel):
    """One command's outcome, whatever it did: these are the agent's failures, never the
    platform's."""

    model_config = ConfigDict(frozen=True)

    # TIMED_OUT when the command was killed at its time limit (as the coding agent's runner
    # protocol, `aml_pipeline.coding_agent.CommandRunner`, has it: always an int).
    exit_code: int
    # stdout and stderr interleaved as written, decoded as UTF-8 (invalid bytes replaced). When
    # `truncated`, the first and last halves of the limit with a line saying how much was dropped.
    output: str
    truncated: bool
    # Every byte the command wrote, kept or not.
    output_bytes: int
    timed_out: bool
    duration_seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ClosedOnExit:
    """`with` a sandbox: closed (removed) when the block ends. A block leaving with an error
    keeps that error: a failed removal would say less."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is None:
            self.close()
            return
        with contextlib.suppress(SandboxFault):
            self.close()
