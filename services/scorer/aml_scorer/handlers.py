"""Score one answer (R-6.2): an open question by the LLM judge (N runs, majority label), token
F1 in the dataset's declared variant and BLEU-1; a multiple-choice question by the option the
answer names. A judge verdict that cannot be read is a judge failure, counted apart, never
turned into WRONG.

A question without a gold answer (`gold_answer` None: the conversation does not contain it) is
judged with the abstention prompt, correct iff the answer says the information is not there;
its F1 follows the abstention rule of every variant and it has no BLEU-1 (see
docs/evaluation.md). A question that carries a judge rule (`judge_rule`, LongMemEval's question
types) is judged with that rule's prompt instead (aml_evaluation.judging.JUDGE_RULE_PROMPTS).

A question of a dataset whose scorer is `token_f1` (Mem-Gallery's format) is scored by token F1
alone, as Mem-Gallery's own evaluation does: no judge is asked (no LLM budget spent), and the
score has no judge fields, which the aggregation counts as `unjudged` (F1 is its headline).

An ATM-Bench question (scorer `atm_qs`) is scored by its answer type as ATM-Bench scores it
(aml_evaluation.atmbench.scoring): a `number` answer by exact match, a `list_recall` answer by
Jaccard overlap, an `open_end` answer by the judge with the benchmark's own prompt (its JSON
`accuracy` verdict read into CORRECT/WRONG, N runs and the majority like every judged question).
The score's `qs` (1/0, or the Jaccard) is what its QS averages.

A question that declares evidence the platform can recognise (`evidence_markers`, planned by
aml_evaluation.evidence) also records where its Search returned each piece
(`evidence_ranks`), as the searcher ranked them over the candidates it received (read back
from the stored search only when the work does not carry them): Recall@k and Joint@k follow.

A coding task's attempt (scorer `swe_resolved`) is verified instead (R-2.5, `VerifyAttempt`): its
patch and the task's hidden tests in a fresh sandbox, the test log graded with SWE-bench's rules;
no LLM is asked. Its work comes on the scorer's verify lane, admitted under the process's own
bound on sandboxes (`coding_verify_concurrency`), never under the LLM budget."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog
from openai import AsyncOpenAI

from aml_contract.messages import QuestionWork
from aml_evaluation.atmbench.scoring import (
    ATM_JUDGE_MAX_TOKENS,
    ATM_JUDGE_PROMPT_NAME,
    ATM_QS_VERSION,
    judge_prompt_text,
    score_deterministic,
)
from aml_evaluation.evidence import evidence_record, question_evidence
from aml_evaluation.judging import (
    JudgeVerdict,
    atm_judge_label,
    judge,
    judge_prompt_for,
    load_judge_rule_prompts,
)
from aml_evaluation.prompts import Prompt, load_prompt
from aml_evaluation.scoring import (
    BLEU_VERSION,
    F1_VARIANTS,
    F1_VERSION,
    MC_VERSION,
    open_answer_scores,
    score_choice,
    scoring_method,
)
from aml_pipeline.coding_track import (
    HiddenTestsRejected,
    OpenTask,
    OpenWorkspace,
    SandboxCheck,
    open_task_files,
    score_fields,
    verify,
)
from aml_pipeline.llm import ChatReply, complete_reply
from aml_pipeline.outages import Outages
from aml_pipeline.sandbox import Sandbox, SandboxLimits, SandboxUnavailable
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores
from aml_scorer.settings import ScorerSettings

log = structlog.get_logger()


@dataclass
class VerifyAttempt:
    """Verify a coding attempt's patch (aml_pipeline.coding_track.verify) against its task's
    hidden tests. An unresolved attempt is a score like any other; the platform's faults raise:
    a sandbox that fails or a task whose files are unavailable (retried, then platform_error),
    hidden tests that do not apply to their snapshot or a task that cannot be graded, and a
    machine without bubblewrap (platform_error at once)."""

    # The task's files by dataset and task id (aml_evaluation.coding.source).
    open_task: OpenTask
    # The test command's sandbox (`coding_track.verify_limits`).
    limits: SandboxLimits
    open_workspace: OpenWorkspace = Sandbox.from_archive
    sandbox_check: SandboxCheck = field(default_factory=SandboxCheck)

    async def __call__(self, question: Document, patch: str) -> Document:
        await self.sandbox_check()
        files = await open_task_files(self.open_task, question)
        task = files.task
        try:
            verification = await asyncio.to_thread(
                verify, task, files.snapshot, patch, self.limits, self.open_workspace
            )
        except (HiddenTestsRejected, SandboxUnavailable) as fault:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, str(fault)) from None
        except ValueError as broken:
            # The task's lists or format cannot be graded (a dataset registered before a check).
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR, f"task {task.task_id} cannot be graded: {broken}"
            ) from None
        return {
            "coding_task": task.task_id,
            "task_type": task.task_type,
            **score_fields(verification),
        }


@dataclass
class ScoreAnswer:
    settings: ScorerSettings
    # The answers that did not travel with the work (`records`).
    stores: Stores
    llm: AsyncOpenAI
    prompt: Prompt
    abstention_prompt: Prompt
    # Judge rule -> its prompt (the shipped ones unless a test gives others).
    rule_prompts: Mapping[str, Prompt] = field(default_factory=load_judge_rule_prompts)
    # The LLM's outages: a call finding it down waits (None: it fails and is redelivered).
    outages: Outages | None = None
    # A coding task's attempt is verified by this (None: this scorer does not run the coding
    # track, and such an attempt fails as the platform's).
    verify: VerifyAttempt | None = None
    # ATM-Bench's own judge prompt (its open_end answers).
    atm_prompt: Prompt = field(default_factory=lambda: load_prompt(ATM_JUDGE_PROMPT_NAME))

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        answer = work.answer
        if answer is None:
            stored = await self.stores.records.answer_of(work.item_id)
            if stored is None or stored.state != "done" or stored.answer is None:
                raise FinalFailure(FailureKind.PLATFORM_ERROR, f"no answer for {work.item_id}")
            answer = stored.answer
        found = {
            "dataset_id": question["dataset_id"],
            "category": question["category"],
            "category_name": question["category_name"],
        }
        method = scoring_method(question.get("options"), question.get("scorer"))
        if method == "resolved":
            if self.verify is None:
                raise FinalFailure(
                    FailureKind.PLATFORM_ERROR, "this scorer does not run the coding track"
                )
            return found | await self.verify(question, answer)
        if method == "choice":
            scored = self.choice(answer, question["options"], question["gold_answer"])
        elif method == "f1_alone":
            scored = self.f1_only(question, answer)
        elif method == "atm":
            scored = await self.atm(question, answer, item)
        else:
            scored = await self.open_question(question, answer, item)
        # The judge has answered: the next judge call under the slot leaves now, not after
        # this question's evidence read.
        item.pass_turn()
        return found | scored | await self.evidence(work, question)

    async def evidence(self, work: QuestionWork, question: Document) -> Document:
        """Where the question's Search returned each piece of its evidence (nothing for a
        question without recognisable evidence): as the search ranked it, or, when the work
        does not carry that (a redelivered search's hand-on), from its stored candidates."""
        if not question.get("evidence_markers"):
            return {}
        if work.evidence_ranks is not None:
            return evidence_record(question, work.evidence_ranks)
        candidates = await self.stores.records.candidates_of(work.item_id)
        if candidates is None:
            # The answer stands without it: a figure beside the score never fails the score.
            log.warning("score.evidence_unavailable", item_id=work.item_id)
            return {}
        return question_evidence(question, candidates)

    async def atm(self, question: Document, answer: str, item: StageCall) -> Document:
        answer_type = question.get("answer_type")
        gold = question["gold_answer"]
        if answer_type is None or gold is None:
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR,
                f"{question.get('question_id')}: an ATM-Bench question needs its answer type "
                "and gold answer",
            )
        # The question too: ATM-Bench resolves "today" in a number answer against its date.
        deterministic = score_deterministic(
            answer_type, gold, answer, question=question["question"]
        )
        fields: Document = {
            "answer_type": answer_type,
            "qs_method": deterministic.method,
            "qs_version": ATM_QS_VERSION,
        }
        if deterministic.score is not None:
            return fields | {"qs": deterministic.score}
        text = judge_prompt_text(question["question"], gold, answer, self.atm_prompt.text)
        verdict = await judge(
            self._ask(question, text, item, ATM_JUDGE_MAX_TOKENS),
            self.settings.judge_runs,
            self.settings.judge_retries,
            parse=atm_judge_label,
        )
        return fields | {
            "qs": None if verdict.label is None else float(verdict.label == "CORRECT"),
            **self._verdict_fields(verdict, self.atm_prompt),
        }

    def _ask(
        self, question: Document, text: str, item: StageCall, max_tokens: int | None = None
    ) -> Callable[[], Awaitable[ChatReply]]:
        """The judge call of one question, under the item's LLM admission; `max_tokens` its
        reply budget (None: the deployment's judge budget)."""
        if item.admission is not None and item.admission.capacity.scope == "process":
            # Admitted on the verify lane: its calls would leave outside the LLM budget.
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR,
                f"{question.get('question_id')} is not a coding attempt, yet came to be verified",
            )
        settings = self.settings

        async def ask() -> ChatReply:
            return await complete_reply(
                self.llm,
                settings.judge_model,
                text,
                max_tokens or settings.judge_max_tokens,
                item.admission,
                outages=self.outages,
                outage_seconds=settings.llm_outage_seconds,
            )

        return ask

    def _verdict_fields(self, verdict: JudgeVerdict, prompt: Prompt) -> Document:
        return {
            "judge_label": verdict.label,
            "judge_labels": verdict.labels,
            "judge_replies": verdict.replies,
            "judge_calls": verdict.calls,
            # The platform's own model use (efficiency figures), as the provider counted it.
            "judge_tokens_in": verdict.tokens_in,
            "judge_tokens_out": verdict.tokens_out,
            "judge_model": self.settings.judge_model,
            "judge_prompt": prompt.name,
            "judge_prompt_sha256": prompt.sha256,
        }

    def f1_only(self, question: Document, answer: str) -> Document:
        variant = question.get("f1_variant", F1_VERSION)
        scorer = F1_VARIANTS.get(variant)
        if scorer is None:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, f"unknown F1 variant {variant!r}")
        return {
            "f1": scorer(answer, question["gold_answer"], question["category"]),
            "f1_version": variant,
        }

    def choice(self, answer: str, options: list[str], gold: str) -> Document:
        choice = score_choice(answer, options, gold)
        return {
            "multiple_choice": True,
            "chosen_option": choice.chosen,
            "choice_correct": choice.correct,
            "mc_version": MC_VERSION,
        }

    async def open_question(self, question: Document, answer: str, item: StageCall) -> Document:
        gold = question["gold_answer"]
        try:
            prompt, text = judge_prompt_for(
                question["question"],
                gold,
                answer,
                self.prompt,
                self.abstention_prompt,
                rule=question.get("judge_rule"),
                rule_prompts=self.rule_prompts,
                explanation=question.get("gold_explanation"),
            )
        except ValueError as error:
            # A planned question names a rule this scorer does not know: no retry can help.
            raise FinalFailure(FailureKind.PLATFORM_ERROR, str(error)) from None
        verdict = await judge(
            self._ask(question, text, item), self.settings.judge_runs, self.settings.judge_retries
        )
        # F1 and BLEU-1 are this question's own work: the next judge call need not wait.
        item.pass_turn()
        variant = question.get("f1_variant", F1_VERSION)
        scores = open_answer_scores(answer, gold, question["category"], variant)
        return {
            **self._verdict_fields(verdict, prompt),
            "f1": scores.f1,
            "f1_version": variant,
            "bleu1": scores.bleu1,
            "bleu1_version": BLEU_VERSION,
        }
