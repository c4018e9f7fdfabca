"""What a replica set and a rolling upgrade rely on, checked without a server: the client options
every service connects to MongoDB with (`aml_runtime.db.connect`: majority, journaled,
retryable writes; majority reads from the primary), and the build each stage process records on
the jobs it works on (`aml_pipeline.jobs.JobStates`, `aml_runtime.codehash`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from fake_stores import memory_stores
from faststream.nats import NatsBroker
from pymongo import ReadPreference

from aml_pipeline.jobs import JobStates
from aml_runtime.codehash import CODE_HASH_OVERRIDE, code_hash
from aml_runtime.db import connect
from aml_runtime.documents import code_hashes_of
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores


async def test_services_connect_with_majority_journaled_writes_and_primary_reads() -> None:
    # No server is contacted: the client connects lazily, and its options are fixed here.
    settings = CommonSettings(mongo_url="mongodb://db-0,db-1,db-2/?replicaSet=aml", mongo_db="x")
    client, db = connect(settings)
    try:
        for holder in (client, db, db["jobs"]):
            assert holder.write_concern.document == {"w": "majority", "j": True}
            assert holder.write_concern.acknowledged
            assert holder.read_preference == ReadPreference.PRIMARY
            assert holder.read_concern.level == "majority"
        assert client.options.retry_writes is True
        assert client.options.retry_reads is True
        assert client.options.replica_set_name == "aml"
        assert client.codec_options.tz_aware is True
    finally:
        await client.close()


async def test_the_services_options_win_over_weaker_ones_in_the_url() -> None:
    weak = "mongodb://db-0/?replicaSet=aml&w=1&journal=false&readPreference=secondary"
    client, db = connect(CommonSettings(mongo_url=weak))
    try:
        assert db.write_concern.document == {"w": "majority", "j": True}
        assert db.read_preference == ReadPreference.PRIMARY
    finally:
        await client.close()


def test_the_code_hash_override_names_another_build(monkeypatch: pytest.MonkeyPatch) -> None:
    own = code_hash()
    monkeypatch.setenv(CODE_HASH_OVERRIDE, "another-build")
    assert code_hash() == "another-build"
    # Only the pipeline's hash: any other set of packages is still hashed from its files.
    assert code_hash(("aml_contract",)) != "another-build"
    monkeypatch.setenv(CODE_HASH_OVERRIDE, " ")
    assert code_hash() == own


class _Connection:
    async def subscribe(self, subject: str, cb: Any) -> object:
        return object()


def _job_states(stores: Any, build: str | None = None) -> JobStates:
    # Only the job store is used.
    over = cast(Stores, SimpleNamespace(jobs=stores.jobs))
    broker = cast(NatsBroker, SimpleNamespace(connection=_Connection()))
    if build is None:
        return JobStates(over, broker)
    return JobStates(over, broker, code_hash=build)


async def test_a_stage_process_records_its_build_once_per_active_job() -> None:
    stores = memory_stores()
    stores.jobs.jobs["j1"] = {"_id": "j1", "state": "running", "code_hash": "old"}
    stores.jobs.jobs["j2"] = {"_id": "j2", "state": "failed", "code_hash": "old"}
    writes: list[tuple[str, str]] = []
    record = stores.jobs.record_code_hash

    async def counted(job_id: str, build: str) -> None:
        writes.append((job_id, build))
        await record(job_id, build)

    stores.jobs.record_code_hash = counted  # type: ignore[method-assign]
    old = _job_states(stores, "old")
    for _ in range(3):
        assert await old.is_active("j1")
        old._jobs.clear()  # every call reads the job again, as after `_JOB_READ_SECONDS`
    assert not await old.is_active("j2")
    assert writes == [("j1", "old")]
    assert code_hashes_of(stores.jobs.jobs["j1"]) == ["old"]
    assert code_hashes_of(stores.jobs.jobs["j2"]) == []

    # The process replaced by another build mid-job: both are on the job.
    new = _job_states(stores, "new")
    assert await new.is_active("j1")
    assert code_hashes_of(stores.jobs.jobs["j1"]) == ["new", "old"]


def test_the_build_is_this_processs_own_by_default() -> None:
    assert _job_states(memory_stores()).code_hash == code_hash()
