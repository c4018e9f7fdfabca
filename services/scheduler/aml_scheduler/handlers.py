"""The scheduler's reactions. Each one is safe to repeat: `release` and `complete_if_done` look at
the stored state and publish or write only what is missing, with de-duplicated publishes and
guarded updates, so a redelivered event or the periodic reconciliation changes nothing twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from aml_contract.api.results import JobResults
from aml_contract.messages import (
    AddDone,
    JobSubmitted,
    QuestionDone,
    QuestionFacts,
    QuestionWork,
    SearchDone,
)
from aml_evaluation.aggregate import QuestionOutcome, aggregate, headline_values
from aml_evaluation.chunker import chunker_version
from aml_evaluation.datasets import Dataset
from aml_evaluation.registry import DatasetFileError, bundle_hash, open_dataset_stream
from aml_evaluation.spec import EvaluationSpec
from aml_pipeline.capacity import Capacity
from aml_pipeline.chains import (
    active_window,
    bounded_put,
    first_not_done,
    release_add,
    start_order,
)
from aml_pipeline.jobs import (
    fail_job,
    load_endpoint,
    publish_finished,
    record_error,
    run_overdue,
    version_capacity,
)
from aml_pipeline.outages import OutageExpired, Outages, close_abandoned
from aml_pipeline.participants import ParticipantClient
from aml_pipeline.progress import (
    counters_exact,
    questions_final,
    repair_counters,
    repair_due,
    stage_counts,
)
from aml_pipeline.retention import purge_expired
from aml_runtime.broker import Bus, publish_work
from aml_runtime.clock import now
from aml_runtime.db import Document, read_time
from aml_runtime.documents import (
    ACTIVE_JOB_STATES,
    FailureKind,
    JobDocument,
    ScoreDocument,
    StageRecord,
)
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores
from aml_runtime.stores.leaderboard import HeadlineOutcomes
from aml_runtime.telemetry import item_trace
from aml_scheduler.job_efficiency import EfficiencyReading, job_efficiency
from aml_scheduler.planning import (
    PART_TURNS,
    WRITTEN_PAIRS_HELD,
    PlannedPart,
    WrittenOwners,
    bundle_fingerprint,
    parts_of,
    plan_part,
)
from aml_scheduler.settings import SchedulerSettings
from aml_scheduler.watchdog import diagnose, stall_limit_seconds

log = structlog.get_logger()
# Released users remembered at most (a LoCoMo-10 job has ten; many jobs run at once).
_RELEASED_KEPT = 100_000
# How long a version's declared concurrency is used before it is read again.
_CAPACITY_CACHE_SECONDS = 5.0
# Written-text documents stored (and merged) per write.
_WRITTEN_AT_ONCE = 5_000


@dataclass
class ScheduleJobs:
    settings: SchedulerSettings
    # The jobs and their error summaries (`jobs`); what it plans for each job: Adds, questions,
    # release markers, written texts, specs (`plans`); the questions' search, answer and score
    # records (`records`); the versions' declared capacity and run limits (`accounts`).
    stores: Stores
    bus: Bus
    client: ParticipantClient
    box: SecretBox
    # What this deployment evaluates with, recorded on every job it plans.
    evaluation_spec: EvaluationSpec
    code_hash: str
    # The stall watchdog's clock (replaced in tests).
    clock: Callable[[], datetime] = field(default=now)
    # Participants' outages (R-4.13): one unreachable when its job starts is waited for, as
    # during the job (None: such a job fails at once).
    outages: Outages | None = None
    # What coding-track jobs are evaluated with: `evaluation_spec` plus the coding agent and
    # the verify rules (R-2.5), so the other tracks' spec never depends on the coding settings
    # (None: coding jobs record `evaluation_spec`, as before the coding track).
    coding_spec: EvaluationSpec | None = None
    # Users whose questions this process has seen released (their marker is written, and never
    # removed while the job lives): the reconciliation's re-drive skips them without a read.
    _released: set[tuple[str, str]] = field(default_factory=set, init=False)
    # Per writing user, the seq of the Add this process last released (all before it are
    # confirmed): where its next Add is looked for, and what counts it as writing.
    _cursors: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    # Per version, its declared capacity and when it was read.
    _capacities: dict[str, tuple[Capacity, float]] = field(default_factory=dict, init=False)
    # Jobs this process is planning right now: the submission event and the reconciliation's
    # re-drive often meet on a new job, and the second must not plan it again meanwhile (the
    # plan is idempotent, but it costs a second or so of CPU on a LoCoMo-sized dataset).
    _planning: set[str] = field(default_factory=set, init=False)
    # How much of a job a plan holds at once (`aml_scheduler.planning`; tests make them small).
    part_turns: int = PART_TURNS
    written_pairs_held: int = WRITTEN_PAIRS_HELD

    # -- events -----------------------------------------------------------------------------

    async def on_job_submitted(self, event: JobSubmitted) -> None:
        job = await self.stores.jobs.document(event.job_id)
        if job is None or job["state"] not in ACTIVE_JOB_STATES:
            return
        if not job.get("planned"):
            if event.job_id in self._planning:
                return  # its planner releases it when done
            self._planning.add(event.job_id)
            try:
                if not await self._start(job):
                    return
            finally:
                self._planning.discard(event.job_id)
        await self.release(event.job_id)

    async def _start(self, job: Document) -> bool:
        """Plan a submitted job once its participant is healthy; False if the job failed or
        still waits for its participant."""
        version_id = str(job["version_id"])
        if not await self._participant_healthy(job):
            await self._unhealthy_at_start(job["_id"], version_id)
            return False
        if self.outages is not None:
            await self.outages.succeeded(version_id)
        try:
            await self._plan(job)
        except DatasetFileError as exc:
            # Not transient: retrying (every event, every reconciliation) would leave the job
            # queued for good. The platform's failure, so the team's quota is not charged.
            reason = f"dataset files missing or altered: {exc}"
            await record_error(
                self.stores, job["_id"], "add", FailureKind.DATASET_MISSING, None, reason
            )
            await fail_job(
                self.stores, self.bus, job["_id"], "add", FailureKind.PLATFORM_ERROR, reason
            )
            log.error("job.dataset_missing", job_id=job["_id"], reason=str(exc))
            return False
        return True

    async def _unhealthy_at_start(self, job_id: str, version_id: str) -> None:
        """A participant whose Health does not answer when its job starts is down as it would be
        mid-job (a restart, a blip): its lane is paused and the job stays queued, looked at again
        by every reconciliation, until Health answers or the outage outlives its window."""
        failure = "the participant's Health endpoint did not answer 2xx before the start"
        kind = FailureKind.PARTICIPANT_OUTAGE
        reason = failure
        if self.outages is not None:
            moment = self.clock().timestamp()
            window = self.settings.participant_outage_seconds
            try:
                pause = await self.outages.declare(
                    version_id, "participant", moment, failure, window
                )
            except OutageExpired as expired:
                reason = f"{failure}: {expired.reason}"
            else:
                if not pause.expired(moment):
                    log.info("job.waits_for_participant", job_id=job_id, since=pause.since)
                    return
                reason = f"{failure}: {await self.outages.expire(pause, moment)}"
        await record_error(self.stores, job_id, "add", kind, None, reason)
        await fail_job(self.stores, self.bus, job_id, "add", kind, reason)

    async def on_add_done(self, event: AddDone) -> None:
        if event.outcome == "done" and event.user_id is not None and event.seq is not None:
            if event.next_released:
                # The adder released the user's next Add itself (`aml_pipeline.chains`).
                bounded_put(self._cursors, (event.job_id, event.user_id), event.seq + 1,
                            _RELEASED_KEPT)  # fmt: skip
                return
            await self.release(event.job_id, event.user_id, event.seq)
            return
        # Not the body (an Add's whole session): only what the release needs.
        chunk = await self.stores.plans.announced_chunk(event.request_id)
        if chunk is None:
            return
        if event.outcome == "failed":
            reason = chunk.get("failure") or "an Add request failed"
            kind = FailureKind(chunk.get("failure_kind") or FailureKind.PLATFORM_ERROR)
            await fail_job(
                self.stores, self.bus, event.job_id, "add", kind, f"{event.request_id}: {reason}"
            )
            return
        await self.release(event.job_id, str(chunk["user_id"]), int(chunk["seq"]))

    async def on_question_done(self, event: QuestionDone) -> None:
        await self.complete_if_done(event.job_id)

    async def on_search_done(self, event: SearchDone) -> None:
        """A search that held back its user's next Add is final: that Add may go out."""
        await self.release(event.job_id, event.user_id)

    async def purge_expired(self) -> None:
        """Retention (R-7.5), run with the reconciliation."""
        retention = timedelta(days=self.settings.retention_days)
        for job_id in await purge_expired(self.stores, now(), retention):
            log.info("job.retention_purged", job_id=job_id)

    async def reconcile(self) -> None:
        """Re-drive every unfinished job from its stored state (after a crash of anything).

        A running job's progress counters are repaired (`aml_pipeline.progress`) only once they
        have been still for a few intervals: a lost increment shows as a job that stops moving,
        and a moving job is not re-read every interval."""
        # A pause whose waiting calls are gone (their workers died) lifts after its window.
        for key in await close_abandoned(self.stores, self.clock().timestamp()):
            log.warning("outage.abandoned_closed", key=key)
        stale_after = timedelta(seconds=3 * self.settings.reconcile_interval_seconds)
        async for job in self.stores.jobs.active_jobs():
            try:
                version = await self.stores.accounts.limits_of(job["version_id"])
                if await self._stop_if_overdue(job, version or {}):
                    continue
                if await self._fail_if_stalled(job, version or {"_id": job["version_id"]}):
                    continue
                await self.on_job_submitted(JobSubmitted(job_id=job["_id"]))
                if job.get("planned") and repair_due(job, now(), stale_after):
                    await repair_counters(self.stores, job["_id"])
                await self.complete_if_done(job["_id"])
            except Exception:
                log.exception("reconcile.failed", job_id=job["_id"])

    # -- steps ------------------------------------------------------------------------------

    async def _stop_if_overdue(self, job: Document, version: Document) -> bool:
        """The participant declared how long a run may keep calling it (R-3.1)."""
        reason = run_overdue(version, read_time(job.get("started_at")), now())
        if reason is None:
            return False
        kind = FailureKind.RUN_LIMIT_REACHED
        await record_error(self.stores, job["_id"], "add", kind, None, reason)
        await fail_job(self.stores, self.bus, job["_id"], "add", kind, reason)
        return True

    async def _fail_if_stalled(self, job: Document, version: Document) -> bool:
        """A job that nothing has moved for its stall limit (a running one) or that could not be
        planned for as long (a queued one) is failed, naming the stage and whose failure it is
        (`aml_scheduler.watchdog`). A lost increment is not mistaken for a stall: the repair
        below recounts a job still for three intervals, long before."""
        limit = stall_limit_seconds(
            self.settings.job_stall_seconds, self.settings.participant_timeout_seconds, version
        )
        stall = await diagnose(self.stores, job, self.clock(), limit)
        if stall is None:
            return False
        log.warning("job.stalled", job_id=job["_id"], stage=stall.stage, cause=stall.cause,
                    reason=stall.reason)  # fmt: skip
        stalled = FailureKind.JOB_STALLED
        await record_error(self.stores, job["_id"], stall.stage, stalled, None, stall.reason)
        await fail_job(self.stores, self.bus, job["_id"], stall.stage, stall.kind, stall.reason)
        return True

    async def _participant_healthy(self, job: Document) -> bool:
        endpoint = await load_endpoint(self.stores, self.box, job["version_id"])
        return await self.client.health(endpoint)

    def spec_of(self, job: Document) -> EvaluationSpec:
        """The evaluation spec a job is planned and recorded with: its track's."""
        if job.get("track") == "coding" and self.coding_spec is not None:
            return self.coding_spec
        return self.evaluation_spec

    async def _plan(self, job: Document) -> None:
        job_id = job["_id"]
        totals = {"add": 0, "questions": 0}
        # Adds and questions per user: what orders the job's users (`aml_pipeline.chains`).
        adds: Counter[str] = Counter()
        asked: Counter[str] = Counter()
        written = WrittenOwners()
        excluded: dict[str, list[str]] = {}
        bundles: dict[str, str] = {}
        f1_variants: dict[str, str] = {}
        # The chunk rule of each dataset's Adds (`chunk-v1`, or `chunk-mm-v1` for images).
        chunkers: dict[str, str] = {}
        top_k = self.evaluation_spec.top_k
        for dataset_id in job["datasets"]:
            # Shipped or operator-registered (its manifest under the datasets root), its files
            # verified, then read a piece at a time where the format allows.
            manifest, stream = open_dataset_stream(dataset_id, self.settings.datasets_root)
            excluded[dataset_id] = [manifest.categories[c] for c in manifest.excluded_from_overall]
            bundles[dataset_id] = bundle_hash(manifest)
            f1_variants[dataset_id] = stream.dataset.f1_variant
            chunkers[dataset_id] = chunker_version(stream.dataset)
            # Part by part: a large job's dataset and Add bodies are never all in memory at once.
            # Each part is planned in a thread while the one before it is stored, so that the
            # planner's work and the database's overlap (at 50,000 Adds they were 20 and 39 s
            # of CPU one after the other), and this loop serves every other job's events
            # meanwhile. At most two parts are held: one planned, one being stored.
            parts = parts_of(stream.pieces(), self.part_turns)
            storing: asyncio.Future[None] | None = None
            try:
                while (
                    planned := await asyncio.to_thread(_plan_next, parts, job_id, top_k, written)
                ) is not None:
                    if storing is not None:
                        await storing
                    if written.pairs >= self.written_pairs_held:
                        await self.stores.plans.store_written(
                            written.take(job_id, _WRITTEN_AT_ONCE)
                        )
                    storing = asyncio.ensure_future(self._store_part(planned))
                    adds.update(chunk.user_id for chunk in planned.chunks)
                    asked.update(question.user_id for question in planned.questions)
                    totals["add"] += len(planned.chunks)
                    totals["questions"] += len(planned.questions)
                if storing is not None:
                    await storing
            finally:
                await _settled(storing)
            if stream.parsed_whole is not None:
                log.warning("dataset.parsed_whole", job_id=job_id, dataset_id=dataset_id,
                            reason=stream.parsed_whole)  # fmt: skip
        await self.stores.plans.store_written(written.take(job_id, _WRITTEN_AT_ONCE))
        # The whole evaluation spec is stored once per content hash (`specs`); the job records
        # its hash and summary (`spec_hash`, `spec`).
        spec = self.spec_of(job)
        spec_hash = spec.content_hash
        window = active_window(await self._capacity(str(job.get("version_id", ""))))
        await self.stores.plans.store_spec(spec_hash, spec.model_dump(mode="json"))
        await self.stores.jobs.start(
            job_id,
            started_at=now(),
            top_k=spec.top_k,
            spec=spec.summary(),
            spec_hash=spec_hash,
            code_hash=self.code_hash,
            dataset_bundles=bundles,
            dataset_bundle_hash=bundle_fingerprint(bundles),
            # In the order their Adds start (`aml_pipeline.chains`).
            users=start_order(adds, asked, window),
            excluded_categories=excluded,
            f1_variants=f1_variants,
            chunkers=chunkers,
            totals=totals,
        )
        log.info("job.planned", job_id=job_id, chunks=totals["add"], questions=totals["questions"])

    async def _store_part(self, planned: PlannedPart) -> None:
        await asyncio.gather(
            self.stores.plans.insert_chunks(planned.chunks),
            self.stores.plans.insert_questions(planned.questions),
        )

    async def release(
        self, job_id: str, user_id: str | None = None, confirmed_seq: int | None = None
    ) -> None:
        """Publish each writing user's next Add not yet confirmed, or, once all of a user's are,
        its questions; and start users up to the job's window (`aml_pipeline.chains`).

        With `user_id`, only that user moves on (`confirmed_seq`: its Add just confirmed), and
        the window is filled only when it has finished. Only one Add per user is ever
        outstanding because the next is published only after the previous one is confirmed. A
        streaming dataset's Add that questions are asked right before (`searched_before`) is
        published only once their searches are final: they are released first
        (`_held_searches_final`)."""
        version_id = await self.stores.jobs.running_version(job_id)
        if version_id is None:
            return
        if user_id is not None:
            if (job_id, user_id) in self._released:
                return
            if not await self._advance(job_id, version_id, user_id, confirmed_seq):
                return
        await self._fill_window(job_id, version_id, user_id is None)

    async def _fill_window(self, job_id: str, version_id: str, redrive: bool) -> None:
        """Keep the job's window of writing users full, in the job's order. `redrive`: publish
        every writing user's next Add again (de-duplicated by the broker), for the
        reconciliation; otherwise a user this process already released an Add of counts as
        writing without a read."""
        # Read only here, as a user finishes: a job may have thousands of users.
        users = await self.stores.jobs.users_of(job_id)
        window = active_window(await self._capacity(version_id))
        writing = 0
        for user in users:
            if writing >= window:
                return
            key = (job_id, user)
            if key in self._released:
                continue
            if key in self._cursors and not redrive:
                writing += 1
                continue
            if key not in self._cursors and await self._questions_released(job_id, user):
                continue
            if not await self._advance(job_id, version_id, user, None):
                writing += 1

    async def _advance(
        self, job_id: str, version_id: str, user: str, confirmed_seq: int | None
    ) -> bool:
        """Publish the user's first Add not confirmed yet; True when there is none (its
        questions are then released)."""
        key = (job_id, user)
        start = confirmed_seq + 1 if confirmed_seq is not None else self._cursors.get(key, 1)

        async def lookup(seq: int) -> Document | None:
            return await self.stores.plans.chain_chunk(user, seq)

        seq, pending = await first_not_done(lookup, start)
        if pending is None:
            await self._release_questions(job_id, version_id, user)
            self._cursors.pop(key, None)
            return True
        bounded_put(self._cursors, key, seq, _RELEASED_KEPT)
        if pending["state"] != "pending":
            return False  # failed: its job fails (on_add_done)
        if pending.get("searched_before") and not await self._held_searches_final(
            job_id, version_id, user, pending
        ):
            # The Add goes out when the last of those searches is announced final
            # (on_search_done) or, should that be lost, at the reconciliation's re-drive.
            return False
        await release_add(self.bus, job_id, version_id, user, str(pending["_id"]))
        return False

    async def _capacity(self, version_id: str) -> Capacity:
        """The version's declared capacity, re-read at most every few seconds."""
        cached = self._capacities.get(version_id)
        moment = time.monotonic()
        if cached is not None and moment - cached[1] < _CAPACITY_CACHE_SECONDS:
            return cached[0]
        version = await self.stores.accounts.capacity_of(version_id)
        declared = version_capacity(version or {"_id": version_id})
        bounded_put(self._capacities, version_id, (declared, moment), _RELEASED_KEPT)
        return declared

    async def _questions_released(self, job_id: str, user_id: str) -> bool:
        if not await self.stores.plans.released(f"{job_id}/{user_id}"):
            return False
        self._remember_released(job_id, user_id)
        return True

    async def _release_questions(self, job_id: str, version_id: str, user_id: str) -> None:
        marker = f"{job_id}/{user_id}"
        if await self._questions_released(job_id, user_id):
            return
        # A question that held an Add back was released before that Add, at its point.
        await self._publish_questions(
            version_id, self.stores.plans.user_questions(user_id), held=False
        )
        # Written only after every publish went out: a crash before it re-publishes (harmless).
        await self.stores.plans.mark_released(marker, job_id)
        self._remember_released(job_id, user_id)

    async def _held_searches_final(
        self, job_id: str, version_id: str, user_id: str, chunk: Document
    ) -> bool:
        """Release the questions asked right before this Add (once, behind a marker per user
        and point) and tell whether all their searches are final (done or failed): a search
        document is written once, terminal."""
        held = [str(item_id) for item_id in chunk["searched_before"]]
        marker = f"{job_id}/{user_id}@{int(chunk['seq']) - 1}"
        if not await self.stores.plans.released(marker):
            await self._publish_questions(
                version_id, self.stores.plans.questions_among(held), held=True
            )
            await self.stores.plans.mark_released(marker, job_id, held=len(held))
        return await self.stores.records.searches_final(held) >= len(held)

    async def _publish_questions(
        self, version_id: str, questions: AsyncIterator[Document], held: bool
    ) -> None:
        """Publish the search work of the `questions` that hold an Add back (`held`) or of
        those that do not."""
        async for question in questions:
            if (question.get("holds_add") is not None) != held:
                continue
            job_id, user_id = question["job_id"], question["user_id"]
            work = QuestionWork(
                job_id=job_id,
                version_id=version_id,
                item_id=question["_id"],
                facts=QuestionFacts.of(question),
                search_body=body.decode() if (body := question.get("search_body")) else None,
                holds_add=held,
            )
            ids = {"job_id": job_id, "item_id": question["_id"], "user_id": user_id}
            with item_trace("aml.release", question["_id"], stage="search", **ids):
                await publish_work(self.bus, "search", work, question["_id"])

    def _remember_released(self, job_id: str, user_id: str) -> None:
        if len(self._released) >= _RELEASED_KEPT:
            # Forgetting costs a read at the next re-drive, nothing else.
            self._released.clear()
        self._released.add((job_id, user_id))

    async def complete_if_done(self, job_id: str) -> None:
        job = await self.stores.jobs.get(job_id)
        if job is None or job.state != "running" or not job.planned or job.totals is None:
            return
        # The counters as stored, read by their paths (`aml_pipeline.progress`).
        counted: Document = {"progress": job.progress}
        # O(1): the job's own counter of questions that reached their terminal state (scored, or
        # failed in search or answer). It can lag after a crash (then the reconciliation's repair
        # catches up), never lead, so a job is never completed with a question still open.
        if questions_final(counted) < job.totals.questions:
            return
        # Once per job, like the aggregation below: make the stored counters exact (a lost
        # increment of an Add or an error entry does not hold completion back but would show
        # in the status and fail the publication gate). Usually they are, once the other
        # stages' last batches have left their window, which is seen from the job document;
        # only otherwise are they recounted, which reads every stage document of the job (1.8 s
        # at LoCoMo-10, a search document holding its candidates).
        if not await counters_exact(self.stores, job_id):
            await repair_counters(self.stores, job_id, at_completion=True)
        reading = EfficiencyReading(job.top_k)
        outcomes = await self.outcomes(job_id, reading)
        # The intervals' bootstrap takes about half a second at 10,000 questions: off the loop
        # that serves every other job's events.
        results = await asyncio.to_thread(
            aggregate, job_id, "completed", outcomes, job.excluded_categories, job.f1_variants
        )
        capacity = await self._capacity(job.version_id)
        results.efficiency = await job_efficiency(
            self.stores, job, reading, capacity, self.settings.deployment_label
        )
        await keep_headline_outcomes(self.stores, job, outcomes, results)
        # A failed Add fails its job at once (`on_add_done`), so a completed job normally has
        # none (its counter says so without reading the job's chunks); counted all the same,
        # so that no platform failure goes unnoticed.
        adds = 0
        if stage_counts(counted, "add")[1]:
            adds = await self.stores.plans.platform_failed_chunks(job_id)
        questions = platform_failed(outcomes)
        reason = platform_failure_reason(questions, adds)
        completed = await self.stores.jobs.complete(
            job_id,
            finished_at=now(),
            results=results.model_dump(mode="json"),
            platform_failures=adds + questions,
            platform_failure_reason=reason,
            code_hash=self.code_hash,
        )
        if completed:
            log.info("job.completed", job_id=job_id, overall=results.overall.judge_accuracy,
                     platform_failures=adds + questions)  # fmt: skip
            if reason is not None:
                # The platform's own fault (typically the answer or judge model down): the run
                # is void for the team, and the operator should know.
                log.warning("job.completed_with_platform_failures", job_id=job_id, reason=reason)
            await publish_finished(self.bus, job_id, "completed")

    async def outcomes(
        self, job_id: str, reading: EfficiencyReading | None = None
    ) -> list[QuestionOutcome]:
        """Each question's final record: its score, or the stage where it failed and why. Each
        question and its record are also shown to `reading` (the efficiency figures)."""
        final = await self.stores.records.final_records(job_id)
        outcomes = []
        async for question in self.stores.plans.questions_of(job_id):
            record = final.get(question["_id"])
            outcomes.append(question_outcome(question, record))
            if reading is not None:
                reading.question(question, record)
        return outcomes


async def keep_headline_outcomes(
    stores: Stores, job: JobDocument, outcomes: list[QuestionOutcome], results: JobResults
) -> None:
    """A full run's per-question values in its Overall headline, which the board compares with
    the entry ranked above it (`aml_gateway.ties`). Kept before the job completes: a completion
    repeated after a crash writes the same document, and the outcomes are final by then. A
    smoke run is never published, so it keeps none."""
    if job.mode != "full":
        return
    headline = results.overall.headline
    values = headline_values(outcomes, job.excluded_categories, headline)
    await stores.leaderboard.keep_headline_outcomes(
        HeadlineOutcomes(job_id=job.id, headline=headline, values=values)
    )


def _plan_next(
    parts: Iterator[Dataset], job_id: str, top_k: int, written: WrittenOwners
) -> PlannedPart | None:
    """The next part planned (`plan_part`), or None when there is none; run in a thread."""
    part = next(parts, None)
    return None if part is None else plan_part(job_id, part, top_k, written)


async def _settled(storing: asyncio.Future[None] | None) -> None:
    """Wait for a part still being stored when planning stopped early (its failure is not the
    one to report: the planner's is)."""
    if storing is None:
        return
    if not storing.done():
        await asyncio.wait({storing})
    if not storing.cancelled():
        storing.exception()  # retrieved, so that it is not reported as never retrieved


def platform_failed(outcomes: Iterable[QuestionOutcome]) -> int:
    """How many questions ended failed by the platform itself (`platform_error`): a failure
    of ours (the answer or judge model down, a lost record), never held against the team."""
    return sum(1 for o in outcomes if not o.scored and o.failure_kind == FailureKind.PLATFORM_ERROR)


def platform_failure_reason(questions: int, adds: int = 0) -> str | None:
    """What a completed job records for the items the platform failed, in words (shown by the
    status, the job page, `aml team` and the publication gate); None when there are none."""
    parts = [
        f"{count} {noun}{'s' if count != 1 else ''}"
        for count, noun in ((adds, "Add request"), (questions, "question"))
        if count
    ]
    if not parts:
        return None
    return f"{' and '.join(parts)} failed by the platform (platform_error)"


def question_outcome(question: Document, record: StageRecord | None) -> QuestionOutcome:
    """A question's outcome from its final stage record: scored when it is a `done` score
    document (whatever the verdict); otherwise failed where its record says, or, with no
    record, by the platform."""
    score = record if isinstance(record, ScoreDocument) and record.state == "done" else None
    if score is None:
        kind = record.failure_kind if record is not None else None
        return QuestionOutcome(
            question_id=question.get("question_id"),
            point_index=question.get("point_index"),
            dataset_id=question["dataset_id"],
            category_name=question["category_name"],
            scored=False,
            failure_kind=kind or FailureKind.PLATFORM_ERROR,
            multiple_choice=isinstance(record, ScoreDocument) and record.multiple_choice,
            task_type=question.get("task_type"),
        )
    return QuestionOutcome(
        question_id=question.get("question_id"),
        point_index=question.get("point_index"),
        dataset_id=question["dataset_id"],
        category_name=question["category_name"],
        scored=True,
        judge_label=score.judge_label,
        judge_labels=score.judge_labels,
        f1=score.f1,
        bleu1=score.bleu1,
        multiple_choice=score.multiple_choice,
        choice_correct=score.choice_correct,
        # A coding attempt's verdict: resolved or not, never a failure.
        resolved=score.resolved,
        task_type=question.get("task_type"),
        answer_type=score.answer_type,
        qs=score.qs,
        evidence_ranks=score.evidence_ranks,
    )
