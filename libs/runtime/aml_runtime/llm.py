"""The fixed answer and judge models are reached through any OpenAI-compatible endpoint."""

from __future__ import annotations

import httpx
from openai import AsyncOpenAI

from aml_evaluation.context import TokenCount, estimated
from aml_runtime.settings import LLMSettings
from aml_runtime.telemetry import stage_span


def make_llm_client(settings: LLMSettings) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() or "unset",
        timeout=settings.llm_timeout_seconds,
        # Redelivery of the work message is the retry mechanism; keep one layer of it.
        max_retries=1,
    )


async def complete(
    client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, seed: int = 0
) -> str:
    # openai's own HTTP stack is not the instrumented httpx: the call gets its span here.
    with stage_span("llm.chat", model=model, max_tokens=max_tokens):
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=max_tokens,
            seed=seed,
        )
    return response.choices[0].message.content or ""


def make_token_counter(settings: LLMSettings, http: httpx.AsyncClient) -> TokenCount:
    """The answer model's token count (aml_evaluation.context): its own tokenizer through a
    llama.cpp server's `/tokenize`, or the conservative estimate."""
    if settings.token_counter == "estimate":
        return estimated
    root = settings.llm_base_url.rstrip("/").removesuffix("/v1")

    async def count(text: str) -> int:
        response = await http.post(f"{root}/tokenize", json={"content": text})
        response.raise_for_status()
        return len(response.json()["tokens"])

    return count
