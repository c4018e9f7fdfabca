"""The automatic publication gate (SPEC R-3.8), as a pure function over facts read from the
job's documents: no I/O here, so every rule is tested case by case.

One check per `GateCheckName`, in that order; a job is publishable (queued for admin review)
only when every check passes. Each reason names the values it compared.

- `mode_full`: the job is a full run (smoke results are never publishable, R-3.4).
- `all_items_succeeded`: the job completed; every Add chunk and every question's search, answer
  and score document is `done` (none `failed`, none missing against the planned totals); the
  error summary (`job_errors`) is empty. Items the platform itself failed (`platform_error`, as
  the scheduler records them at completion) are named first, as the platform's failure: the
  team is not charged for such a run and may simply run it again.
- `answer_model`, `spec_hash`, `code_hash`, `dataset_bundle_hash`: recorded on the job and equal
  to the operator's release baseline. `code_hash` also fails a job whose items were processed by
  more than one build, or by a build other than the one recorded at submission
  (`code_hashes`: a rolling upgrade that replaced workers mid-job): its results come from mixed
  code, the platform's doing, and the run is to be repeated.
- `question_counts`: per dataset, the questions the results account for (every category,
  including the ones excluded from the overall) equal the baseline's, for the same datasets.
- `not_duplicate`: no published, not disqualified leaderboard entry for the same version and
  track, and no published entry (disqualified or not: copied results stay copies) with the same
  results fingerprint (`aml_evaluation.aggregate.results_fingerprint`).

A value the job does not record fails its check with a reason starting with "missing"; without
a configured baseline every baseline check fails with "no release baseline configured".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field

from aml_contract.api.publication import GateCheck, GateCheckName, ReleaseBaseline
from aml_evaluation.aggregate import results_fingerprint
from aml_runtime.documents import code_hashes_of, mixed_code

CHECK_NAMES: tuple[GateCheckName, ...] = get_args(GateCheckName)
NO_BASELINE = "no release baseline configured"
# The stages whose items are documents, and which planned total each one is measured against.
STAGE_TOTALS: dict[str, str] = {
    "add": "add",
    "search": "questions",
    "answer": "questions",
    "score": "questions",
}


class _Facts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StageCounts(_Facts):
    done: int = 0
    failed: int = 0


class JobFacts(_Facts):
    """What the gate looks at, read from the job document and its stage documents."""

    job_id: str
    mode: str | None = None
    state: str | None = None
    failure: str | None = Field(default=None, description="Why a failed job failed.")
    version_id: str | None = None
    track: str | None = None
    answer_model: str | None = None
    spec_hash: str | None = None
    code_hash: str | None = None
    code_hashes: list[str] = Field(
        default_factory=list,
        description="Every build that processed the job's items (none recorded: an older job).",
    )
    dataset_bundle_hash: str | None = None
    totals: dict[str, int] | None = Field(
        default=None, description="Planned items: `add` chunks and `questions`."
    )
    stages: dict[str, StageCounts] = Field(default_factory=dict)
    errors: int = Field(default=0, description="Entries in the job's error summary.")
    platform_failures: int = Field(
        default=0, description="Items of the completed job the platform itself failed."
    )
    platform_failure_reason: str | None = None
    question_counts: dict[str, int] | None = Field(
        default=None, description="Questions per dataset in the results; None: no results."
    )
    results_fingerprint: str | None = None


class PublishedFacts(_Facts):
    """A leaderboard submission record already published (disqualified ones included)."""

    entry_id: str
    job_id: str | None = None
    version_id: str | None = None
    track: str | None = None
    results_fingerprint: str | None = None
    disqualified: bool = False


def _question_counts_of(datasets: Mapping[str, Any]) -> dict[str, int]:
    """Questions per dataset of a stored `JobResults` dump's datasets: the sum over all its
    categories, the ones excluded from the dataset's overall included."""
    counts: dict[str, int] = {}
    for dataset_id, dataset in datasets.items():
        categories = dataset.get("categories") or {}
        counts[dataset_id] = sum(int(c.get("questions", 0)) for c in categories.values())
    return counts


def job_facts(job: Mapping[str, Any], stages: Mapping[str, StageCounts], errors: int) -> JobFacts:
    """The gate's view of a stored job document (as the gateway and scheduler write it)."""
    results = job.get("results")
    stored = results.get("datasets") if isinstance(results, Mapping) else None
    datasets: Mapping[str, Any] | None = stored if isinstance(stored, Mapping) else None
    evaluation_spec = job.get("spec")
    return JobFacts(
        job_id=job["_id"],
        mode=job.get("mode"),
        state=job.get("state"),
        failure=job.get("failure"),
        version_id=job.get("version_id"),
        track=job.get("track"),
        answer_model=(
            evaluation_spec.get("answer_model") if isinstance(evaluation_spec, Mapping) else None
        ),
        spec_hash=job.get("spec_hash"),
        code_hash=job.get("code_hash"),
        code_hashes=code_hashes_of(job),
        dataset_bundle_hash=job.get("dataset_bundle_hash"),
        totals=job.get("totals"),
        stages=dict(stages),
        errors=errors,
        platform_failures=job.get("platform_failures") or 0,
        platform_failure_reason=job.get("platform_failure_reason"),
        question_counts=None if datasets is None else _question_counts_of(datasets),
        results_fingerprint=None if datasets is None else results_fingerprint(datasets),
    )


def run_gate(
    job: JobFacts, baseline: ReleaseBaseline | None, published: Sequence[PublishedFacts]
) -> list[GateCheck]:
    """Every check of the gate, in `GateCheckName` order; publishable iff all passed."""
    others = [entry for entry in published if entry.job_id != job.job_id]
    return [
        _mode_full(job),
        _all_items_succeeded(job),
        _equal("answer_model", "answer model", job.answer_model, baseline),
        _equal("spec_hash", "evaluation spec hash", job.spec_hash, baseline),
        _one_build(job) or _equal("code_hash", "pipeline code hash", job.code_hash, baseline),
        _equal("dataset_bundle_hash", "dataset bundle hash", job.dataset_bundle_hash, baseline),
        _question_counts(job, baseline),
        _not_duplicate(job, others),
    ]


def gate_passed(checks: Sequence[GateCheck]) -> bool:
    return bool(checks) and all(check.passed for check in checks)


def _check(name: GateCheckName, passed: bool, reason: str) -> GateCheck:
    return GateCheck(name=name, passed=passed, reason=reason)


def _mode_full(job: JobFacts) -> GateCheck:
    if job.mode is None:
        return _check("mode_full", False, "missing: the job records no mode")
    if job.mode != "full":
        return _check(
            "mode_full", False, f"mode is {job.mode!r}, not 'full': only full runs are published"
        )
    return _check("mode_full", True, "mode is 'full'")


def _all_items_succeeded(job: JobFacts) -> GateCheck:
    problems: list[str] = []
    if job.platform_failures:
        reason = job.platform_failure_reason or (
            f"{job.platform_failures} items failed by the platform (platform_error)"
        )
        problems.append(
            f"{reason}: the platform's failure, not the participant's; the run is not charged "
            "to the team's quota"
        )
    if job.state != "completed":
        state = "missing" if job.state is None else repr(job.state)
        because = f" ({job.failure})" if job.failure else ""
        problems.append(f"job state is {state}, not 'completed'{because}")
    tallies: list[str] = []
    if job.totals is None:
        problems.append("missing: the job records no planned totals")
    else:
        for stage, total_key in STAGE_TOTALS.items():
            total = job.totals.get(total_key)
            counts = job.stages.get(stage, StageCounts())
            if total is None:
                problems.append(f"missing: no planned total for {stage}")
                continue
            tallies.append(f"{stage} {counts.done}/{total}")
            if counts.failed or counts.done != total:
                problems.append(f"{stage}: {counts.done} of {total} done, {counts.failed} failed")
    if job.errors:
        problems.append(f"{job.errors} entries in the error summary")
    if problems:
        return _check("all_items_succeeded", False, "; ".join(problems))
    return _check(
        "all_items_succeeded",
        True,
        f"job completed; done: {', '.join(tallies)}; no failed item, error summary empty",
    )


def _equal(
    name: GateCheckName, label: str, value: str | None, baseline: ReleaseBaseline | None
) -> GateCheck:
    if baseline is None:
        return _check(name, False, NO_BASELINE)
    expected = getattr(baseline, name)
    if value is None or value == "":
        return _check(name, False, f"missing: the job records no {label} (baseline {expected!r})")
    if value != expected:
        return _check(name, False, f"{label} {value!r} differs from the baseline {expected!r}")
    return _check(name, True, f"{label} {value!r} equals the baseline")


def _one_build(job: JobFacts) -> GateCheck | None:
    reason = mixed_code(job.code_hash, job.code_hashes)
    return None if reason is None else _check("code_hash", False, reason)


def _question_counts(job: JobFacts, baseline: ReleaseBaseline | None) -> GateCheck:
    if baseline is None:
        return _check("question_counts", False, NO_BASELINE)
    expected = baseline.question_counts
    counts = job.question_counts
    if counts is None:
        return _check(
            "question_counts",
            False,
            f"missing: the job has no results to count (baseline {_counts(expected)})",
        )
    problems = []
    for dataset_id in sorted(set(expected) | set(counts)):
        if dataset_id not in counts:
            problems.append(f"{dataset_id}: not in the results (baseline {expected[dataset_id]})")
        elif dataset_id not in expected:
            problems.append(f"{dataset_id}: {counts[dataset_id]}, not in the baseline")
        elif counts[dataset_id] != expected[dataset_id]:
            problems.append(
                f"{dataset_id}: {counts[dataset_id]} questions, baseline {expected[dataset_id]}"
            )
    if problems:
        return _check("question_counts", False, "; ".join(problems))
    return _check("question_counts", True, f"{_counts(counts)} equal the baseline")


def _counts(counts: Mapping[str, int]) -> str:
    if not counts:
        return "no datasets"
    return ", ".join(f"{dataset_id} {n}" for dataset_id, n in sorted(counts.items()))


def _not_duplicate(job: JobFacts, published: Sequence[PublishedFacts]) -> GateCheck:
    missing = [
        name
        for name, value in (
            ("version_id", job.version_id),
            ("track", job.track),
            ("results fingerprint (no results)", job.results_fingerprint),
        )
        if value is None
    ]
    if missing:
        return _check("not_duplicate", False, f"missing: {', '.join(missing)}")
    problems = []
    for entry in published:
        same_run = entry.version_id == job.version_id and entry.track == job.track
        if same_run and not entry.disqualified:
            problems.append(
                f"version {job.version_id} on track {job.track} is already published "
                f"(entry {entry.entry_id})"
            )
        if entry.results_fingerprint == job.results_fingerprint:
            state = "disqualified " if entry.disqualified else ""
            problems.append(
                f"results fingerprint {_short(job.results_fingerprint)} equals that of "
                f"{state}published entry {entry.entry_id}"
            )
    if problems:
        return _check("not_duplicate", False, "; ".join(problems))
    return _check(
        "not_duplicate",
        True,
        f"no published entry for version {job.version_id} on track {job.track}, and results "
        f"fingerprint {_short(job.results_fingerprint)} matches none of {len(published)} "
        "published entries",
    )


def _short(fingerprint: str | None) -> str:
    return (fingerprint or "")[:12]
