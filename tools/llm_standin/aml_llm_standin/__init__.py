"""An OpenAI-compatible stand-in for the answer and judge models and the coding agent's model:
fixed latency, a declared capacity beyond which requests are answered 429 (so a platform that
over-sends shows, instead of being hidden by queueing), deterministic replies the platform's
parsers accept, and counters (`GET /stats`; `GET /stats/intervals`: when each served request
held its slot). For the load benchmark, tests and the demo: `python -m aml_llm_standin --port P`.

It is a scripted stand-in, not a language model (`SCRIPTED_MODEL`, reported by `GET /stats` and
`GET /v1/models`): answers are cut from the prompt, judge labels come from a hash, and a coding
agent's steps follow a script (coding.py) that applies a synthetic-coding task's gold patch only
when the task's convention is among the memories in its prompt, a plausible wrong patch
otherwise."""

from .app import create_app
from .coding import SCRIPTED_MODEL, ScriptedTask, coding_reply, load_coding_tasks
from .replies import reply_for
from .stats import BusyIntervals, CallStats, StatsReport, max_in_window

__all__ = [
    "SCRIPTED_MODEL",
    "BusyIntervals",
    "CallStats",
    "ScriptedTask",
    "StatsReport",
    "coding_reply",
    "create_app",
    "load_coding_tasks",
    "max_in_window",
    "reply_for",
]
