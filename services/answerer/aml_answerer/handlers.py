"""Answer one question from the candidates the participant returned, in its order (R-6.1); a
coding task's attempt is solved instead (R-2.5, `SolveTask`): the fixed coding agent works on the
task with the candidates in its prompt, and its answer is its patch.

Multimodal candidates and questions (R-4.4, R-4.8 content arrays): when the answer model takes
images (`answer_model_images`), the prompt reaches it as OpenAI's content array, each memory's
images right after its line and the question's images (the image parts of its planned Search
query) right after the question; otherwise every image is shown as a placeholder and the answer
document counts them in `images_withheld` (aml_evaluation.context, prompts.answer_content). A
question without images is asked exactly as before: the prompt as one string."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from openai import AsyncOpenAI

from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_contract.participant import ImageUrlPart, SearchRequest
from aml_evaluation.context import TokenCount, fit_candidates, model_image
from aml_evaluation.efficiency import WordCounts, retrieved_size
from aml_evaluation.prompts import IMAGE_PLACEHOLDER, Prompt, answer_content, question_with_options
from aml_pipeline.capacity import lend_turn
from aml_pipeline.coding_agent import AgentConfig, ChatMessage, ContextExhausted, PlatformFailure
from aml_pipeline.coding_track import (
    OpenTask,
    OpenWorkspace,
    SandboxCheck,
    answer_fields,
    open_task_files,
    solve,
)
from aml_pipeline.evaluation_spec import token_counter_name
from aml_pipeline.llm import ContextLengthExceeded, complete_chat, complete_reply
from aml_pipeline.outages import Outages
from aml_pipeline.sandbox import Sandbox, SandboxUnavailable
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores


async def search_candidates(work: QuestionWork, stores: Stores) -> list[Document]:
    """The candidates the search stored: handed on with the work, or read when they were not."""
    if work.candidates is not None:
        return work.candidates
    candidates = await stores.records.candidates_of(work.item_id)
    if candidates is None:
        raise FinalFailure(FailureKind.PLATFORM_ERROR, f"no search result for {work.item_id}")
    return candidates


@dataclass
class SolveTask:
    """Solve a coding task's attempt (R-2.5; aml_pipeline.coding_track.solve): the fixed agent,
    each of its steps one call of the answer model under the item's LLM admission (a rate slot
    per call, the item's concurrency slot throughout), works in a fresh sandbox over the task's
    snapshot. The answer document records the attempt; its `answer` is the submitted patch.

    The platform's failures never become an unresolved attempt: an LLM that is down (the item
    is redelivered once it answers; past its outage window the item fails as platform_error), a
    sandbox that fails, a task whose files are unavailable raise and are retried, then fail the
    item as platform_error; a machine without bubblewrap fails it at once with one line."""

    settings: AnswererSettings
    # The searches whose candidates did not travel with the work (`records`).
    stores: Stores
    llm: AsyncOpenAI
    # The agent's config, or how to load it (`evaluation_spec.coding_agent_loader`: on the
    # first coding item, in a worker thread, since it imports mini-swe-agent).
    agent: AgentConfig | Callable[[], AgentConfig]
    # The task's files by dataset and task id (aml_evaluation.coding.source).
    open_task: OpenTask
    count_tokens: TokenCount
    # The LLM's outages: a call finding it down declares or sees the pause, and the attempt is
    # redelivered (None: it fails and is redelivered all the same).
    outages: Outages | None = None
    open_workspace: OpenWorkspace = Sandbox.from_archive
    sandbox_check: SandboxCheck = field(default_factory=SandboxCheck)

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        candidates = await search_candidates(work, self.stores)
        await self.sandbox_check()
        files = await open_task_files(self.open_task, question)
        settings, agent = self.settings, await self.agent_config()

        async def complete(messages: list[ChatMessage]) -> tuple[str, int, int]:
            try:
                reply = await complete_chat(
                    self.llm,
                    settings.answer_model,
                    messages,
                    agent.reply_max_tokens,
                    item.admission,
                    temperature=agent.temperature,
                    outages=self.outages,
                    outage_seconds=settings.llm_outage_seconds,
                )
            except ContextLengthExceeded as exceeded:
                raise ContextExhausted(str(exceeded)) from exceeded
            return reply.text, reply.tokens_in, reply.tokens_out

        try:
            # An attempt holds its slot for minutes: the slot's next item is fetched when it
            # ends, not when its first call leaves. The agent's calls are tasks of their own
            # (made from its thread): they leave under the turn this item holds for its whole
            # attempt.
            with item.hold_early_fetch(), lend_turn(item.admission):
                solution = await solve(
                    files.task,
                    files.snapshot,
                    candidates,
                    agent,
                    complete,
                    self.count_tokens,
                    self.open_workspace,
                )
        except PlatformFailure as failure:
            if isinstance(failure.__cause__, FinalFailure):
                raise failure.__cause__ from None
            raise
        except SandboxUnavailable as unavailable:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, str(unavailable)) from None
        fields = answer_fields(solution, agent, settings.answer_model)
        # What the Search returned against what the agent's prompt kept (efficiency figures).
        size = retrieved_size(candidates, solution.memory.kept)
        return fields | size.model_dump()

    async def agent_config(self) -> AgentConfig:
        if isinstance(self.agent, AgentConfig):
            return self.agent
        try:
            return await asyncio.to_thread(self.agent)
        except RuntimeError as missing:
            # mini-swe-agent is missing or not the pinned version here: no redelivery to this
            # process could change that.
            raise FinalFailure(FailureKind.PLATFORM_ERROR, str(missing)) from None


@dataclass
class AnswerQuestion:
    settings: AnswererSettings
    # The planned questions' Search bodies (`plans`), and the searches whose candidates did not
    # travel with the work (`records`).
    stores: Stores
    llm: AsyncOpenAI
    prompt: Prompt
    count_tokens: TokenCount
    # The LLM's outages: a call finding it down waits (None: it fails and is redelivered).
    outages: Outages | None = None
    # A question that carries a coding task is solved by this (None: this answerer does not
    # run the coding track, and such a question fails as the platform's).
    solve: SolveTask | None = None
    # The candidates' word counts (efficiency figures), remembered across questions.
    word_counts: WordCounts = field(default_factory=WordCounts)

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        if question.get("coding_task"):
            if self.solve is None:
                raise FinalFailure(
                    FailureKind.PLATFORM_ERROR, "this answerer does not run the coding track"
                )
            return await self.solve(work, question, item)
        candidates = await search_candidates(work, self.stores)
        takes_images = self.settings.answer_model_images
        context = await fit_candidates(
            candidates,
            self.settings.answer_context_tokens,
            self.count_tokens,
            takes_images,
        )
        text = question_with_options(
            question["question"], question.get("options"), question.get("question_date")
        )
        shown = await self.question_images(work, question)
        sent = [url for url in shown if takes_images and model_image(url)]
        # Without the images, the question says where they were, as a memory's line does.
        text += f" {IMAGE_PLACEHOLDER}" * (len(shown) - len(sent))
        reply = await complete_reply(
            self.llm,
            self.settings.answer_model,
            answer_content(self.prompt, context.memories, text, sent),
            self.settings.answer_max_tokens,
            item.admission,
            outages=self.outages,
            outage_seconds=self.settings.llm_outage_seconds,
        )
        # The slot's next answer call leaves now, not after this answer's counting and storing.
        item.pass_turn()
        # What the Search returned, by the frozen word counter (the same for every answer
        # model), against what fitted the budget: the efficiency figures' retrieved context.
        size = retrieved_size(candidates, len(context.memories), self.word_counts)
        images = {
            "images_sent": context.images + len(sent),
            "images_withheld": context.images_withheld + len(shown) - len(sent),
        }
        return {
            "answer": reply.text.strip(),
            "model": self.settings.answer_model,
            "prompt": self.prompt.name,
            "prompt_sha256": self.prompt.sha256,
            "candidates_returned": context.candidates_returned,
            "candidates_used": len(context.memories),
            "context_tokens": context.tokens,
            "token_counter": token_counter_name(self.settings),
            **size.model_dump(),
            # The answer model's use, as the provider counted it.
            "tokens_in": reply.tokens_in,
            "tokens_out": reply.tokens_out,
            # Only when there were images, so a text question's document is as before.
            **({name: count for name, count in images.items() if count}),
        }

    async def question_images(self, work: QuestionWork, question: Document) -> list[str]:
        """The image URLs of the question's planned Search query, in order: read from the
        planned question only when it shows images (`question_images`)."""
        if not question.get("question_images"):
            return []
        body = await self.stores.plans.search_body(work.item_id)
        if body is None:
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR, f"the planned Search body of {work.item_id} is gone"
            )
        query = SearchRequest.model_validate_json(body).query
        if isinstance(query, str):
            return []
        return [part.image_url.url for part in query if isinstance(part, ImageUrlPart)]
