"""Request-scoped dependencies: the stores, the broker and who is calling."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from faststream.nats import NatsBroker
from pymongo.asynchronous.database import AsyncDatabase

from aml_gateway.settings import GatewaySettings
from aml_runtime.db import Document
from aml_runtime.jobs import now
from aml_runtime.secrets import SecretBox


@dataclass
class Services:
    settings: GatewaySettings
    db: AsyncDatabase[Document]
    broker: NatsBroker
    box: SecretBox
    # Quotas are rules over time; tests move this clock across their boundaries.
    clock: Callable[[], datetime] = now
    # Questions per category of each dataset this process could read, keyed by (dataset id,
    # datasets root, bundle hash): `GET /v1/datasets` reads and hash-checks a file once.
    dataset_counts: dict[tuple[str, Path, str], dict[int, int]] = field(default_factory=dict)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]


def bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise HTTPException(401, {"reason": "send the Leaderboard API Key as a Bearer token"})
    return authorization[7:].strip()


async def current_team(
    svc: ServicesDep, authorization: Annotated[str | None, Header()] = None
) -> Document:
    team = await svc.db.teams.find_one({"key_hash": key_hash(bearer(authorization))})
    if team is None:
        raise HTTPException(401, {"reason": "unknown Leaderboard API Key"})
    return team


async def require_admin(
    svc: ServicesDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    expected = svc.settings.admin_token.get_secret_value()
    # A missing token is refused like a wrong one (403): admin routes answer no one else.
    given = ""
    if authorization and authorization.lower().startswith("bearer "):
        given = authorization[7:].strip()
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(403, {"reason": "admin access required"})


TeamDep = Annotated[Document, Depends(current_team)]
AdminDep = Annotated[None, Depends(require_admin)]
