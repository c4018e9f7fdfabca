"""`aml team`: a team's client of the gateway API, from the terminal.

    aml team request --file request.json        an Evaluation Access Request (or flags)
    aml team request-status ID --token T        follow it; the first read after approval
                                                 shows the new Leaderboard API Key, once
    aml team versions | datasets                what the key may submit, and on which data
    aml team submit VERSION_ID --mode smoke|full [--dataset D] [checklist flags] [--watch]
    aml team watch JOB_ID                       progress bars per stage until the job ends,
                                                 then the results table or the error summary
    aml team results JOB_ID | errors JOB_ID | audit JOB_ID [--page N]

The gateway is `AML_API_URL` and the key `AML_API_KEY` (`--api-url`, `--api-key` override them;
prefer the environment, since command lines are visible to other local users). The key is sent
only as the Bearer token and never printed. An API refusal is one line on stderr: the HTTP
status and the API's reason. Exit codes: 0 done (a watched job completed), 1 a watched job
failed, 2 the request could not be made or was refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx

from aml_contract.api.jobs import FullRunChecklist
from aml_contract.api.vocabulary import STAGES
from aml_devtools.tables import category_numbers, render_efficiency, render_results, render_table

DEFAULT_API_URL = "http://127.0.0.1:8000"
API_URL_ENV = "AML_API_URL"
API_KEY_ENV = "AML_API_KEY"
REQUEST_TOKEN_ENV = "AML_REQUEST_TOKEN"
MEMORY_KEY_ENV = "AML_MEMORY_KEY"
BAR_WIDTH = 30
# Off a terminal, a running stage's bars are printed again at most this often (seconds).
LOG_EVERY = 30.0
FINAL_STATES = ("completed", "failed")
# Exit codes.
OK, JOB_FAILED, REFUSED = 0, 1, 2
# An empty listing says so: a bare header would read as a failed request.
NO_ROWS = "(none)"

# `--smoke-passed` etc.: one flag per checklist item, named after the contract's fields.
CHECKLIST_ITEMS = tuple(FullRunChecklist.model_fields)


class ApiError(Exception):
    """A request that failed: its one-line explanation."""


class Api:
    """The gateway API over httpx: JSON in and out, every failure an `ApiError`."""

    def __init__(self, base_url: str, key: str | None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = key
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        token: str | None = None,
        auth: bool = True,
    ) -> Any:
        """`token` replaces the key for this call (a request token); `auth=False` sends no
        credentials at all (public endpoints)."""
        credential = token if token is not None else (self._key if auth else None)
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        try:
            response = self._client.request(method, path, json=body, params=params, headers=headers)
        except httpx.HTTPError as error:
            # httpx names the URL, never the headers: the key cannot appear here.
            raise ApiError(f"cannot reach {self.base_url}: {error}") from None
        if response.status_code >= 400:
            raise ApiError(f"HTTP {response.status_code}: {_reason(response)}")
        try:
            return response.json()
        except ValueError:
            raise ApiError(f"HTTP {response.status_code}: the answer is not JSON") from None

    def need_key(self) -> None:
        if not self._key:
            raise ApiError(f"no Leaderboard API Key: set {API_KEY_ENV} (or pass --api-key)")


def _reason(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.reason_phrase or "no reason given"
    if isinstance(detail, dict) and "reason" in detail:
        reason = str(detail["reason"])
        if detail.get("next_allowed_at"):
            reason += f" (next allowed at {detail['next_allowed_at']})"
        return reason
    return str(detail) if detail else (response.reason_phrase or "no reason given")


# --- arguments ---------------------------------------------------------------------------------


def add_arguments(team: argparse.ArgumentParser) -> None:
    """The `team` subcommands, on the parser `aml_devtools.cli` gives them."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api-url", help=f"the gateway (default: ${API_URL_ENV}, else {DEFAULT_API_URL})"
    )
    common.add_argument(
        "--api-key", help=f"the Leaderboard API Key (default: ${API_KEY_ENV}; prefer the variable)"
    )
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    sub = team.add_subparsers(dest="team_command", required=True)

    request = sub.add_parser("request", parents=[common], help="submit an access request")
    request.add_argument("--file", type=Path, help="the request as JSON; flags below override it")
    request.add_argument("--kind", choices=("new_key", "add_version"))
    request.add_argument("--name", help="contact name")
    request.add_argument("--email", help="contact email")
    request.add_argument("--organisation", help="contact organisation")
    request.add_argument("--system-name")
    request.add_argument("--version-label")
    request.add_argument("--track", action="append", choices=("textual", "multimodal", "coding"))
    request.add_argument("--board", choices=("academic", "industrial"))
    request.add_argument("--add-url")
    request.add_argument("--search-url")
    request.add_argument("--health-url")
    request.add_argument("--status-url", help="Add-status URL template containing {task_id}")
    request.add_argument("--auth-method", choices=("token", "bearer", "x-api-key", "none"))
    request.add_argument(
        "--memory-key-env",
        default=MEMORY_KEY_ENV,
        help="the variable holding the Memory System Key (default: %(default)s)",
    )
    request.add_argument("--max-concurrency", type=int)
    request.add_argument("--max-rps", type=float)
    request.add_argument("--repository-url")
    request.add_argument("--token-file", type=Path, help="also write the request token here")

    status = sub.add_parser("request-status", parents=[common], help="an access request's state")
    status.add_argument("request_id")
    status.add_argument(
        "--token", help=f"the request token (default: ${REQUEST_TOKEN_ENV}; else the API key)"
    )
    status.add_argument(
        "--key-file", type=Path, help="write a delivered Leaderboard API Key here, not to stdout"
    )

    sub.add_parser("versions", parents=[common], help="the versions bound to the key")
    sub.add_parser("datasets", parents=[common], help="the datasets jobs may run")

    submit = sub.add_parser("submit", parents=[common], help="start a smoke or full run")
    submit.add_argument("version_id")
    submit.add_argument("--mode", choices=("smoke", "full"), default="smoke")
    submit.add_argument("--track", choices=("textual", "multimodal", "coding"), default="textual")
    submit.add_argument("--run-label", help="unique per key (default: <mode>-<UTC time>)")
    submit.add_argument(
        "--dataset", action="append", help="smoke only, repeatable (default: the smoke sample)"
    )
    checklist = submit.add_argument_group("full-run checklist (every item is required)")
    for item in CHECKLIST_ITEMS:
        checklist.add_argument(f"--{item.replace('_', '-')}", action="store_true", dest=item)
    submit.add_argument("--watch", action="store_true", help="then follow it as `watch` does")
    _watch_options(submit)

    watch = sub.add_parser("watch", parents=[common], help="follow a job until it ends")
    watch.add_argument("job_id")
    _watch_options(watch)

    for name, helptext in (("results", "a job's results table"), ("errors", "a job's errors")):
        sub.add_parser(name, parents=[common], help=helptext).add_argument("job_id")

    audit = sub.add_parser("audit", parents=[common], help="a job's audit records, by page")
    audit.add_argument("job_id")
    audit.add_argument("--page", type=int, default=1, help="1 is the oldest records")
    audit.add_argument("--limit", type=int, default=50, help="records per page (at most 500)")
    audit.add_argument("--stage", choices=("add", "search"))
    audit.add_argument(
        "--item-id", "--request-id", help="one work item: an Add's request_id or a question id"
    )


def _watch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    parser.add_argument(
        "--max-wait", type=float, default=None, help="give up after this many seconds"
    )


def main_from_args(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    key = args.api_key or os.environ.get(API_KEY_ENV) or None
    url = args.api_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    api = Api(url, key, args.timeout)
    try:
        return COMMANDS[args.team_command](api, args, out)
    except ApiError as error:
        print(f"aml team {args.team_command}: {error}", file=sys.stderr)
        return REFUSED
    finally:
        api.close()


# --- commands ----------------------------------------------------------------------------------


def _request(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    body = access_request_body(args)
    token: str | None = None
    if body.get("kind") == "add_version":
        api.need_key()
        created = api.call("POST", "/v1/access-requests", body=body)
    else:
        created = api.call("POST", "/v1/access-requests", body=body, auth=False)
        token = created.get("request_token")
    print(f"access request {created['id']} ({created['kind']}): {created['state']}", file=out)
    health = "ok" if created["health_check"]["ok"] else "NOT healthy (recorded for the reviewer)"
    print(f"health check: {health}", file=out)
    for warning in created.get("warnings", []):
        print(f"warning: {warning}", file=out)
    if token:
        if args.token_file is not None:
            _write_private(args.token_file, token)
            print(f"request token written to {args.token_file}", file=out)
        print(f"request token (shown once; keep it): {token}", file=out)
        print(
            f"follow it: {REQUEST_TOKEN_ENV}=<token> aml team request-status {created['id']}",
            file=out,
        )
    return OK


def access_request_body(args: argparse.Namespace) -> dict[str, Any]:
    """The request from `--file`, with every given flag replacing its field."""
    body: dict[str, Any] = {}
    if args.file is not None:
        try:
            loaded = json.loads(args.file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ApiError(f"cannot read {args.file}: {error}") from None
        if not isinstance(loaded, dict):
            raise ApiError(f"{args.file}: an access request is a JSON object")
        body = loaded
    body.setdefault("kind", "new_key")
    contact = dict(body.get("contact") or {})
    for field in ("name", "email", "organisation"):
        if getattr(args, field) is not None:
            contact[field] = getattr(args, field)
    if contact:
        body["contact"] = contact
    flags = {
        "kind": args.kind,
        "system_name": args.system_name,
        "version_label": args.version_label,
        "tracks": args.track,
        "board": args.board,
        "add_url": args.add_url,
        "search_url": args.search_url,
        "health_url": args.health_url,
        "add_status_url_template": args.status_url,
        "auth_method": args.auth_method,
        "repository_url": args.repository_url,
    }
    body.update({name: value for name, value in flags.items() if value is not None})
    capacity = dict(body.get("capacity") or {})
    if args.max_concurrency is not None:
        capacity["max_concurrency"] = args.max_concurrency
    if args.max_rps is not None:
        capacity["max_rps"] = args.max_rps
    if capacity:
        body["capacity"] = capacity
    # The Memory System Key from the environment, never from the command line.
    secret = os.environ.get(args.memory_key_env)
    if secret and body.get("auth_method") != "none":
        body["memory_system_key"] = secret
    return body


def _request_status(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    token = args.token or os.environ.get(REQUEST_TOKEN_ENV) or None
    if token is None:
        api.need_key()
    found = api.call("GET", f"/v1/access-requests/{args.request_id}", token=token)
    print(f"access request {found['id']} ({found['kind']}): {found['state']}", file=out)
    print(
        f"system {found['system_name']} {found['version_label']}  board {found['board']}", file=out
    )
    if found.get("decided_at"):
        print(f"decided at {found['decided_at']}", file=out)
    if found.get("reason"):
        print(f"reason: {found['reason']}", file=out)
    if found.get("version_id"):
        print(f"version {found['version_id']}  team {found['team_id']}", file=out)
    new_key = found.get("leaderboard_api_key")
    if new_key:
        if args.key_file is not None:
            _write_private(args.key_file, new_key)
            print(f"your Leaderboard API Key was written to {args.key_file}", file=out)
        else:
            print(f"your Leaderboard API Key (shown once; keep it): {new_key}", file=out)
        print(f"use it: export {API_KEY_ENV}=<key>; it will not be shown again", file=out)
    elif found.get("key_delivery") == "delivered":
        print("the Leaderboard API Key was delivered on an earlier read", file=out)
    elif found.get("key_delivery") == "held":
        print("the Leaderboard API Key waits for a read with the request token", file=out)
    return OK


def _versions(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    api.need_key()
    versions = api.call("GET", "/v1/versions")
    rows = [
        [
            v["version_id"],
            v["system_name"],
            v["version_label"],
            ",".join(v["tracks"]),
            v["board"],
            v["auth_method"],
        ]
        for v in versions
    ]
    header = ["version", "system", "label", "tracks", "board", "auth"]
    print(render_table(header, rows, empty=NO_ROWS), file=out)
    return OK


def _datasets(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    datasets = api.call("GET", "/v1/datasets", auth=False)
    rows = []
    for d in datasets:
        uses = ["smoke (default)"] if d["smoke_default"] else ["smoke"] if d["smoke"] else []
        uses += ["full suite"] if d["full_suite"] else []
        # Registered by the operator but not configured for runs yet.
        uses = uses if d.get("runnable", True) else ["not runnable"]
        categories = ", ".join(
            f"{c['number']} {c['name']}"
            + ("" if c["questions"] is None else f" ({c['questions']})")
            + ("" if c["in_overall"] else " *")
            for c in d["categories"]
        )
        questions = "?" if d["questions"] is None else str(d["questions"])
        rows.append([d["dataset_id"], d["track"], questions, "; ".join(uses), categories])
    header = ["dataset", "track", "questions", "runs", "categories"]
    print(render_table(header, rows, empty=NO_ROWS), file=out)
    print("* reported apart, not counted in Overall; ? the gateway cannot count it", file=out)
    return OK


def _submit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    api.need_key()
    label = args.run_label or f"{args.mode}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    body: dict[str, Any] = {
        "version_id": args.version_id,
        "mode": args.mode,
        "track": args.track,
        "run_label": label,
    }
    if args.dataset:
        body["datasets"] = args.dataset
    ticked = {item: getattr(args, item) for item in CHECKLIST_ITEMS}
    if args.mode == "full" or any(ticked.values()):
        body["checklist"] = ticked
    job = api.call("POST", "/v1/jobs", body=body)
    print(
        f"job {job['job_id']} submitted: {job['mode']} run {job['run_label']!r} of "
        f"{job['version_id']} on track {job['track']}: {', '.join(job['datasets'])} "
        f"({job['state']})",
        file=out,
    )
    if not args.watch:
        print(f"follow it: aml team watch {job['job_id']}", file=out)
        return OK
    return watch(api, job["job_id"], out, args.interval, args.max_wait)


def _watch(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    api.need_key()
    return watch(api, args.job_id, out, args.interval, args.max_wait)


def watch(
    api: Api,
    job_id: str,
    out: TextIO,
    interval: float = 2.0,
    max_wait: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll the job and draw its stages until it ends, then print the results or the errors.
    On a terminal the bars are redrawn in place at every poll; elsewhere (logs, pipes) a new
    block is printed when the state or the current stage changes, and otherwise at most every
    `LOG_EVERY` seconds while the counts move."""
    deadline = None if max_wait is None else time.monotonic() + max_wait
    in_place = out.isatty()
    drawn: list[str] = []
    shown: tuple[Any, ...] = ()
    printed_at = 0.0
    while True:
        status = api.call("GET", f"/v1/jobs/{job_id}")
        lines = progress_lines(status)
        phase = (status["state"], status.get("stage"))
        moment = time.monotonic()
        if in_place:
            if drawn:
                out.write(f"\x1b[{len(drawn)}F\x1b[J")
            draw = True
        else:
            # The first line carries the elapsed time: it alone is no change.
            changed = (*phase, *lines[1:]) != shown
            draw = changed and (phase != shown[:2] or moment - printed_at >= LOG_EVERY)
        if draw:
            out.write("\n".join(lines) + "\n")
            out.flush()
            drawn, shown, printed_at = lines, (*phase, *lines[1:]), moment
        if status["state"] in FINAL_STATES:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise ApiError(f"job {job_id} is still {status['state']} after {max_wait:g}s")
        sleep(interval)
    print(file=out)
    if status["state"] == "completed":
        print_results(api, job_id, out, status)
        if status["errors"]:
            print(file=out)
            print_errors(status, out)
        return OK
    print_errors(status, out)
    return JOB_FAILED


def state_words(status: dict[str, Any]) -> str:
    """The state as the API words it: not a plain `completed` when the platform failed items
    of the run (`completed — not publishable: …; not charged`); the bare state from a gateway
    that does not word it."""
    return str(status.get("state_summary") or status["state"])


def progress_lines(status: dict[str, Any]) -> list[str]:
    stage = f"  stage {status['stage']}" if status.get("stage") else ""
    lines = [
        f"job {status['job_id']} {state_words(status)}{stage}  "
        f"elapsed {_duration(status['elapsed_seconds'])}"
    ]
    # An outage the job waits out: said before the bars, which do not move meanwhile.
    lines += [str(pause["message"]) for pause in status.get("paused") or ()]
    for name in STAGES:
        progress = status["stages"].get(name)
        if progress is not None:
            lines.append(
                progress_bar(name, progress["total"], progress["done"], progress["failed"])
            )
    return lines


def progress_bar(stage: str, total: int, done: int, failed: int) -> str:
    """`search    [######==....]   12/40  30.0%  2 failed`: `#` done, `!` failed."""
    if total <= 0:
        return f"{stage:<10}[{'.' * BAR_WIDTH}]      not planned yet"
    filled = min(BAR_WIDTH, round(BAR_WIDTH * done / total))
    broken = min(BAR_WIDTH - filled, round(BAR_WIDTH * failed / total))
    if failed and not broken and filled < BAR_WIDTH:
        broken = 1  # a failure always shows
    bar = "#" * filled + "!" * broken + "." * (BAR_WIDTH - filled - broken)
    ended = done + failed
    line = f"{stage:<10}[{bar}] {ended:>{len(str(total))}}/{total}  {100 * ended / total:5.1f}%"
    return line + (f"  {failed} failed" if failed else "")


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def print_results(api: Api, job_id: str, out: TextIO, status: dict[str, Any] | None = None) -> None:
    """The results table, after a line saying why the run is not publishable when the
    platform failed items of it (the numbers are then incomplete, through no fault of the
    team's), then the efficiency table."""
    status = status or api.call("GET", f"/v1/jobs/{job_id}")
    if state_words(status) != status["state"]:
        print(f"job {job_id} {state_words(status)}", file=out)
    results = api.call("GET", f"/v1/jobs/{job_id}/results")
    print(render_results(results, category_numbers(results["datasets"])), file=out)
    # What the numbers cost, after them (latency, retrieved context, the platform's model use).
    print("\n" + render_efficiency(results.get("efficiency")), file=out)


def print_errors(status: dict[str, Any], out: TextIO) -> None:
    """The error summary: the job's failure, counts by stage and kind, then each error."""
    if status["state"] == "failed":
        print(f"job {status['job_id']} {state_words(status)}", file=out)
    errors = status["errors"]
    if not errors:
        print("no errors recorded", file=out)
        return
    counts = Counter((e["stage"], e["kind"]) for e in errors)
    print(f"errors ({len(errors)} shown, the first 100 at most):", file=out)
    for (stage, kind), count in sorted(counts.items()):
        print(f"  {stage:<10}{kind:<28}{count:>6}", file=out)
    for error in errors:
        item = f" {error['item']}" if error.get("item") else ""
        print(f"  [{error['stage']}/{error['kind']}]{item}: {error['reason']}", file=out)


def _results(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    api.need_key()
    print_results(api, args.job_id, out)
    return OK


def _errors(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    api.need_key()
    status = api.call("GET", f"/v1/jobs/{args.job_id}")
    print(f"job {status['job_id']} {state_words(status)}", file=out)
    print_errors(status, out)
    return OK


def _audit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Page N follows the API's cursors from the oldest record (N-1 reads before it)."""
    api.need_key()
    if args.page < 1:
        raise ApiError("--page starts at 1")
    params: dict[str, Any] = {"limit": args.limit}
    if args.stage:
        params["stage"] = args.stage
    if args.item_id:
        params["item_id"] = args.item_id
    page: dict[str, Any] = {"records": [], "next_cursor": None}
    for number in range(1, args.page + 1):
        page = api.call("GET", f"/v1/jobs/{args.job_id}/audit", params=params)
        if number < args.page:
            if page["next_cursor"] is None:
                raise ApiError(f"job {args.job_id} has only {number} audit page(s)")
            params["cursor"] = page["next_cursor"]
    rows = [
        [
            r["started_at"],
            r["stage"],
            r["operation"],
            r["item_id"],
            f"{r['delivery']}.{r['attempt']}",
            "-" if r["status"] is None else str(r["status"]),
            f"{r['latency_ms']:.0f}",
            r["outcome"],
            r.get("validation") or r.get("error_class") or "",
        ]
        for r in page["records"]
    ]
    header = ["started", "stage", "op", "item", "try", "http", "ms", "outcome", "detail"]
    print(f"job {args.job_id} audit, page {args.page} ({len(rows)} records)", file=out)
    print(render_table(header, rows, empty=NO_ROWS), file=out)
    if page["next_cursor"]:
        print(f"more: aml team audit {args.job_id} --page {args.page + 1}", file=out)
    return OK


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, TextIO], int]] = {
    "request": _request,
    "request-status": _request_status,
    "versions": _versions,
    "datasets": _datasets,
    "submit": _submit,
    "watch": _watch,
    "results": _results,
    "errors": _errors,
    "audit": _audit,
}


# --- helpers -----------------------------------------------------------------------------------


def _write_private(path: Path, secret: str) -> None:
    """Readable by its owner only, created so from the start."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(secret + "\n")
