"""The code that reads and writes MongoDB: one module per group of collections (`accounts`,
`access_requests`, `leaderboard`, `jobs`, ...), each the only code that touches its collections
(tests/unit/test_stores.py holds every collection to its owner). Callers ask for named
transitions and look-ups, which take and return the typed models of `aml_runtime.documents`
where a caller reads a whole document, and exactly the fields a projection asks for where it
does not. A store adds no round trip and changes no query: each method sends the filter,
update, projection, sort and options its callers sent before (tuned for nx-27017)."""

from __future__ import annotations

from dataclasses import dataclass

from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.db import Document
from aml_runtime.stores.access_requests import AccessRequestStore
from aml_runtime.stores.accounts import AccountStore
from aml_runtime.stores.audit import AuditStore
from aml_runtime.stores.capacity import SlotStore
from aml_runtime.stores.jobs import JobStore
from aml_runtime.stores.leaderboard import LeaderboardStore
from aml_runtime.stores.limits import LimitStore
from aml_runtime.stores.outages import OutageStore
from aml_runtime.stores.plans import PlanStore
from aml_runtime.stores.stage_records import StageRecordStore


@dataclass(frozen=True)
class Stores:
    """One of every store, over one database: what handlers and pipeline functions take instead
    of the database itself. It is their one seam to MongoDB, so a test hands them fakes of the
    stores rather than of the driver. A process builds it once (`Stores.over`: in
    `aml_runtime.service.open_runtime`, or at the gateway's start-up); only its composition root
    keeps the database, for what no store does (indexes, the readiness ping)."""

    jobs: JobStore
    plans: PlanStore
    records: StageRecordStore
    audit: AuditStore
    slots: SlotStore
    outages: OutageStore
    accounts: AccountStore
    access_requests: AccessRequestStore
    leaderboard: LeaderboardStore
    limits: LimitStore

    @classmethod
    def over(cls, db: AsyncDatabase[Document]) -> Stores:
        return cls(
            jobs=JobStore(db),
            plans=PlanStore(db),
            records=StageRecordStore(db),
            audit=AuditStore(db),
            slots=SlotStore(db),
            outages=OutageStore(db),
            accounts=AccountStore(db),
            access_requests=AccessRequestStore(db),
            leaderboard=LeaderboardStore(db),
            limits=LimitStore(db),
        )
