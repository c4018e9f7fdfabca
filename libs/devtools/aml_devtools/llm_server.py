"""Local OpenAI-compatible LLM server for the embedded stack.

Serves SmolLM2-135M-Instruct through ``xllamacpp``, which runs llama.cpp's HTTP
server inside this process. The gguf file is installed at set-up time by
``python -m aml_devtools.install_model`` (dev.py runs it), pinned by sha256. The
process is meant to be launched by :class:`aml_devtools.processes.ManagedProcess`
as ``python -m aml_devtools.llm_server --port PORT``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import types
from pathlib import Path

from aml_devtools.install_model import INSTALL_COMMAND, model_file

MODEL_ALIAS = "smollm2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m aml_devtools.llm_server",
        description="Serve SmolLM2-135M-Instruct over an OpenAI-compatible API.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=1, help="number of decoding slots")
    parser.add_argument("--ctx", type=int, default=8192, help="total context size (tokens)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--model", type=Path, default=None, help=f"gguf path (default: {model_file()})"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model: Path = args.model or model_file()
    if not model.is_file():
        if args.model is not None:
            print(f"llm_server: model file not found: {model}", file=sys.stderr)
        else:
            print(
                f"llm_server: the local model is not installed ({model} is missing); install "
                f"the pinned copy with `{INSTALL_COMMAND}` (python3 dev.py does this at set-up)",
                file=sys.stderr,
            )
        return 2

    # Imported lazily so that `--help` and argument errors don't pay for loading
    # the native extension.
    import xllamacpp  # type: ignore[import-untyped]

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    # model_alias is a set of names in this binding; a bare string would become
    # a set of its characters.
    params.model_alias = {MODEL_ALIAS}
    # Reusing a cached prompt prefix evaluates only the rest of a prompt, with other matrix
    # shapes and so other rounding: the same prompt could then give another answer at
    # temperature 0. Every prompt is evaluated whole, so identical prompts give identical answers.
    params.cache_prompt = False
    params.cache_ram_mib = 0

    stop = threading.Event()

    def _on_signal(signum: int, _frame: types.FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    # The server runs on native threads; it must stay referenced until exit.
    server = xllamacpp.Server(params)
    print(f"llm_server: serving {model} as {MODEL_ALIAS!r} on {args.host}:{args.port}", flush=True)
    # A timed wait (rather than a bare wait) keeps the main thread returning to
    # the interpreter so Python-level signal handlers get to run.
    while not stop.wait(0.5):
        pass
    print("llm_server: shutting down", flush=True)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
