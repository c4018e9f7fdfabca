"""Answer one question from the candidates the participant returned, in its order (R-6.1).

Multimodal candidates and questions (R-4.4, R-4.8 content arrays): when the answer model takes
images (`answer_model_images`), the prompt reaches it as OpenAI's content array, each memory's
images right after its line and the question's images (the image parts of its planned Search
query) right after the question; otherwise every image is shown as a placeholder and the answer
document counts them in `images_withheld` (aml_evaluation.context, prompts.answer_content). A
question without images is asked exactly as before: the prompt as one string."""

from __future__ import annotations

from dataclasses import dataclass

from openai import AsyncOpenAI

from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_contract.participant import ImageUrlPart, SearchRequest
from aml_evaluation.context import TokenCount, fit_candidates, model_image
from aml_evaluation.prompts import IMAGE_PLACEHOLDER, Prompt, answer_content, question_with_options
from aml_pipeline.evaluation_spec import token_counter_name
from aml_pipeline.llm import complete
from aml_pipeline.outages import Outages
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores


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

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        candidates = work.candidates
        if candidates is None:
            candidates = await self.stores.records.candidates_of(work.item_id)
            if candidates is None:
                raise FinalFailure(
                    FailureKind.PLATFORM_ERROR, f"no search result for {work.item_id}"
                )
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
        answer = await complete(
            self.llm,
            self.settings.answer_model,
            answer_content(self.prompt, context.memories, text, sent),
            self.settings.answer_max_tokens,
            item.admission,
            outages=self.outages,
            outage_seconds=self.settings.llm_outage_seconds,
        )
        images = {
            "images_sent": context.images + len(sent),
            "images_withheld": context.images_withheld + len(shown) - len(sent),
        }
        return {
            "answer": answer.strip(),
            "model": self.settings.answer_model,
            "prompt": self.prompt.name,
            "prompt_sha256": self.prompt.sha256,
            "candidates_returned": context.candidates_returned,
            "candidates_used": len(context.memories),
            "context_tokens": context.tokens,
            "token_counter": token_counter_name(self.settings),
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
