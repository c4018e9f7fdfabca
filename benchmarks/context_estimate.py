"""How conservative the context rule's token estimate is: `ceil(utf8_bytes / 3)` against the
local answer model's own tokenizer (llama.cpp `/tokenize`, SmolLM2), over every LoCoMo turn
rendered as a memory line. Prints ratios measured in this run; the estimate is safe when it
never counts fewer tokens than the tokenizer does.

    .venv/bin/python benchmarks/context_estimate.py [--datasets-root ../shared/datasets]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import httpx

from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.context import estimate_tokens
from aml_evaluation.prompts import format_memories
from aml_evaluation.registry import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    default_root = Path(__file__).resolve().parents[2] / "shared" / "datasets"
    parser.add_argument("--datasets-root", type=Path, default=default_root)
    parser.add_argument("--dataset", default="locomo")
    args = parser.parse_args()
    dataset = load_dataset(args.dataset, args.datasets_root)
    lines = [
        format_memories([(f"{turn.speaker}: {turn.text}", session.date_text)])
        for conversation in dataset.conversations
        for session in conversation.sessions
        for turn in session.turns
    ]
    with tempfile.TemporaryDirectory() as folder:
        config = StackConfig(data_dir=Path(folder), start_nats=False, start_mongo=False)
        with EmbeddedStack(config) as stack, httpx.Client(timeout=60) as http:
            stack.start_infra()
            root = stack.llm_base_url.removesuffix("/v1")
            counted = [
                len(http.post(f"{root}/tokenize", json={"content": line}).json()["tokens"])
                for line in lines
            ]
    estimated = [estimate_tokens(line) for line in lines]
    ratios = [e / c for e, c in zip(estimated, counted, strict=True) if c]
    under = sum(1 for e, c in zip(estimated, counted, strict=True) if e < c)
    print(f"{args.dataset}: {len(lines)} memory lines")
    print(f"tokens, tokenizer total {sum(counted)}, estimate total {sum(estimated)}")
    print(f"estimate / tokenizer: total {sum(estimated) / sum(counted):.3f}, "
          f"per line min {min(ratios):.3f} median {statistics.median(ratios):.3f}")  # fmt: skip
    print(f"lines the estimate undercounts: {under} of {len(lines)}")


if __name__ == "__main__":
    main()
