"""A participant simulator on a fixed loopback port, which a test can take down and bring back,
and the check that a run stayed within a declared rate: shared by the tests that disturb whole
jobs (outages, a NATS node's loss)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from aml_devtools.processes import free_port
from aml_devtools.stack import HOST
from aml_participant_simulator import Script, Simulator
from aml_participant_simulator.script import EndpointScript


def slow_simulator(add_seconds: float, search_seconds: float) -> Simulator:
    """A simulator whose Adds and Searches each take this long, so a job's phases last long
    enough to be disturbed."""
    return Simulator(
        Script(
            add=EndpointScript(latency=add_seconds), search=EndpointScript(latency=search_seconds)
        )
    )


@dataclass
class Participant:
    simulator: Simulator
    port: int = field(default_factory=lambda: free_port(HOST))
    _serving: AbstractContextManager[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def up(self) -> None:
        self._serving = self.simulator.running(HOST, self.port)
        self._serving.__enter__()

    def down(self) -> None:
        if self._serving is not None:
            self._serving.__exit__(None, None, None)
            self._serving = None

    def first(self, endpoint: str) -> bool:
        return any(r.endpoint == endpoint for r in self.simulator.requests)

    def count(self, endpoint: str) -> int:
        return sum(1 for r in self.simulator.requests if r.endpoint == endpoint)


def max_in_window(moments: list[float], window: float = 1.0) -> int:
    """The most moments within any `window` seconds."""
    moments = sorted(moments)
    start, most = 0, 0
    for end, moment in enumerate(moments):
        while moment - moments[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most
