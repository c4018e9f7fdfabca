"""The reference memory system: a small real participant (SQLite FTS5 + BM25) implementing the
Add/Search contract, used by the demo and the integration tests."""

from .app import create_app
from .settings import MemoryServerSettings

__all__ = ["MemoryServerSettings", "create_app"]
