"""The evaluation spec (SPEC R-6.4): everything a release holds constant between jobs, as one
document with a content hash. Two jobs with the same spec hash were answered and scored the
same way; changing any model, parameter, prompt text or scorer version changes the hash."""

from __future__ import annotations

import hashlib
import json
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

# /2 added `judge_abstention`, the judge call for questions without a gold answer; /3 added
# `judge_rules`, the judge calls of questions that carry a judge rule (LongMemEval's types).
SPEC_SCHEMA: Final = "aml-eval-spec/3"
# Fields added within the schema, with the default that a spec without them means.
_ADDED_FIELD_DEFAULTS: Final[dict[str, object]] = {"answer_images": True}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelCall(_Frozen):
    """One fixed use of a language model: which model, how, and with which prompt."""

    model: str
    temperature: float = 0.0
    max_tokens: int = Field(ge=1)
    prompt: str = Field(description="Prompt name, e.g. answer_v1.")
    prompt_sha256: str = Field(description="sha256 of the prompt file's exact bytes.")


class ContextBudget(_Frozen):
    """How much of the participant's candidates the answer model sees (R-6.1)."""

    max_tokens: int = Field(ge=1, description="Tokens of memory text in the answer prompt.")
    counter: str = Field(description="How tokens are counted (see aml_evaluation.context).")


class EvaluationSpec(_Frozen):
    schema_version: Literal["aml-eval-spec/3"] = SPEC_SCHEMA
    answer: ModelCall
    context: ContextBudget
    judge: ModelCall
    judge_abstention: ModelCall = Field(
        description="The judge of a question whose gold is that the conversation does not "
        "contain the answer: correct iff the answer says so."
    )
    judge_rules: dict[str, ModelCall] = Field(
        default_factory=dict,
        description="Judge rule -> the judge of questions that carry it (aml_evaluation.judging"
        ".JUDGE_RULE_PROMPTS: LongMemEval's per-type answer checks).",
    )
    judge_runs: int = Field(ge=1, description="Judge calls per question; majority label.")
    scorers: dict[str, str] = Field(
        description="Scorer name → version (F1 variants, abstention rule, BLEU-1, option "
        "accuracy, judge parser)."
    )
    top_k: int = Field(ge=1)
    chunker: str
    word_counter: str
    answer_images: bool = Field(
        default=True,
        description="Whether the answer model is given the images of multimodal candidates and "
        "questions (low-detail image parts); false: each image is shown as a placeholder.",
    )

    def canonical_json(self) -> bytes:
        """Sorted keys, no insignificant whitespace: the bytes the hash is taken over. A field
        added after the schema's first specs is left out while it holds its default, so the
        hash of a deployment that does not set it stays what it was."""
        document = self.model_dump(mode="json")
        for name, default in _ADDED_FIELD_DEFAULTS.items():
            if document[name] == default:
                del document[name]
        return json.dumps(
            document, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def summary(self) -> dict[str, str]:
        """The flat view shown with every job."""
        return {
            "spec_hash": self.content_hash,
            "top_k": str(self.top_k),
            "chunker": self.chunker,
            "word_counter": self.word_counter,
            "answer_model": self.answer.model,
            "answer_images": "image parts (low detail)" if self.answer_images else "placeholder",
            "answer_prompt": f"{self.answer.prompt}@{self.answer.prompt_sha256[:12]}",
            "context_budget": f"{self.context.max_tokens} tokens ({self.context.counter})",
            "judge_model": self.judge.model,
            "judge_prompt": f"{self.judge.prompt}@{self.judge.prompt_sha256[:12]}",
            "judge_abstention_prompt": (
                f"{self.judge_abstention.prompt}@{self.judge_abstention.prompt_sha256[:12]}"
            ),
            **{
                f"judge_rule.{rule}": f"{call.prompt}@{call.prompt_sha256[:12]}"
                for rule, call in sorted(self.judge_rules.items())
            },
            "judge_runs": str(self.judge_runs),
            **{f"scorer.{name}": version for name, version in sorted(self.scorers.items())},
        }
