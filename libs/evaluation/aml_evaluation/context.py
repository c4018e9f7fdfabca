"""Which of the participant's candidates the answer model sees (SPEC R-6.1).

Rule (`context-v1`): candidates are taken in the participant's order; each is rendered as its
line of the answer prompt (`- [created_at] content`, see prompts.format_memories) and its tokens
counted; the longest prefix whose summed line tokens fit the budget is kept. The first
candidate is always kept, even alone over the budget, so an answer never lacks the system's top
result; nothing later is skipped to squeeze in a shorter one, since rank is the participant's
decision.

Tokens are counted with the answer model's own tokenizer where one is available offline (the
llama.cpp server's `/tokenize` for local models). Otherwise `estimate_tokens` is used: one token
per three UTF-8 bytes, rounded up. English prose averages about four bytes a token with the
tokenizers of current hosted models, so the estimate errs on the side of fewer candidates. It is
an estimate, not a bound: `benchmarks/context_estimate.py` measured it against SmolLM2's small
49k-entry vocabulary on every LoCoMo turn at 1.086x the true total, but under the true count on
about a third of the lines (digits and dates take one token per character there). The budget's
purpose is that every participant's candidates are cut by the same deterministic rule; the
answer model's own context window is far larger than the budget, so an undercount cannot
overflow it.

Images (multimodal candidates, R-4.8 content arrays). A candidate's line is the text of its
content: a string, or the array's parts in order. When the answer model takes images, the line
holds the text parts joined by a space and each image is its own part right after the line,
counted as IMAGE_TOKENS: the fixed cost of an image that OpenAI's vision models see at
`"detail": "low"` (512x512 px, 85 tokens whatever the image's size), which is how the answerer
sends every image, so the count is the same for every participant and every image. An image
reaches the model only as a well-formed `data:image/...;base64,` URL of a PNG, JPEG, GIF or WebP
within the per-image limit (aml_evaluation.media): the platform delivers images that way, and a
participant's other URL (http, file, ...) is never handed to the model's provider to fetch. When
the model does not take images (a text-only model), or an image is not such a URL, the image is
withheld: the line shows IMAGE_PLACEHOLDER in its place, counted as text like the rest of the
line. A text-only candidate's line is exactly what it was before images existed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel

from aml_evaluation.media import MAX_IMAGE_BYTES, ImageError, parse_data_url
from aml_evaluation.prompts import IMAGE_PLACEHOLDER, Memory, format_memories

CONTEXT_RULE = "context-v1"
ESTIMATE_COUNTER = "utf8-bytes-div-3-v1"
# Tokens counted for one image given to the answer model (see the module docstring).
IMAGE_TOKENS = 85

TokenCount = Callable[[str], Awaitable[int]]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 3)


async def estimated(text: str) -> int:
    return estimate_tokens(text)


class FittedContext(BaseModel):
    memories: list[Memory]
    tokens: int
    candidates_returned: int
    # Images of the kept candidates shown as IMAGE_PLACEHOLDER instead (see the docstring).
    images_withheld: int = 0

    @property
    def images(self) -> int:
        """Images of the kept candidates that reach the answer model."""
        return sum(len(memory.images) for memory in self.memories)


def model_image(url: str) -> bool:
    """Whether an image URL may be given to the answer model: a base64 data URL of a PNG, JPEG,
    GIF or WebP image of at most MAX_IMAGE_BYTES (see the module docstring)."""
    try:
        _, data = parse_data_url(url)
    except ImageError:
        return False
    return len(data) <= MAX_IMAGE_BYTES


def memory_of(candidate: dict[str, Any], takes_images: bool = False) -> tuple[Memory, int]:
    """The memory a stored candidate shows the answer model, and how many of its images were
    withheld (see the module docstring)."""
    content = candidate["content"]
    created = candidate.get("created_at")
    created_at = None if created is None else str(created)
    if isinstance(content, str):
        return Memory(content, created_at), 0
    words: list[str] = []
    images: list[str] = []
    withheld = 0
    for part in content:
        if part.get("type") == "text":
            words.append(part.get("text", ""))
            continue
        url = part.get("image_url", {}).get("url", "")
        if takes_images and model_image(url):
            images.append(url)
        else:
            words.append(IMAGE_PLACEHOLDER)
            withheld += 1
    return Memory(" ".join(words), created_at, tuple(images)), withheld


async def fit_candidates(
    candidates: Sequence[dict[str, Any]],
    max_tokens: int,
    count: TokenCount,
    takes_images: bool = False,
) -> FittedContext:
    kept: list[Memory] = []
    used = 0
    withheld = 0
    for candidate in candidates:
        memory, memory_withheld = memory_of(candidate, takes_images)
        tokens = await count(format_memories([memory])) + IMAGE_TOKENS * len(memory.images)
        if kept and used + tokens > max_tokens:
            break
        kept.append(memory)
        used += tokens
        withheld += memory_withheld
    return FittedContext(
        memories=kept, tokens=used, candidates_returned=len(candidates), images_withheld=withheld
    )
