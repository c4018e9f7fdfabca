"""Search one question with the body planned for it and keep the candidates exactly as the
participant returned them, in its order (they are what the answer model will see), with the
ranks at which they hold the question's evidence (aml_evaluation.evidence)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from aml_contract.messages import QuestionWork
from aml_contract.participant import SearchItem
from aml_evaluation.evidence import question_evidence
from aml_evaluation.isolation import candidate_digests, content_text, find_leaks
from aml_pipeline.audit import VALID, CallRecorder
from aml_pipeline.jobs import Endpoints, record_error
from aml_pipeline.participants import CallFailed, ParticipantClient
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores

# The items as stored: one dump of the list (a dump per item cost three times as much).
_SEARCH_ITEMS: TypeAdapter[list[SearchItem]] = TypeAdapter(list[SearchItem])

# Written texts' owners one searcher remembers (the most recently used; each entry is a digest
# and a user or two). A job's map is never read whole: a 50,000-Add job writes some 200,000 texts,
# and every searcher holding them all (and the database reading them out) froze a job's Adds.
_OWNERS_KEPT = 50_000


@dataclass
class WrittenTexts:
    """Which users each text of a job was written for: planned with the job (before any of its
    questions is released) and never changed. A search looks up only its candidates' texts, by
    id (`<job_id>/<digest>`), and remembers the answers, so a text returned again (the same
    memory found by several questions) is not read again."""

    # The job's written texts (`plans`).
    stores: Stores
    kept: int = _OWNERS_KEPT
    # (job_id, digest) -> the users it was written for; () for a text written to none.
    _owners: OrderedDict[tuple[str, str], tuple[str, ...]] = field(default_factory=OrderedDict)

    async def owners(self, job_id: str, digests: set[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        missing: list[str] = []
        for digest in digests:
            known = self._owners.get((job_id, digest))
            if known is None:
                missing.append(digest)
                continue
            self._owners.move_to_end((job_id, digest))
            if known:
                found[digest] = list(known)
        if missing:
            looked_up = await self._look_up(job_id, missing)
            for digest in missing:
                users = looked_up.get(digest)
                self._remember((job_id, digest), tuple(users or ()))
                if users:
                    found[digest] = users
        return found

    def _remember(self, key: tuple[str, str], users: tuple[str, ...]) -> None:
        self._owners[key] = users
        while len(self._owners) > self.kept:
            self._owners.popitem(last=False)

    async def _look_up(self, job_id: str, digests: list[str]) -> dict[str, list[str]]:
        return await self.stores.plans.written_owners(job_id, digests)


@dataclass
class SearchQuestion:
    stores: Stores
    client: ParticipantClient
    endpoints: Endpoints
    written: WrittenTexts

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        job = item.job or await self.stores.jobs.search_view(work.job_id)
        if job is None:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, f"job {work.job_id} is missing")
        async with CallRecorder(
            self.stores, work.job_id, "search", work.item_id, item.delivered, work.version_id
        ) as observe:
            candidates = await self.answered(work, question, job, item, observe)
        leaks = await self.leaks(work, question["user_id"], candidates)
        # Ranked here, where the candidates are in hand: the scorer need not read them back.
        evidence = question_evidence(question, candidates)
        return {
            "candidates": candidates,
            "n_candidates": len(candidates),
            "leaks": leaks,
            **({"evidence_ranks": evidence["evidence_ranks"]} if evidence else {}),
        }

    async def answered(
        self,
        work: QuestionWork,
        question: Document,
        job: Document,
        item: StageCall,
        observe: CallRecorder,
    ) -> list[Document]:
        """The candidates of a valid Search answer, its validation on the audited attempt."""
        endpoint = await self.endpoints.get(work.version_id, work.job_id)
        # The top_k the body asks for: the dataset's own where it declares one (coding).
        top_k = question.get("top_k") or job["top_k"]
        try:
            items = await self.client.search(
                endpoint, question["search_body"], top_k, observe, item.admission
            )
        except CallFailed as exc:
            if exc.kind == FailureKind.CONTRACT_ERROR:
                await observe.validated(exc.reason)
            raise FinalFailure(exc.kind, exc.reason, exc.ends_job) from None
        # Valid, so this call cannot fail the job: the next Search under the slot leaves now,
        # not after this one's audit record and isolation check.
        item.pass_turn()
        await observe.validated(VALID)
        dumped: list[Document] = _SEARCH_ITEMS.dump_python(items, mode="json", exclude_none=True)
        return dumped

    async def leaks(self, work: QuestionWork, user_id: str, candidates: list[Document]) -> int:
        """Record every candidate that is another user's text (R-4.11); the answer still uses
        what the participant returned, the violation is reported beside the score."""
        digests = candidate_digests(candidates)
        # Empty texts are no one's memory: not looked up.
        wanted = {
            digest
            for digest, candidate in zip(digests, candidates, strict=True)
            if digest is not None and content_text(candidate.get("content"))
        }
        owners = await self.written.owners(work.job_id, wanted)
        found = find_leaks(user_id, candidates, owners, digests)
        for leak in found:
            reason = (
                f"search result {leak.rank} ({leak.candidate_id}) holds text written only for "
                f"{', '.join(leak.written_for)}"
            )
            await record_error(
                self.stores, work.job_id, "search", FailureKind.ISOLATION_VIOLATION,
                f"{work.item_id}#{leak.rank}", reason,
            )  # fmt: skip
        return len(found)
