"""A stage made of one function, for the skeleton's tests: they watch admission and delivery,
not what a stage does with its item."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from aml_pipeline.stage_worker import WorkItem

W = TypeVar("W", bound=BaseModel)


@dataclass(frozen=True)
class FunctionStage(Generic[W]):
    work: type[W]
    handle: Callable[[W, WorkItem], Awaitable[None]]

    async def close(self) -> None:
        """Holds nothing."""
