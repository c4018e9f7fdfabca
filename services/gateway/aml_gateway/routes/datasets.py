"""The datasets a job may run (`GET /v1/datasets`): public, like the leaderboard, since a team
needs the ids before it has a key, and nothing in it is private (ids, tracks, categories and
question counts; never a question or an answer).

What is listed is the gateway's own configuration (AML_SMOKE_SUITE, AML_SMOKE_DATASETS,
AML_FULL_SUITE), then every dataset the operator registered (`aml dataset add`, manifests under
AML_DATASETS_ROOT/manifests) that is not configured, with `runnable` false: an operator adds its
id to AML_SMOKE_DATASETS or AML_FULL_SUITE to let jobs run it. Each is described by its bundle
manifest (shipped or operator), track included. The question counts are the manifest's
`question_counts` when it has them (no file read), else they come from the dataset files under
AML_DATASETS_ROOT, loaded (hash-checked) once per process, and are null where this gateway cannot
read them (licensed data is often mounted on the scheduler only).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog
from fastapi import APIRouter

from aml_contract.api.datasets import DatasetCategory, DatasetInfo
from aml_evaluation.registry import (
    DatasetFileError,
    DatasetManifest,
    bundle_hash,
    bundle_root,
    count_questions,
    list_manifests,
    load_manifest_bundle,
    registered,
)
from aml_gateway.deps import GuardedRoute, ServicesDep
from aml_gateway.services import Services
from aml_gateway.settings import GatewaySettings

log = structlog.get_logger()

router = APIRouter(route_class=GuardedRoute, prefix="/v1/datasets", tags=["datasets"])


def valid_ids(settings: GatewaySettings) -> list[str]:
    """Every dataset id a job may run, in a stable order: the smoke sample, the other
    datasets a smoke run may name, then the full suite."""
    ordered = [*settings.smoke_suite, *settings.smoke_datasets, *settings.full_suite]
    return list(dict.fromkeys(ordered))


def smoke_ids(settings: GatewaySettings) -> list[str]:
    return list(dict.fromkeys([*settings.smoke_suite, *settings.smoke_datasets]))


async def _questions(
    dataset_id: str,
    manifest: DatasetManifest,
    root: Path,
    known: dict[tuple[str, Path, str], dict[int, int]],
) -> dict[int, int]:
    """The manifest's counts when it has them; else counted from the files. Only successful
    counts are kept in `known`, so files mounted later are counted on the next request."""
    if manifest.question_counts is not None:
        return manifest.question_counts
    key = (dataset_id, root, bundle_hash(manifest))
    if key not in known:
        # Reading and hash-checking a bundle takes a while: off the event loop.
        dataset = await asyncio.to_thread(
            load_manifest_bundle, manifest, bundle_root(manifest, root)
        )
        known[key] = count_questions(dataset)
    return known[key]


async def describe(dataset_id: str, svc: Services) -> DatasetInfo | None:
    settings = svc.settings
    try:
        manifest = registered(dataset_id, settings.datasets_root).manifest
    except (KeyError, OSError, ValueError):
        # A configured id without a manifest: no job could run it either.
        log.warning("dataset_without_manifest", dataset_id=dataset_id)
        return None
    counts: dict[int, int] | None
    try:
        counts = await _questions(dataset_id, manifest, settings.datasets_root, svc.dataset_counts)
    except (DatasetFileError, OSError, ValueError) as error:
        log.info("dataset_not_counted", dataset_id=dataset_id, reason=str(error))
        counts = None
    categories = [
        DatasetCategory(
            number=number,
            name=name,
            questions=None if counts is None else counts.get(number, 0),
            in_overall=number not in manifest.excluded_from_overall,
        )
        for number, name in sorted(manifest.categories.items())
    ]
    return DatasetInfo(
        dataset_id=dataset_id,
        version=manifest.version,
        track=manifest.track,
        questions=None if counts is None else sum(counts.values()),
        categories=categories,
        smoke_default=dataset_id in settings.smoke_suite,
        smoke=dataset_id in smoke_ids(settings),
        full_suite=dataset_id in settings.full_suite,
        runnable=dataset_id in valid_ids(settings),
    )


@router.get("")
async def list_datasets(svc: ServicesDep) -> list[DatasetInfo]:
    """The datasets jobs may run, then the operator's registered ones jobs may not run yet
    (`runnable` false), with track, categories and question counts (no key needed)."""
    configured = valid_ids(svc.settings)
    registry = await asyncio.to_thread(list_manifests, svc.settings.datasets_root)
    others = [
        item.dataset_id
        for item in registry
        if item.source == "operator" and item.dataset_id not in configured
    ]
    found = [await describe(dataset_id, svc) for dataset_id in [*configured, *others]]
    return [info for info in found if info is not None]
