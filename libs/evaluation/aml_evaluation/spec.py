"""The evaluation spec (SPEC R-6.4): everything a release holds constant between jobs, as one
document with a content hash. Two jobs with the same spec hash were answered and scored the
same way; changing any model, parameter, prompt text or scorer version changes the hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from aml_evaluation.confidence import ConfidenceMethod

# /2 added `judge_abstention`, the judge call for questions without a gold answer; /3 added
# `judge_rules`, the judge calls of questions that carry a judge rule (LongMemEval's types).
SPEC_SCHEMA: Final = "aml-eval-spec/3"
# Fields added within the schema, with the default that a spec without them means: a spec
# stored before one was added keeps its hash. `confidence` None: results reported no interval.
_ADDED_FIELD_DEFAULTS: Final[dict[str, object]] = {
    "answer_images": True,
    "coding": None,
    "confidence": None,
}


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


class CodingSpec(_Frozen):
    """How the coding track solves and verifies a task (R-2.5): part of the spec of coding jobs
    only, so a change here never changes the hash of a textual or multimodal job's spec."""

    agent: str = Field(description="The coding agent and its version, e.g. mini-swe-agent 2.4.6.")
    agent_config_sha256: str = Field(description="sha256 of the agent config's canonical JSON.")
    agent_config: dict[str, Any] = Field(
        description="The whole agent config (aml_pipeline.coding_agent.AgentConfig): prompts, "
        "step limit, per-command timeout, wall limit, memory budget and rule, reply cap, "
        "temperature."
    )
    model: ModelCall = Field(description="The agent's model: the answer model, each step.")
    solve_sandbox: dict[str, float] = Field(
        description="The sandbox limits of each of the agent's commands."
    )
    verify: str = Field(description="The verify step's rule (aml_pipeline.coding_track).")
    verify_sandbox: dict[str, float] = Field(
        description="The sandbox limits of the verify step's test command."
    )
    grading: str = Field(description="The test log grading rules (aml_evaluation.coding.grading).")


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
    coding: CodingSpec | None = Field(
        default=None,
        description="The coding track's agent and verify rules; set in coding jobs' specs only.",
    )
    confidence: ConfidenceMethod | None = Field(
        default=None,
        description="How sure a score is (aml_evaluation.confidence): the bootstrap of every "
        "headline figure's interval and of the board's ties, its level, resamples and seed.",
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
            **(self.confidence_summary() if self.confidence is not None else {}),
            **(self.coding_summary() if self.coding is not None else {}),
        }

    def confidence_summary(self) -> dict[str, str]:
        confidence = self.confidence
        if confidence is None:
            return {}
        return {
            "confidence": f"{confidence.method}: {confidence.level:.0%}, "
            f"{confidence.resamples} resamples ({confidence.batch} per draw), "
            f"seed {confidence.seed}"
        }

    def coding_summary(self) -> dict[str, str]:
        coding = self.coding
        if coding is None:
            return {}
        config = coding.agent_config
        return {
            "coding.agent": coding.agent,
            "coding.agent_config": coding.agent_config_sha256,
            "coding.model": coding.model.model,
            "coding.limits": (
                f"{config.get('step_limit')} steps, {config.get('command_timeout_seconds')} s "
                f"per command, {config.get('wall_seconds')} s per attempt"
            ),
            "coding.memory_budget": f"{config.get('memory_tokens')} tokens "
            f"({config.get('memory_rule')}/{config.get('token_counter')})",
            "coding.verify": coding.verify,
            "coding.grading": coding.grading,
        }
