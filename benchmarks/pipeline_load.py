"""Pipeline load benchmark: whole smoke jobs through every service on the embedded stack, against
scripted participants and an LLM stand-in with declared limits. Prints figures measured in this
run (ratios, not timed assertions) and writes them as JSON; see docs/performance.md.

    .venv/bin/python benchmarks/pipeline_load.py [--scenario solo|repeat|teams|all|scale|saturated]
        [--dataset locomo] [--quick] [--json out.json] [--data-dir .aml/bench] [--timeout S]
        [--sizes ADDS/QUESTIONS/USERS,...] [--mongo-url URL] [--record | --no-record]

The stack: nats-server and nx-27017 (no llama.cpp), the LLM stand-in (aml_llm_standin: 0.5 s per
completion, 8 at once, 429 beyond), the gateway and every worker, and one participant simulator
per team (Add 0.3 s, Search 0.1 s, 429 beyond 4 at once), each team's version registered with
the declared capacity max_concurrency 4, max_rps 10. Every service uses the stand-in
(AML_LLM_BASE_URL), AML_LLM_CONCURRENCY=8 and AML_TOKEN_COUNTER=estimate. `--mongo-url` runs the
services against that MongoDB (a fresh database in it) instead of starting nx-27017; the
database's CPU is then not measured.

Scenarios (run in this order on one stack; `--scenario teams` runs the last two):
- solo:        one team's smoke job on the dataset;
- repeat:      the same team's job again (new job, same data dir): time relative to the first;
- teams-alone: three teams' jobs at once;
- teams:       the same three at once plus a fourth whose version declares max_rps=0.001 (its
               job is submitted too and never waited for): each team's time against its time
               in teams-alone (the three share one LLM budget, so solo is no reference).

Per scenario: wall time; the lower bound from the observed call counts and the declared limits
(max of: participant requests / max_rps, sum of participant latencies / max_concurrency, LLM
calls x latency / LLM capacity, the longest user's Add chain x Add latency) and the ratio; CPU ms
per question of each process (its process group, from /proc; the services' start-up is in no
scenario: the first one begins once every service is quiet) and of broker + database; peak
RSS; per participant and for the LLM the most requests at once and in any 1 s window, 429s, and
duplicate participant calls. `--quick` runs the shipped synthetic dataset (a check that the
benchmark works, in a few minutes; its figures are dominated by fixed costs). `--db-ops` also
counts every service's database commands per question, by collection and command
(`benchmarks/db_ops/sitecustomize.py`: a pymongo command listener in every process; the CPU
figures of such a run include the listener's own cost, so compare them only with runs that
counted too).

`--scenario scale` (its own stack: the platform's own cost per item as one job grows, issue 30)
runs `scale`, then `saturated`; `--scenario saturated` runs the second alone. The participant
simulator answers in 10 ms (Add and Search), 16 at once (declared max_concurrency 16, max_rps
1000), the stand-in in 20 ms, 32 at once (AML_LLM_CONCURRENCY=32), AML_WORKER_CONCURRENCY is the
services' default (256), so the platform's own cost dominates and only declared capacities bind.
- scale:     per `--sizes` entry (default 2000/2000/20,10000/4000/40,50000/10000/100), smallest
             first, a LoCoMo-format dataset is generated (deterministic; one Add per session of
             14 turns, questions of categories 1-4 with evidence) under <data-dir>/datasets,
             registered with `aml dataset add` and named in AML_SMOKE_DATASETS, and one smoke
             job is run on it. Per size: wall, plan (created -> first Add at the participant),
             Add phase (first -> last Add arrival), Adds/s and questions/s; CPU ms of services,
             nats and the database per Add (Add phase), per question (last Add -> end) and per
             item (submission -> end), CPU sampled every second, and each one's ratio to the
             smallest size's; the chain gap (the participant's answer to a user's Add k -> that
             user's Add k + 1 arriving: p50/p90); the first conversation written and the LLM's
             busy share and mean in flight from then to the job's end (from the stand-in's
             /stats/intervals); peak RSS of each process during the job; the database's size
             and growth per item; wall / lower bound.
- saturated: a second participant declaring max_concurrency 1, 80 ms per call, one job on a
             generated 200/200/10 dataset: the participant's busy part (first arrival -> last
             answer) against the sum of its service times, and the gap from each answer to the
             next request's arrival while work was due (p50/p90).

The run stops by itself (--timeout, default 3600 s, 900 s with --quick, 14400 s for scale) and
stops every process it started, also on Ctrl-C, SIGTERM or an error.

Each run also writes its figures, with its command line, as a dated record under
benchmarks/results/ (`<UTC minute>-<scenario>-<commit>.json`; see the README there), except with
`--no-record`, with `--quick` unless `--record` is given (a quick run checks the benchmark, not
the platform), and when interrupted (Ctrl-C, SIGTERM).

This script holds the command line and the run's course; the benchmark's parts are the package
beside it, benchmarks/loadbench/ (harness, sampling, figures, datasets, scenarios, scale, report).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadbench.datasets import (
    DEFAULT_SIZES,
    SATURATED_SIZE,
    SCALE_SEED,
    TURNS_PER_SESSION,
    Size,
    parse_sizes,
    register_scale_datasets,
)
from loadbench.harness import (
    LLM_CONCURRENCY,
    LLM_LATENCY,
    LOAD_PROFILE,
    ROOT,
    SATURATED_PROFILE,
    SCALE_LLM_CONCURRENCY,
    SCALE_LLM_LATENCY,
    SCALE_PROFILE,
    SCALE_WORKER_CONCURRENCY,
    SLOW_TEAM,
    Bench,
    BenchmarkTimeout,
    count_db_ops,
    platform_config,
    start_standin,
    wait_until_started,
)
from loadbench.report import current_commit, record, report_run
from loadbench.scale import scenario_saturated, scenario_scale
from loadbench.scenarios import (
    scenario_repeat,
    scenario_solo,
    scenario_teams,
    scenario_teams_alone,
)

from aml_devtools.platform import Platform, start_platform
from aml_devtools.stack import EmbeddedStack, StackConfig

DEFAULT_DATASETS_ROOT = ROOT.parent / "shared" / "datasets"

SCENARIOS = {"solo": ("solo",), "repeat": ("solo", "repeat"),
             "teams": ("teams-alone", "teams"),
             "all": ("solo", "repeat", "teams-alone", "teams"),
             "scale": ("scale", "saturated"), "saturated": ("saturated",)}  # fmt: skip
# Scenarios on generated datasets, with the fast participant and LLM (never mixed with the rest:
# the stand-in's latency and capacity are the stack's).
SCALE_SCENARIOS = ("scale", "saturated")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="all")
    parser.add_argument("--dataset", default="locomo")
    parser.add_argument("--quick", action="store_true", help="the synthetic dataset instead")
    parser.add_argument(
        "--datasets-root",
        type=Path,
        default=Path(os.environ.get("AML_DATASETS_ROOT", DEFAULT_DATASETS_ROOT)),
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT / ".aml" / "bench")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--timeout", type=float, help="seconds (default 3600, 900 with --quick, 14400 for scale)"
    )
    parser.add_argument(
        "--db-ops", action="store_true", help="also count database commands per question"
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help=f"scale: ADDS/QUESTIONS/USERS,... one job each, smallest first ({DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--mongo-url",
        help="run the services against this MongoDB (a fresh database in it) instead of "
        "starting nx-27017; its CPU is then not measured",
    )
    parser.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        help="record the figures under benchmarks/results/ (default: yes; no with --quick)",
    )
    args = parser.parse_args(argv)
    if args.record is None:
        args.record = not args.quick
    if args.quick:
        args.dataset = "synthetic"
    if args.timeout is None:
        args.timeout = 900.0 if args.quick else 3600.0
        args.timeout = 14400.0 if args.scenario == "scale" else args.timeout
    return args


def _raise_timeout(*_: object) -> None:
    raise BenchmarkTimeout("the global --timeout passed")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def database_name(args: argparse.Namespace) -> str:
    """The platform's database: "aml" in the stack's own nx-27017; in an external MongoDB a
    fresh one per run, so that nothing of the operator's is read, changed or counted (it is
    left there afterwards)."""
    return f"aml_bench_{int(time.time())}" if args.mongo_url else "aml"


def scale_sizes(args: argparse.Namespace) -> list[Size]:
    """Every generated dataset the run's scenarios use, each once."""
    names = SCENARIOS[args.scenario]
    sizes = list(args.sizes) if "scale" in names else []
    if "saturated" in names and SATURATED_SIZE not in sizes:
        sizes.append(SATURATED_SIZE)
    return sizes


def start_services(
    args: argparse.Namespace, stack: EmbeddedStack, mongo_db: str
) -> tuple[str, Platform]:
    """The LLM stand-in and the platform for the run's scenarios: the release-like load setup,
    or for scale/saturated the fast stand-in and the generated datasets, registered under the
    data dir's own datasets root (the shared one holds licensed files and is not ours to
    write) and named in AML_SMOKE_DATASETS so that a smoke job may run them."""
    env = {"AML_MONGO_DB": mongo_db}
    if args.scenario not in SCALE_SCENARIOS:
        llm_url = start_standin(stack)
        config = platform_config(args.datasets_root, llm_url, extra_env=env)
        return llm_url, start_platform(stack, config)
    datasets_root = stack.data_dir / "datasets"
    print(f"generating and registering datasets under {datasets_root} ...", flush=True)
    ids = register_scale_datasets(datasets_root, scale_sizes(args))
    env["AML_SMOKE_DATASETS"] = json.dumps(["synthetic", *ids])
    llm_url = start_standin(stack, SCALE_LLM_LATENCY, SCALE_LLM_CONCURRENCY)
    config = platform_config(
        datasets_root, llm_url, SCALE_LLM_CONCURRENCY, SCALE_WORKER_CONCURRENCY, env
    )
    return llm_url, start_platform(stack, config)


def run(args: argparse.Namespace, stack: EmbeddedStack, results: dict[str, Any]) -> None:
    """Run the scenarios in order, each one's figures into `results` as soon as it is done (so
    a timeout still reports the scenarios that finished)."""
    print(f"starting the stack in {stack.data_dir} ...", flush=True)
    db_ops = stack.data_dir / "db-ops" if args.db_ops else None
    if db_ops:
        count_db_ops(db_ops)
    stack.start_infra()
    mongo_db = database_name(args)
    if args.mongo_url:
        print(f"  the platform's database: {mongo_db} in the MongoDB given (not measured)")
    llm_url, platform = start_services(args, stack, mongo_db)
    started = wait_until_started(stack)
    print(f"  started; CPU s each service used to start (in no scenario): {started}", flush=True)
    # The soft deadline leaves time to collect the figures before the hard one (SIGALRM).
    deadline = time.monotonic() + args.timeout - 60
    dataset = "generated" if args.scenario in SCALE_SCENARIOS else args.dataset
    bench = Bench(stack, platform, llm_url, dataset, deadline, db_ops, mongo_db=mongo_db)
    for name in SCENARIOS[args.scenario]:
        if name == "scale":
            scenario_scale(bench, args.sizes, results)
        elif name == "saturated":
            results[name] = scenario_saturated(bench)
        elif name == "solo":
            results[name] = scenario_solo(bench)
        elif name == "repeat":
            results[name] = scenario_repeat(bench, results["solo"])
        elif name == "teams-alone":
            results[name] = scenario_teams_alone(bench)
        else:
            results[name] = scenario_teams(bench, results.get("teams-alone"))


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the run's callees did and declared (the MongoDB URL itself is never written: it
    may hold credentials)."""
    database = "external MongoDB" if args.mongo_url else "nx-27017"
    if args.scenario in SCALE_SCENARIOS:
        return {
            "participant": asdict(SCALE_PROFILE),
            "saturated_participant": asdict(SATURATED_PROFILE),
            "llm": {"latency_s": SCALE_LLM_LATENCY, "capacity": SCALE_LLM_CONCURRENCY},
            "worker_concurrency": SCALE_WORKER_CONCURRENCY,
            "sizes": [size.label for size in args.sizes],
            "saturated_size": SATURATED_SIZE.label,
            "turns_per_session": TURNS_PER_SESSION,
            "seed": SCALE_SEED,
            "database": database,
        }
    return {
        "participant": asdict(LOAD_PROFILE),
        "llm": {"latency_s": LLM_LATENCY, "capacity": LLM_CONCURRENCY},
        "database": database,
    }


def all_completed(results: dict[str, Any]) -> bool:
    return all(
        job["state"] == "completed"
        for figures in results.values()
        for job in figures["jobs"]
        if job["team"] != SLOW_TEAM
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Read at the start: the working tree may change while the benchmark runs.
    commit = current_commit()
    command = shlex.join(["benchmarks/pipeline_load.py", *(sys.argv[1:] if argv is None else argv)])
    if args.data_dir.exists():
        shutil.rmtree(args.data_dir)  # the benchmark's own folder: every run starts empty
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGALRM, _raise_timeout)
    results: dict[str, Any] = {}
    stopped = ""
    config = StackConfig(
        data_dir=args.data_dir,
        start_llm=False,
        start_mongo=args.mongo_url is None,
        mongo_url=args.mongo_url,
    )
    with EmbeddedStack(config) as stack:
        signal.alarm(int(args.timeout))
        try:
            run(args, stack, results)
        except BenchmarkTimeout as exc:
            stopped = f"timeout: {exc}"
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            # Never while the stack is being stopped.
            signal.alarm(0)
    if stopped:
        print(f"\nbenchmark stopped ({stopped}); figures of the finished scenarios follow")
    figures = args.data_dir / "figures.json"
    document = report_run(results, settings(args), commit, stopped, (figures, args.json))
    if args.record and stopped == "interrupted":
        print("not recorded: the run was interrupted")
    elif args.record:
        path = record(document, args.scenario, commit, command)
        print(f"figures recorded in {path.relative_to(ROOT)}")
    if stopped:
        return 2
    return 0 if all_completed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
