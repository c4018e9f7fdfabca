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

A coding task's attempt (scorer `swe_resolved`) is verified instead (R-2.5, `VerifyAttempt`): its
patch and the task's hidden tests in a fresh sandbox, the test log graded with SWE-bench's rules;
no LLM is asked. Its work comes on the scorer's verify lane, admitted under the process's own
bound on sandboxes (`coding_verify_concurrency`), never under the LLM budget."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from openai import AsyncOpenAI

from aml_contract.messages import QuestionWork
from aml_evaluation.judging import judge, judge_prompt_for, load_judge_rule_prompts
from aml_evaluation.prompts import Prompt
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
            return found | self.choice(answer, question["options"], question["gold_answer"])
        if method == "f1_alone":
            return found | self.f1_only(question, answer)
        return found | await self.open_question(question, answer, item)

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
                settings.judge_max_tokens,
                item.admission,
                outages=self.outages,
                outage_seconds=settings.llm_outage_seconds,
            )

        verdict = await judge(ask, settings.judge_runs, settings.judge_retries)
        variant = question.get("f1_variant", F1_VERSION)
        scores = open_answer_scores(answer, gold, question["category"], variant)
        return {
            "judge_label": verdict.label,
            "judge_labels": verdict.labels,
            "judge_replies": verdict.replies,
            "judge_calls": verdict.calls,
            # The platform's own model use (efficiency figures), as the provider counted it.
            "judge_tokens_in": verdict.tokens_in,
            "judge_tokens_out": verdict.tokens_out,
            "judge_model": settings.judge_model,
            "judge_prompt": prompt.name,
            "judge_prompt_sha256": prompt.sha256,
            "f1": scores.f1,
            "f1_version": variant,
            "bleu1": scores.bleu1,
            "bleu1_version": BLEU_VERSION,
        }
