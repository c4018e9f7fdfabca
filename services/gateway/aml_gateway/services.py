"""What every request works with: settings, stores, broker, secrets and the clock, built once at
start (`aml_gateway.main`). No HTTP here, so the rule modules take it as it is."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from faststream.nats import NatsBroker
from pymongo.asynchronous.database import AsyncDatabase

from aml_gateway.limits import Limits
from aml_gateway.settings import GatewaySettings
from aml_gateway.ties import Ties
from aml_runtime.broker import Bus, JetStreamBus
from aml_runtime.clock import now
from aml_runtime.db import Document
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores


@dataclass
class Services:
    settings: GatewaySettings
    # The driver, for the readiness ping only; every read and write goes through `stores`.
    db: AsyncDatabase[Document]
    broker: NatsBroker
    box: SecretBox
    # Quotas are rules over time; tests move this clock across their boundaries.
    clock: Callable[[], datetime] = now
    # Questions per category of each dataset this process could read, keyed by (dataset id,
    # datasets root, bundle hash): `GET /v1/datasets` reads and hash-checks a file once.
    dataset_counts: dict[tuple[str, Path, str], dict[int, int]] = field(default_factory=dict)
    # The boards' ties, by the entry ids shown (`aml_gateway.ties`): computed once per board.
    ties: Ties = field(default_factory=Ties)
    # Per-address brakes on access requests and failed authentications (`aml_gateway.limits`),
    # kept in `stores.limits`, so they hold for every replica together.
    limits: Limits = field(init=False)
    # Submissions announced over the broker's connection (`aml_runtime.broker.Bus`).
    bus: Bus = field(init=False)
    # Jobs; teams, versions, names, sealed keys; access requests; leaderboard entries; the
    # audit trail and the searches (`aml_runtime.stores`), over `db`.
    stores: Stores = field(init=False)

    def __post_init__(self) -> None:
        self.bus = JetStreamBus(self.broker)
        self.stores = Stores.over(self.db)
        self.limits = Limits.from_settings(self.settings, self.stores.limits)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
