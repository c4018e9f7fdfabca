"""The release baseline of a deployment (`aml baseline`, `aml up`): what every job this
scheduler plans records — evaluation spec hash, code hash, dataset bundle hash — and the
questions per dataset its results account for, computed by the same functions
`ScheduleJobs._plan` calls. Its JSON is the `ReleaseBaseline` the publisher's gate compares jobs
with (`AML_RELEASE_BASELINE`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aml_contract.api.publication import ReleaseBaseline
from aml_evaluation.registry import bundle_hash, open_dataset
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.codehash import code_hash
from aml_scheduler.planning import bundle_fingerprint
from aml_scheduler.settings import SchedulerSettings


@dataclass(frozen=True)
class Baseline:
    release: ReleaseBaseline
    # Per dataset: its bundle hash (the release's `dataset_bundle_hash` is one hash over them).
    bundles: dict[str, str]


def release_baseline(settings: SchedulerSettings, datasets: Sequence[str]) -> Baseline:
    """The baseline for jobs over `datasets` (a publishable full run always runs the fixed
    suite, AML_FULL_SUITE), reading the benchmark files under `settings.datasets_root`."""
    bundles: dict[str, str] = {}
    counts: dict[str, int] = {}
    coding = False
    for dataset_id in datasets:
        manifest, dataset = open_dataset(dataset_id, settings.datasets_root)
        bundles[dataset_id] = bundle_hash(manifest)
        # Every planned question ends in the results (excluded categories included), which is
        # what the gate's `question_counts` check sums.
        counts[dataset_id] = len(dataset.questions)
        coding = coding or manifest.track == "coding"
    # A coding suite's jobs record the spec with the coding agent (`ScheduleJobs.spec_of`).
    evaluation_spec = build_evaluation_spec(settings, coding=coding)
    release = ReleaseBaseline(
        answer_model=evaluation_spec.answer.model,
        spec_hash=evaluation_spec.content_hash,
        code_hash=code_hash(),
        dataset_bundle_hash=bundle_fingerprint(bundles),
        question_counts=counts,
    )
    return Baseline(release=release, bundles=bundles)


def render(baseline: Baseline) -> str:
    release = baseline.release
    lines = [
        f"answer model         {release.answer_model}",
        f"spec hash            {release.spec_hash}",
        f"code hash            {release.code_hash}",
        f"dataset bundle hash  {release.dataset_bundle_hash}",
    ]
    for dataset_id, digest in baseline.bundles.items():
        count = release.question_counts[dataset_id]
        lines.append(f"  {dataset_id:<18} bundle {digest}  {count} questions")
    return "\n".join(lines)
