"""The participant simulator: an HTTP server implementing the participant contract (SPEC
section 4) whose behaviour - latency, capacity, answers attempt by attempt, malformed bodies,
dropped connections, asynchronous Adds, cross-user leakage - is scripted per run, and which
records every request it receives. Used by the tests and by the performance benchmark."""

from .memory import Memory, Ranking
from .recording import TOTAL, RequestRecord, SimulatorSnapshot
from .responses import NOT_JSON_BODY
from .script import (
    EndpointScript,
    FixedLatency,
    LognormalLatency,
    Outcome,
    Script,
    ScriptedAuth,
    ScriptedCapacity,
    ScriptedLeak,
    UniformLatency,
)
from .simulator import Simulator, running_simulator, serving_simulator

__all__ = [
    "NOT_JSON_BODY",
    "TOTAL",
    "EndpointScript",
    "FixedLatency",
    "LognormalLatency",
    "Memory",
    "Outcome",
    "Ranking",
    "RequestRecord",
    "Script",
    "ScriptedAuth",
    "ScriptedCapacity",
    "ScriptedLeak",
    "Simulator",
    "SimulatorSnapshot",
    "UniformLatency",
    "running_simulator",
    "serving_simulator",
]
