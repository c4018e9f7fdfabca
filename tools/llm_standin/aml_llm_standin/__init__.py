"""An OpenAI-compatible stand-in for the answer and judge models: fixed latency, a declared
capacity beyond which requests are answered 429 (so a platform that over-sends shows, instead of
being hidden by queueing), deterministic replies the platform's parsers accept, and counters
(`GET /stats`; `GET /stats/intervals`: when each served request held its slot). For the load
benchmark and tests: `python -m aml_llm_standin --port P`."""

from .app import create_app
from .replies import reply_for
from .stats import BusyIntervals, CallStats, StatsReport, max_in_window

__all__ = ["BusyIntervals", "CallStats", "StatsReport", "create_app", "max_in_window", "reply_for"]
