"""The fixed answer and judge models are reached through any OpenAI-compatible endpoint."""

from __future__ import annotations

from openai import AsyncOpenAI

from aml_runtime.settings import LLMSettings


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
    response = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        seed=seed,
    )
    return response.choices[0].message.content or ""
