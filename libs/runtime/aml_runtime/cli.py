"""`aml`: run the platform on the embedded stack.

aml up     start NATS, MongoDB (wire server), the local LLM and every service; wait
aml demo   the same plus the reference memory system; run one smoke job on the synthetic
           dataset, show its progress and print the results table (exit 1 if it failed)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from aml_runtime.platform import (
    PlatformConfig,
    register_memory_server,
    start_memory_server,
    start_platform,
)
from aml_runtime.stack import EmbeddedStack, StackConfig

DEFAULT_DATASETS_ROOT = Path(__file__).resolve().parents[4] / "shared" / "datasets"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aml", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "demo"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--data-dir", type=Path, default=Path(".aml") / name)
        cmd.add_argument(
            "--datasets-root",
            type=Path,
            default=Path(os.environ.get("AML_DATASETS_ROOT", DEFAULT_DATASETS_ROOT)),
        )
    demo = sub.choices["demo"]
    demo.add_argument("--dataset", default="synthetic")
    demo.add_argument(
        "--keep-data",
        action="store_true",
        help="reuse the data dir instead of starting from an empty one",
    )
    demo.add_argument("--timeout", type=float, default=1800.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo" and not args.keep_data and args.data_dir.exists():
        shutil.rmtree(args.data_dir)
    stack = EmbeddedStack(StackConfig(data_dir=args.data_dir))
    # SIGTERM takes the same clean path as Ctrl-C: every child process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        print(f"starting the embedded stack in {stack.data_dir} ...", flush=True)
        stack.start_infra()
        platform = start_platform(stack, PlatformConfig(datasets_root=args.datasets_root))
        print(f"gateway   {platform.gateway_url}  (admin token in {stack.data_dir}/admin.token)")
        print(f"nats      {stack.nats_url}\nmongodb   {stack.mongo_url}")
        print(f"llm       {stack.llm_base_url}", flush=True)
        if args.command == "up":
            print("running; Ctrl-C stops everything", flush=True)
            while True:
                time.sleep(3600)
        return _demo(platform, stack, args.dataset, args.timeout)
    except KeyboardInterrupt:
        return 130
    finally:
        stack.stop()


def _demo(platform: Any, stack: EmbeddedStack, dataset: str, timeout: float) -> int:
    memory = start_memory_server(stack)
    version_id, api_key = register_memory_server(platform, memory, team="demo-team")
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
        submitted = api.post(
            "/v1/jobs",
            json={
                "version_id": version_id,
                "mode": "smoke",
                "run_label": f"demo-{int(time.time())}",
                "datasets": [dataset],
            },
        )
        submitted.raise_for_status()
        job_id = submitted.json()["job_id"]
        print(f"job {job_id} submitted ({dataset}); progress:", flush=True)
        status = _follow(api, job_id, timeout)
        if status["state"] != "completed":
            print(f"\njob {job_id} ended {status['state']}:")
            for error in status["errors"]:
                print(f"  [{error['stage']}/{error['kind']}] {error['item']}: {error['reason']}")
            return 1
        results = api.get(f"/v1/jobs/{job_id}/results").json()
    print()
    print(render_results(results))
    return 0


def _follow(api: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        status: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
        line = "  ".join(
            f"{stage} {p['done']}/{p['total']}"
            + (f" ({p['failed']} failed)" if p["failed"] else "")
            for stage, p in status["stages"].items()
        )
        line = f"[{status['elapsed_seconds']:7.1f}s] {status['state']:<9} {line}"
        if line.split("]", 1)[1] != last.split("]", 1)[-1]:
            print(line, flush=True)
            last = line
        if status["state"] in ("completed", "failed"):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not finish within {timeout:.0f}s")
        time.sleep(1.0)


def render_results(results: dict[str, Any]) -> str:
    """The per-category / per-dataset / Overall table, with question counts."""
    header = (
        f"{'dataset':<16}{'category':<16}{'questions':>10}{'scored':>8}{'failed':>8}"
        f"{'J':>8}{'F1':>8}"
    )
    rows = [header, "-" * len(header)]

    def row(dataset: str, category: str, m: dict[str, Any]) -> str:
        j = "-" if m["judge_accuracy"] is None else f"{100 * m['judge_accuracy']:.1f}"
        f1 = "-" if m["f1_mean"] is None else f"{100 * m['f1_mean']:.1f}"
        return (
            f"{dataset:<16}{category:<16}{m['questions']:>10}{m['scored']:>8}"
            f"{m['failed']:>8}{j:>8}{f1:>8}"
        )

    for dataset_id, data in results["datasets"].items():
        for name, metrics in data["categories"].items():
            note = " *" if name in data["excluded_from_overall"] else ""
            rows.append(row(dataset_id, name + note, metrics))
        rows.append(row(dataset_id, "(dataset)", data["overall"]))
    rows.append("-" * len(header))
    rows.append(row("Overall", "", results["overall"]))
    if any(d["excluded_from_overall"] for d in results["datasets"].values()):
        rows.append("* reported apart, not counted in the dataset or Overall figures")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
