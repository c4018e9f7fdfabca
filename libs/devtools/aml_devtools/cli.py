"""`aml`: run the platform on the embedded stack.

aml up     start NATS, MongoDB (wire server), the local LLM and every service; wait
           (`--nats-nodes 3`: NATS as a three-node JetStream cluster, streams at R3)
aml demo   the same plus the reference memory system; run one smoke job on the synthetic
           dataset, show its progress and print the results table (exit 1 if it failed);
           `--dataset synthetic-coding` runs the coding track, its agent's model the LLM
           stand-in's scripted agent (see aml_devtools.coding_demo), and prints the resolved table
aml rescore  score a predictions file against a dataset offline (see aml_devtools.rescore)
aml trace  print the span tree of every trace of one work item (from the stack's span files)
aml check  check a memory system's Add/Search/Health endpoints against the participant contract
aml baseline  print this deployment's release baseline (evaluation spec, code and dataset bundle
           hashes, questions per dataset) from its AML_* settings; --json/--store: the JSON of
           AML_RELEASE_BASELINE
aml dataset  register a dataset file placed under the datasets root (add) and list every
           dataset, shipped and operator-registered (list); see aml_devtools.dataset_cli
aml team   a team's client of the gateway API (AML_API_URL, AML_API_KEY): request access,
           follow the request, list versions and datasets, submit, watch a job, results,
           errors, audit (see aml_devtools.team_cli)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from aml_devtools import coding_demo, conformance, dataset_cli, rescore, team_cli, tracefiles
from aml_devtools.platform import (
    PlatformConfig,
    register_memory_server,
    start_memory_server,
    start_platform,
)
from aml_devtools.stack import DataDirBusyError, EmbeddedStack, StackConfig
from aml_devtools.tables import category_numbers, render_efficiency, render_results
from aml_evaluation.atmbench.scoring import ATM_JUDGE_MAX_TOKENS
from aml_evaluation.prompts import load_prompt
from aml_evaluation.punkt import PunktDataError, require_punkt_tab
from aml_evaluation.registry import (
    DatasetFileError,
    bundle_hash,
    dataset_id_of,
    known_ids,
    open_dataset,
    registered,
)
from aml_evaluation.scoring import BLEU_VERSION, CODING_SCORER, F1_VARIANTS
from aml_pipeline.coding_track import registered_tasks, verify_limits
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.llm import ChatReply, complete_reply, make_llm_client
from aml_pipeline.sandbox import SandboxUnavailable, require_sandbox
from aml_runtime.settings import EvaluationSettings, LLMSettings

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
        cmd.add_argument(
            "--nats-nodes",
            type=int,
            choices=(1, 3),
            default=1,
            help="NATS servers, clustered on loopback with the streams at as many replicas "
            "(3: a node can be killed and restarted while jobs run)",
        )
    demo = sub.choices["demo"]
    demo.add_argument("--dataset", default="synthetic")
    demo.add_argument(
        "--keep-data",
        action="store_true",
        help="reuse the data dir instead of starting from an empty one",
    )
    demo.add_argument("--timeout", type=float, default=1800.0)
    rescore = sub.add_parser("rescore", help="score a predictions file offline")
    rescore.add_argument("--dataset", required=True, help="dataset id, e.g. locomo")
    rescore.add_argument(
        "--datasets-root",
        type=Path,
        default=Path(os.environ.get("AML_DATASETS_ROOT", DEFAULT_DATASETS_ROOT)),
    )
    rescore.add_argument("--predictions", type=Path, required=True, help="JSONL")
    # Neither option: F1 and BLEU-1 only, the judge column shows "-" (not computed).
    verdicts = rescore.add_mutually_exclusive_group()
    verdicts.add_argument("--judge-labels", type=Path, help="JSONL of existing judge labels")
    verdicts.add_argument(
        "--judge",
        action="store_true",
        help="ask the evaluation spec's LLM judge (AML_LLM_* settings)",
    )
    rescore.add_argument(
        "--f1-variant",
        choices=sorted(F1_VARIANTS),
        help="token F1 to report (default: the one the dataset manifest declares)",
    )
    rescore.add_argument(
        "--rows", type=Path, help="write one JSON line per question (per point if streaming) here"
    )
    rescore.add_argument("--json", type=Path, help="write the results document here")
    trace_cmd = sub.add_parser("trace", help="the span tree of one work item")
    trace_cmd.add_argument("item_id", help="an Add request_id or a question item id")
    trace_cmd.add_argument("--data-dir", type=Path, default=Path(".aml") / "demo")
    conformance.add_arguments(
        sub.add_parser("check", help="check a memory system against the participant contract")
    )
    baseline = sub.add_parser("baseline", help="this deployment's release baseline")
    baseline.add_argument(
        "--dataset",
        action="append",
        help="a dataset of the release (repeatable; default: AML_FULL_SUITE, the fixed suite)",
    )
    baseline.add_argument("--datasets-root", type=Path, help="default: AML_DATASETS_ROOT")
    baseline.add_argument(
        "--json", action="store_true", help="print only the JSON for AML_RELEASE_BASELINE"
    )
    baseline.add_argument("--store", type=Path, help="also write that JSON to this file")
    dataset_cli.add_arguments(
        sub.add_parser(
            "dataset",
            help="register and list datasets",
            description=dataset_cli.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        DEFAULT_DATASETS_ROOT,
    )
    team_cli.add_arguments(
        sub.add_parser(
            "team",
            help="a team's client of the gateway API",
            description=team_cli.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "rescore":
        return asyncio.run(_rescore(args))
    if args.command == "check":
        return conformance.main_from_args(args)
    if args.command == "trace":
        return _trace(args.item_id, args.data_dir / "traces")
    if args.command == "baseline":
        return _baseline(args)
    if args.command == "team":
        return team_cli.main_from_args(args)
    if args.command == "dataset":
        return dataset_cli.main_from_args(args)
    coding = False
    if args.command == "demo":
        # The dataset may be named with '-' for '_' (`synthetic-multimodal`).
        args.dataset = dataset_id_of(args.dataset, args.datasets_root)
        refused = demo_dataset_problem(args.dataset, args.datasets_root)
        if refused is not None:
            print(f"aml demo: {refused}", file=sys.stderr)
            return 2
        coding = coding_demo.is_coding(args.dataset, args.datasets_root)
        if coding:
            # Every attempt runs in the sandbox: a machine without it is told before anything
            # starts, in the sandbox's one line, not by 16 failed attempts.
            try:
                require_sandbox()
            except SandboxUnavailable as unavailable:
                print(f"aml demo: {unavailable}", file=sys.stderr)
                return 2
    # The coding track asks no judge, and its agent's model is the stand-in: no llama.cpp.
    stack = EmbeddedStack(
        StackConfig(data_dir=args.data_dir, start_llm=not coding, nats_nodes=args.nats_nodes)
    )
    try:
        # Before anything is deleted or started: a data dir in use by a running stack is
        # refused (a second nats-server on its JetStream store would corrupt it).
        stack.lock()
    except DataDirBusyError as exc:
        print(f"aml {args.command}: {exc}", file=sys.stderr)
        return 1
    # SIGTERM takes the same clean path as Ctrl-C: every child process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if args.command == "demo" and not args.keep_data:
            stack.clear_data()
        print(f"starting the embedded stack in {stack.data_dir} ...", flush=True)
        stack.start_infra()
        agent_model = coding_demo.start_agent_model(stack) if coding else None
        # The stack's own release baseline, so its full runs can pass the publication gate.
        config = PlatformConfig(
            datasets_root=args.datasets_root,
            own_release_baseline=True,
            extra_env=agent_model.env() if agent_model else {},
        )
        platform = start_platform(stack, config)
        print(f"gateway   {platform.gateway_url}  (admin token in {stack.data_dir}/admin.token)")
        print(f"nats      {stack.nats_url}\nmongodb   {stack.mongo_url}")
        if len(stack.nats_nodes) > 1:
            names = ", ".join(node.process for node in stack.nats_nodes)
            print(f"          {len(stack.nats_nodes)} JetStream nodes ({names}), streams at "
                  f"R{stack.stream_replicas}", flush=True)  # fmt: skip
        if agent_model is None:
            print(f"llm       {stack.llm_base_url}", flush=True)
        else:
            print(f"llm       {agent_model.base_url}/v1\n{agent_model.note()}", flush=True)
        if args.command == "up":
            print("running; Ctrl-C stops everything", flush=True)
            while True:
                time.sleep(3600)
        return _demo(platform, stack, args.dataset, args.timeout)
    except KeyboardInterrupt:
        return 130
    finally:
        stack.stop()


def demo_dataset_problem(dataset_id: str, datasets_root: Path) -> str | None:
    """Why `aml demo --dataset` cannot run on `dataset_id` (unknown id, files missing or not
    as the manifest lists them), or None; checked before the stack starts."""
    try:
        registered(dataset_id, datasets_root)
    except KeyError:
        known = ", ".join(known_ids(datasets_root))
        return f"unknown dataset {dataset_id!r}; valid ids: {known}"
    except (OSError, ValueError) as exc:
        return f"dataset {dataset_id!r}: unreadable manifest: {exc}"
    try:
        open_dataset(dataset_id, datasets_root)
    except (DatasetFileError, OSError) as exc:
        return f"dataset {dataset_id!r} is not available: {exc} (--datasets-root {datasets_root})"
    return None


def _demo(platform: Any, stack: EmbeddedStack, dataset: str, timeout: float) -> int:
    memory = start_memory_server(stack)
    # A job runs the datasets of one track, on a version registered for it.
    track = registered(dataset, Path(platform.env["AML_DATASETS_ROOT"])).manifest.track
    version_id, api_key = register_memory_server(platform, memory, team="demo-team", track=track)
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
        submitted = api.post(
            "/v1/jobs",
            json={
                "version_id": version_id,
                "mode": "smoke",
                "run_label": f"demo-{int(time.time())}",
                "datasets": [dataset],
                "track": track,
            },
        )
        if submitted.status_code != 201:
            print(f"aml demo: the job was refused: {submitted.text}", file=sys.stderr)
            return 1
        job_id = submitted.json()["job_id"]
        print(f"job {job_id} submitted ({dataset}); progress:", flush=True)
        status = _follow(api, job_id, timeout)
        if status["state"] != "completed":
            print(f"\njob {job_id} ended {status['state']}:")
            for error in status["errors"]:
                print(f"  [{error['stage']}/{error['kind']}] {error['item']}: {error['reason']}")
            return 1
        results = api.get(f"/v1/jobs/{job_id}/results").json()
        first = api.get(f"/v1/jobs/{job_id}/audit", params={"stage": "add", "limit": 1}).json()
    print()
    numbers = category_numbers(results["datasets"], Path(platform.env["AML_DATASETS_ROOT"]))
    print(render_results(results, numbers))
    print("\n" + render_efficiency(results.get("efficiency")))
    if track == "coding":
        print(f"\n{coding_demo.closing_note(platform.env)}")
    else:
        print(
            f"\nthe answers and verdicts come from {platform.env['AML_JUDGE_MODEL']}, the local "
            "stand-in for the deployment's models: a small model that often gives no readable "
            "verdict; the figures show the pipeline at work, not a memory system's quality"
        )
    for record in first["records"]:
        print(f"\nfollow one request: aml trace {record['item_id']} --data-dir {stack.data_dir}")
    return 0


def _baseline(args: argparse.Namespace) -> int:
    # The scheduler computes what every job records; the gateway's fixed suite is what a
    # publishable (full) run evaluates. Imported here: only this command needs the services.
    from aml_gateway.settings import GatewaySettings
    from aml_scheduler.baseline import release_baseline
    from aml_scheduler.baseline import render as render_baseline
    from aml_scheduler.settings import SchedulerSettings

    settings = SchedulerSettings()
    if args.datasets_root is not None:
        settings = settings.model_copy(update={"datasets_root": args.datasets_root})
    datasets = args.dataset or GatewaySettings().full_suite
    try:
        baseline = release_baseline(settings, datasets)
    except (OSError, ValueError, KeyError) as exc:
        print(f"aml baseline: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    document = baseline.release.model_dump_json()
    if args.store is not None:
        args.store.write_text(document + "\n", encoding="utf-8")
    if args.json:
        print(document)
    else:
        print(render_baseline(baseline))
        print(f"\nAML_RELEASE_BASELINE='{document}'")
    return 0


def _trace(item_id: str, trace_dir: Path) -> int:
    if not trace_dir.is_dir():
        print(f"aml trace: no span files in {trace_dir}", file=sys.stderr)
        return 2
    found = tracefiles.traces_of(tracefiles.read_spans(trace_dir), item_id)
    if not found:
        print(f"aml trace: no trace of {item_id} in {trace_dir}", file=sys.stderr)
        return 1
    for trace_id, spans in found.items():
        print("\n".join(tracefiles.render_tree(trace_id, spans)))
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


async def _rescore(args: argparse.Namespace) -> int:
    try:
        manifest, dataset = open_dataset(args.dataset, args.datasets_root)
        # BLEU-1's tokenizer model: refuse before reading anything else when it is missing.
        require_punkt_tab()
    except (KeyError, DatasetFileError, OSError, PunktDataError) as exc:
        print(f"aml rescore: {exc}", file=sys.stderr)
        return 2
    variant = args.f1_variant or dataset.f1_variant
    known = rescore.asked_items(dataset)
    # A dataset no judge grades (token F1 alone, multiple choice) is scored without one, as a
    # job scores it, even when --judge asks for one.
    ask_judge = args.judge and rescore.judge_asked(dataset)
    settings = LLMSettings() if ask_judge else EvaluationSettings()
    # A coding dataset's predictions are patches, verified in the sandbox (no LLM).
    coding = dataset.scorer == CODING_SCORER
    verify_attempt = None
    if coding:
        try:
            require_sandbox()
        except SandboxUnavailable as unavailable:
            print(f"aml rescore: {unavailable}", file=sys.stderr)
            return 2
        verify_attempt = rescore.sandbox_verifier(
            dataset.dataset_id,
            registered_tasks(args.datasets_root),
            verify_limits(settings.coding_test_timeout_seconds),
        )
    llm = None
    try:
        predictions = rescore.read_predictions(args.predictions, known)
        labels = rescore.read_labels(args.judge_labels, known) if args.judge_labels else None
        judge = None
        source = rescore.JudgeSource(kind="none")
        if labels is not None:
            source = rescore.JudgeSource(
                kind="labels",
                labels_file=str(args.judge_labels),
                labels_sha256=rescore.file_sha256(args.judge_labels),
                questions_labelled=len(labels),
            )
        if isinstance(settings, LLMSettings):
            llm = make_llm_client(settings)
            client, model, max_tokens = llm, settings.judge_model, settings.judge_max_tokens

            async def call(text: str) -> ChatReply:
                return await complete_reply(client, model, text, max_tokens)

            async def atm_call(text: str) -> ChatReply:
                # ATM-Bench's judge writes its reasoning before the verdict: its own budget.
                return await complete_reply(client, model, text, ATM_JUDGE_MAX_TOKENS)

            prompt = load_prompt(settings.judge_prompt)
            abstention = load_prompt(settings.judge_abstention_prompt)
            judge = rescore.llm_judge(
                call,
                prompt,
                abstention,
                settings.judge_runs,
                settings.judge_retries,
                atm_call=atm_call,
            )
            source = rescore.JudgeSource(
                kind="llm",
                model=model,
                prompt=f"{prompt.name}@{prompt.sha256}",
                abstention_prompt=f"{abstention.name}@{abstention.sha256}",
            )
        rows = await rescore.score_questions(
            dataset, predictions, labels, judge, variant, verify_attempt
        )
    except (rescore.RescoreInputError, OSError) as exc:
        print(f"aml rescore: {exc}", file=sys.stderr)
        return 2
    finally:
        if llm is not None:
            await llm.close()
    results = rescore.results_of(dataset, rows, variant, manifest=manifest)
    bundle = bundle_hash(manifest)
    spec_hash = build_evaluation_spec(settings, coding=coding).content_hash
    origin = rescore.provenance(dataset, bundle, spec_hash, args.predictions, variant, source)
    print(f"dataset {dataset.dataset_id} bundle {bundle}; evaluation spec {origin.spec_hash}")
    judged_by = {
        "labels": f"labels from {args.judge_labels}",
        "llm": f"LLM {settings.judge_model}",
        "none": (
            "not asked (no question of this dataset is judged)"
            if args.judge
            else "not computed (no --judge-labels or --judge)"
        ),
    }[source.kind]
    print(f"F1 variant {variant}; BLEU-1 {BLEU_VERSION}; judge: {judged_by}")
    numbers = {dataset.dataset_id: {name: n for n, name in dataset.categories.items()}}
    print(render_results(results.model_dump(mode="json"), numbers))
    print("\n".join(rescore.efficiency_lines(rows)))
    if args.rows:
        args.rows.write_text("".join(row.model_dump_json() + "\n" for row in rows))
    if args.json:
        document = rescore.results_document(results, origin)
        args.json.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
