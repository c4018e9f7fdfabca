"""The fixed prompts of a release (SPEC R-6.1, R-6.4), shipped as package data in `prompts/`.
Each prompt is identified by its file name (`answer_v1`) and its sha256, which the evaluation
spec records so that a changed prompt changes the spec hash."""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence
from importlib.resources import files
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

# `<name>_v<n>`: the version is part of the file name, so an edited prompt gets a new file
# and old results keep pointing at the text they were produced with. The pattern also keeps
# the name from escaping the prompts directory.
_PROMPT_NAME = re.compile(r"[a-z][a-z0-9_]*_(v[0-9]+)")
_NO_MEMORIES = "(none)"
# What an answer model that does not take images reads where an image was (see
# aml_evaluation.context): it knows an image was there without seeing it.
IMAGE_PLACEHOLDER = "[image]"
# How every image is given to the answer model; aml_evaluation.context.IMAGE_TOKENS is its cost.
IMAGE_DETAIL = "low"

# One part of an OpenAI chat message's content array.
ContentPart = dict[str, Any]


class Memory(NamedTuple):
    """A candidate as the answer prompt shows it: its line's text, its date when known and the
    images given to the model right after the line (data URLs, in the participant's order)."""

    text: str
    created_at: str | None
    images: tuple[str, ...] = ()


class Prompt(BaseModel):
    """`text` is a str.format template; `sha256` is over the file's exact bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    version: str
    text: str
    sha256: str

    @property
    def fields(self) -> frozenset[str]:
        """The placeholders the template expects, to check callers against."""
        return template_fields(self.text)


def template_fields(text: str) -> frozenset[str]:
    return frozenset(
        field for _, field, _, _ in string.Formatter().parse(text) if field is not None
    )


def load_prompt(name: str) -> Prompt:
    """The prompt `prompts/<name>.txt` of this package, e.g. `load_prompt("judge_v1")` gives
    name "judge_v1", version "v1". Raises ValueError for a malformed name and
    FileNotFoundError for an unknown one."""
    matched = _PROMPT_NAME.fullmatch(name)
    if matched is None:
        raise ValueError(f"prompt name {name!r} is not of the form <name>_v<n>")
    data = (files("aml_evaluation") / "prompts" / f"{name}.txt").read_bytes()
    return Prompt(
        name=name,
        version=matched.group(1),
        text=data.decode("utf-8"),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def format_memories(candidates: Sequence[tuple[str, str | None] | Memory]) -> str:
    """The `{memories}` block of the answer prompt: one `- [created_at] content` line per
    (content, created_at) candidate, in the order given (the participant's relevance order,
    SPEC R-6.1), without brackets when there is no created_at. Continuation lines of a
    multi-line memory are indented so each memory stays one list item. No candidates gives
    "(none)", so the prompt never shows an empty section."""
    if not candidates:
        return _NO_MEMORIES
    lines = []
    for candidate in candidates:
        content, created_at = candidate[0], candidate[1]
        prefix = f"- [{created_at}] " if created_at else "- "
        lines.append(prefix + content.replace("\n", "\n  "))
    return "\n".join(lines)


def image_part(url: str) -> ContentPart:
    return {"type": "image_url", "image_url": {"url": url, "detail": IMAGE_DETAIL}}


def answer_content(
    prompt: Prompt,
    memories: Sequence[Memory],
    question: str,
    question_images: Sequence[str] = (),
) -> str | list[ContentPart]:
    """The answer model's user message: the prompt with its `{memories}` and `{question}`.

    Without images it is the prompt's text, exactly `prompt.text.format(...)`. With images it
    is OpenAI's content array, in order: the prompt's text up to and including the first
    memory line that has images, then that memory's images (`image_url` parts), then the text
    on to the next such line, and so on; the question's images come right after the question's
    text. Joining the array's text parts gives exactly the text form, so a model sees the same
    words either way. Raises ValueError for a template field other than memories and question
    (or one with a conversion or format spec) when there are images."""
    if not question_images and not any(memory.images for memory in memories):
        return prompt.text.format(memories=format_memories(memories), question=question)
    parts: list[ContentPart] = []
    text: list[str] = []

    def close_text() -> None:
        joined = "".join(text)
        text.clear()
        if joined:
            parts.append({"type": "text", "text": joined})

    def then_images(urls: Sequence[str]) -> None:
        if urls:
            close_text()
            parts.extend(image_part(url) for url in urls)

    for literal, field, spec, conversion in string.Formatter().parse(prompt.text):
        text.append(literal)
        if field is None:
            continue
        if spec or conversion or field not in ("memories", "question"):
            raise ValueError(f"prompt {prompt.name}: unsupported field {{{field}}} with images")
        if field == "question":
            text.append(question)
            then_images(question_images)
            continue
        if not memories:
            text.append(_NO_MEMORIES)
        for index, memory in enumerate(memories):
            text.append(("\n" if index else "") + format_memories([memory]))
            then_images(memory.images)
    close_text()
    return parts


def question_with_options(
    question: str, options: Sequence[str] | None, question_date: str | None = None
) -> str:
    """The `{question}` of the answer prompt. A multiple-choice question lists its options as
    lettered lines (the same options the participant's Search received, R-4.7) and asks for
    the letter, which aml_evaluation.scoring.parse_choice reads back.

    A question with a date (LongMemEval's `question_date`: when the user asks it) is followed
    by the line `Current date: <date as the source writes it>`, as LongMemEval's own answer
    prompts put it (xiaowu0162/LongMemEval, src/generation/run_generation.py, "Current Date:"),
    so a temporal question ("how many days ago ...") has today's date to count from. The Search
    request never carries it (R-4.7: the query is the question text alone). Without a date the
    text is exactly as before."""
    if question_date is not None:
        question = f"{question}\nCurrent date: {question_date}"
    if not options:
        return question
    lines = [f"{chr(ord('A') + i)}. {option}" for i, option in enumerate(options)]
    return "\n".join([question, "Options:", *lines, "Answer with the letter of one option."])
