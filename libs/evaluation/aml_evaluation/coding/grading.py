"""Grading a coding task's test log with SWE-bench's semantics (SPEC R-2.5).

The verify step applies the agent's patch and the task's hidden test changes in a fresh sandbox,
runs the task's test command, and hands its output here with the task's FAIL_TO_PASS and
PASS_TO_PASS lists. The task is resolved only when every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still passes; a log without any test result is not resolved.

This is the project's own copy of swebench 5.0.2's rules, so the service image does not carry
swebench's dependency tree (docker, modal, datasets, pandas, pyarrow, ...).
`tests/unit/test_coding_grading.py` checks it against swebench's own functions on the same logs.
Each piece names the swebench function it mirrors; unless said otherwise the module is
`swebench.harness.grading`, and the parsers' is `swebench.harness.log_parsers.python`.

A test's status (`TestStatus`) counts as follows (`test_passed`, `test_maintained`,
`test_failed`, `get_eval_tests_report`):

| status in the log       | FAIL_TO_PASS | PASS_TO_PASS |
| ----------------------- | ------------ | ------------ |
| PASSED, XFAIL           | success      | success      |
| SKIPPED                 | failure      | success      |
| FAILED, ERROR           | failure      | failure      |
| absent from the log     | failure      | failure      |
| any other word (see 1.) | failure      | failure      |

When a test appears more than once, its last line counts (the parsers fill a dict in log order),
so pytest's `ERROR ... - teardown error` after the test's `PASSED` line makes it an error.

Where this copy is stricter than swebench 5.0.2, on purpose (each is tested):

1. A pytest line whose first word only starts with a status word (`PASSED:`, `ERRORS`) gives
   its test that word as status, in both (the parsers agree), but here such a test is a
   failure; swebench counts it as neither success nor failure, so it drops out of its list and
   a FAIL_TO_PASS list of only such tests is resolved.
2. A unittest result printed on its own line after the test's output (`test_x (...) ... `,
   output, then `ok`) counts only for a test whose `... ` line carried no result yet, and only
   when the line is exactly `ok`. swebench marks the last `... ` line's test PASSED on any later
   line starting with `ok` (a traceback's `ok = check()` turns a FAIL into a pass).
3. Django's own-suite workarounds in `parse_log_django` (the `--version is equivalent to
   version` line, `django__django-7188`'s migration line, three multi-line regexes) are left
   out; they fit Django's test suite only, and the regexes can take quadratic time.
4. A log without any parsed result is never resolved. swebench's `get_logs_eval` goes on with
   an empty status map when the log matches its `SUITE_RAN` pattern (JavaScript runners'
   summaries), which resolves a task whose lists are empty.
5. An empty FAIL_TO_PASS list is refused (`ValueError`): it is a broken task, which swebench's
   `compute_fail_to_pass` would score 1, so any log would resolve it.
6. A unittest `FAIL:`/`ERROR:` line without a test name is skipped (swebench: `IndexError`).
7. A log over `MAX_LOG_CHARS` characters or `MAX_LOG_LINES` lines is refused, not parsed
   (swebench reads any size).

Each deviation only drops a PASSED result or turns a success into a failure: a listed test that
succeeds here succeeds in swebench too, and `grade` resolves no log that swebench would not. The
cross-check tests this on random logs: for pytest with cut ids too, for unittest for exact ids
and without an exit status. The one exception: where swebench misreads a unittest FAIL as PASSED
(deviation 2) and so finds no failure to explain a non-zero exit status, it refuses a log that
this copy grades.

No start/end markers: swebench's eval script wraps the test command's output in `>>>>> Start
Test Output` / `>>>>> End Test Output` because its log also holds the setup and the patch
steps. The verify step captures the test command's own output (stdout and stderr together, as
one stream, like swebench's `2>&1` log) and its exit status apart, so the whole log is the test
output. `grade` turns "\r\n" and "\r" into "\n" as `get_logs_eval` does by reading the log file
in text mode. A patch that does not apply, or a test command that times out, is the verify step's
outcome (not resolved) and never reaches `grade`. The exit status is passed as `exit_code`
to mirror `get_logs_eval`'s cross-check: a non-zero exit while the log reports no failed or
errored test means the log is not the run's (a patch's conftest can print `PASSED` lines).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate
from typing import Final, Literal, get_args

LogFormat = Literal["pytest", "unittest"]
LOG_FORMATS: Final[tuple[str, ...]] = get_args(LogFormat)
# The rules of this module (swebench 5.0.2's, with the deviations above), recorded with every
# verdict and in the evaluation spec: a change to what any log grades as is a new version.
GRADING_VERSION: Final = "swebench-5.0.2-grading-v1"

# The largest log graded, in characters and in lines. Real -rA / -v logs of a task's selected
# tests are well under a few MB and tens of thousands of lines. The parsers spend C time per
# character and Python time per line, so both are capped: at the caps either parser returns in
# about 0.3 s on a CI machine, and a larger log is refused after one count, never split.
MAX_LOG_CHARS: Final = 16 * 1024 * 1024
MAX_LOG_LINES: Final = 200_000


class TestStatus(StrEnum):
    """A test's outcome as the parsers report it (`swebench.harness.constants.TestStatus`)."""

    FAILED = "FAILED"
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


class ResolvedStatus(StrEnum):
    """`swebench.harness.constants.ResolvedStatus`; only FULL is resolved."""

    NO = "RESOLVED_NO"
    PARTIAL = "RESOLVED_PARTIAL"
    FULL = "RESOLVED_FULL"


class LogTooLargeError(ValueError):
    """The log is over `MAX_LOG_CHARS` or `MAX_LOG_LINES`; it was not parsed."""


@dataclass(frozen=True)
class ListReport:
    """One list's outcome, in the list's order (a test listed twice is counted twice, as
    swebench does)."""

    success: tuple[str, ...]
    failure: tuple[str, ...]


@dataclass(frozen=True)
class Grade:
    resolved: bool
    resolution: ResolvedStatus
    fail_to_pass: ListReport
    pass_to_pass: ListReport
    # Why, for a person: "no test results in the log", "2 of 3 FAIL_TO_PASS tests failed", ...
    reason: str
    # How many distinct test ids the log reported a result for.
    results: int

    def report(self) -> dict[str, dict[str, list[str]]]:
        """The lists in the shape of `get_eval_tests_report`'s FAIL_TO_PASS and PASS_TO_PASS."""
        return {
            "FAIL_TO_PASS": {
                "success": list(self.fail_to_pass.success),
                "failure": list(self.fail_to_pass.failure),
            },
            "PASS_TO_PASS": {
                "success": list(self.pass_to_pass.success),
                "failure": list(self.pass_to_pass.failure),
            },
        }


_STATUS_OF_WORD: Final = {status.value: status for status in TestStatus}
_STATUS_WORDS: Final = tuple(_STATUS_OF_WORD)
# `test_passed`'s statuses.
_PASSING: Final = frozenset({TestStatus.PASSED, TestStatus.XFAIL})
# `_SKIP_SUMMARY_COUNT`: pytest's `SKIPPED [N] path:line: reason`, where [N] is not a test.
_SKIP_SUMMARY_COUNT: Final = re.compile(r"^\[\d+\]$")

_UNITTEST_PASS_SUFFIXES: Final = (" ... ok", " ... OK", " ...  OK")
# Results unittest prints that swebench records nothing for (the test counts as absent), but
# that still end the test's line, so no later "ok" line belongs to it.
_UNITTEST_UNRECORDED: Final = (" ... expected failure", " ... unexpected success")


def _too_many_chars(log: str) -> str:
    return f"the log is {len(log):,} characters, over the {MAX_LOG_CHARS:,} the grader reads"


def _lines(log: str) -> list[str]:
    """The log's lines as swebench's parsers split it (on "\\n" only), refused over the caps."""
    if len(log) > MAX_LOG_CHARS:
        raise LogTooLargeError(_too_many_chars(log))
    lines = log.count("\n") + 1
    if lines > MAX_LOG_LINES:
        raise LogTooLargeError(
            f"the log has {lines:,} lines, over the {MAX_LOG_LINES:,} the grader reads"
        )
    return log.split("\n")


def parse_pytest(log: str) -> dict[str, str]:
    """Test id -> status from `pytest -rA`'s short test summary (`parse_log_pytest`).

    A line counts when it starts with a status word; its second whitespace-separated word is
    the test id, after FAILED lines have their " - " turned into " " (so the message never
    joins the id). Ids are therefore what pytest prints up to the first whitespace: a
    parametrized id with a space (`test_x[a b]`) is cut at it (`test_x[a`), exactly as in
    swebench, where grading then matches such cut ids by prefix (see `grade`). pytest prints
    skipped tests as `SKIPPED [1] path:line: reason`, without an id, so a skipped test is
    absent. Colour codes are not removed (neither does `parse_log_pytest`): run pytest with
    `--color=no`, or the log has no results.

    The status is a `TestStatus`, except on a line whose first word only starts with one
    (`PASSED:`, `ERRORS`): as in swebench, that word is the status, and `grade` counts it as a
    failure (deviation 1 in the module's docstring).
    """
    statuses: dict[str, str] = {}
    for line in _lines(log):
        if not line.startswith(_STATUS_WORDS):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        # maxsplit keeps a huge line from becoming millions of words; the first two are the same.
        words = line.split(maxsplit=2)
        if len(words) < 2:
            continue
        if words[0] == TestStatus.SKIPPED and _SKIP_SUMMARY_COUNT.match(words[1]):
            continue
        statuses[words[1]] = _STATUS_OF_WORD.get(words[0], words[0])
    return statuses


def parse_unittest(log: str) -> dict[str, str]:
    """Test id -> status from `python -m unittest -v` (`parse_log_django`'s general rules).

    The test id is the text before " ... " on the result line, stripped, exactly as swebench
    keys it: on Python 3.11+ `test_x (package.module.Class.test_x)`, on older Pythons
    `test_x (package.module.Class)`. Two cases follow from unittest's output and stay as in
    swebench: a test with a docstring is printed as `test_x (...)` on one line and the
    docstring's first line plus " ... ok" on the next, so its id is that docstring line; a
    failing subtest gets its own id, `test_x (...) (i=1)`, and the parent test itself gets
    no result.

    Results: ` ... ok` (also ` ... OK`, ` ...  OK`) PASSED; ` ... skipped 'why'` SKIPPED;
    ` ... FAIL` FAILED; ` ... ERROR` ERROR; a later line exactly `ok` PASSED for a test whose
    line ended in its output; `FAIL: name ...` / `ERROR: name ...` headers mark the bare first
    word `name` FAILED / ERROR (which matches no qualified id). ` ... expected failure` and
    ` ... unexpected success` record nothing (as in swebench), so such a test counts as absent.
    """
    statuses: dict[str, str] = {}
    # The test whose " ... " line carried no result yet (deviation 2 in the module's docstring).
    pending: str | None = None
    for raw in _lines(log):
        line = raw.strip()
        if line == "ok":
            if pending is not None:
                statuses[pending] = TestStatus.PASSED
                pending = None
            continue
        # The only other lines `parse_log_django`'s rules act on (every suffix holds " ... ").
        if " ... " not in line and not line.startswith(("FAIL:", "ERROR:")):
            continue
        head, dots, _ = line.partition(" ... ")
        recorded = False
        for suffix in _UNITTEST_PASS_SUFFIXES:
            if line.endswith(suffix):
                statuses[line[: -len(suffix)]] = TestStatus.PASSED
                recorded = True
                break
        if " ... skipped" in line:
            statuses[line.partition(" ... skipped")[0]] = TestStatus.SKIPPED
            recorded = True
        if line.endswith(" ... FAIL"):
            statuses[line.partition(" ... FAIL")[0]] = TestStatus.FAILED
            recorded = True
        if line.startswith("FAIL:"):
            words = line.split(maxsplit=2)
            if len(words) > 1:  # deviation 6
                statuses[words[1]] = TestStatus.FAILED
            pending = None
        if line.endswith(" ... ERROR"):
            statuses[line.partition(" ... ERROR")[0]] = TestStatus.ERROR
            recorded = True
        if line.startswith("ERROR:"):
            words = line.split(maxsplit=2)
            if len(words) > 1:
                statuses[words[1]] = TestStatus.ERROR
            pending = None
        if dots:
            unfinished = not recorded and not line.endswith(_UNITTEST_UNRECORDED)
            pending = head if unfinished else None
    return statuses


_PARSERS: Final[dict[str, Callable[[str], dict[str, str]]]] = {
    "pytest": parse_pytest,
    "unittest": parse_unittest,
}


def parse_log(log: str, log_format: LogFormat) -> dict[str, str]:
    """Test id -> status (a `TestStatus` but for `parse_pytest`'s odd words) for a log of the
    named format, as it is (no newline translation); `LogTooLargeError` over the caps."""
    parser = _PARSERS.get(log_format)
    if parser is None:
        raise ValueError(f"unknown log format {log_format!r}; known: {', '.join(LOG_FORMATS)}")
    return parser(log)


class _Resolver:
    """The status-map key for a listed test (`_resolve_case`).

    Exact ids match exactly. SWE-bench Verified lists 676 parametrized ids cut mid-parameter
    (`test_x[log(photon`, swebench issue #290; `parse_pytest` cuts ids at a space the same
    way). Only for an id with more "[" than "]", the first key in log order that starts with
    it is taken, when all keys starting with it agree on passing (PASSED/XFAIL) or not.

    swebench scans the whole map for each such id; here the keys are sorted once (keys with a
    common prefix are one run of the sorted list), so a log of `MAX_LOG_LINES` results and a
    list of many cut ids stay fast.
    """

    def __init__(self, statuses: dict[str, str]) -> None:
        self._statuses = statuses
        self._sorted: list[str] | None = None
        self._first: list[int] = []  # per sorted key: its position in log order
        self._passing_before: list[int] = []  # per sorted position: passing keys before it
        self._in_order: list[str] = []

    def __call__(self, case: str) -> str | None:
        statuses = self._statuses
        if case in statuses:
            return case
        if case.count("[") <= case.count("]"):
            return None
        if self._sorted is None:
            self._in_order = list(statuses)
            position = {key: index for index, key in enumerate(self._in_order)}
            self._sorted = sorted(self._in_order)
            self._first = [position[key] for key in self._sorted]
            flags = (statuses[key] in _PASSING for key in self._sorted)
            self._passing_before = list(accumulate(flags, initial=0))
        keys = self._sorted
        low = bisect_left(keys, case)
        high = bisect_left(keys, True, lo=low, key=lambda key: not key.startswith(case))
        if low == high:
            return None
        passing = self._passing_before[high] - self._passing_before[low]
        if passing not in (0, high - low):
            return None
        return self._in_order[min(self._first[low:high])]


def _check(
    listed: Sequence[str], statuses: dict[str, str], *, maintained: bool
) -> tuple[ListReport, int]:
    """A list's successes and failures, and how many of its tests the log lacks.

    FAIL_TO_PASS: `check_pass_and_fail` (`test_passed`, else `test_failed`); PASS_TO_PASS:
    `check_maintained` (`test_maintained`, where SKIPPED is kept, else `test_failed`). A status
    that is none of the five is a failure here, where swebench puts the test in neither list
    (deviation 1), so every test lands in exactly one of the two.
    """
    resolve = _Resolver(statuses)
    success: list[str] = []
    failure: list[str] = []
    missing = 0
    for case in listed:
        key = resolve(case)
        status = None if key is None else statuses[key]
        if status in _PASSING or (maintained and status == TestStatus.SKIPPED):
            success.append(case)
        else:
            failure.append(case)
            missing += status is None
    return ListReport(tuple(success), tuple(failure)), missing


def _resolution(fail_to_pass: ListReport, pass_to_pass: ListReport) -> ResolvedStatus:
    """`get_resolution_status` over `compute_fail_to_pass` / `compute_pass_to_pass` (an empty
    PASS_TO_PASS list counts as all kept)."""
    f2p_total = len(fail_to_pass.success) + len(fail_to_pass.failure)
    f2p = len(fail_to_pass.success) / f2p_total if f2p_total else 1.0
    p2p_total = len(pass_to_pass.success) + len(pass_to_pass.failure)
    p2p = len(pass_to_pass.success) / p2p_total if p2p_total else 1.0
    if f2p == 1 and p2p == 1:
        return ResolvedStatus.FULL
    if 0 < f2p < 1 and p2p == 1:
        return ResolvedStatus.PARTIAL
    return ResolvedStatus.NO


def _tests(count: int, name: str) -> str:
    return f"{count} {name} {'test' if count == 1 else 'tests'}"


def _failed_part(failures: int, missing: int, total: int, name: str) -> str:
    text = f"{failures} of {_tests(total, name)} failed"
    return f"{text} ({missing} not in the log)" if missing else text


def _rejected(
    reason: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], results: int
) -> Grade:
    # The log is not evidence of anything, so no listed test passed.
    return Grade(
        resolved=False,
        resolution=ResolvedStatus.NO,
        fail_to_pass=ListReport((), tuple(fail_to_pass)),
        pass_to_pass=ListReport((), tuple(pass_to_pass)),
        reason=reason,
        results=results,
    )


def grade(
    log: str,
    log_format: LogFormat,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    *,
    exit_code: int | None = None,
) -> Grade:
    """Grade the test command's output `log` against the task's two lists.

    `get_logs_eval` (the log's status map, refused when empty or when `exit_code` is non-zero
    while no test failed or errored), then `get_eval_tests_report` and `get_resolution_status`
    (resolved = RESOLVED_FULL). A refused log resolves nothing and fails every listed test.
    `exit_code` None means the verify step did not record it, as swebench's logs from before the
    exit-code marker. Raises `ValueError` for an unknown `log_format` or an empty
    `fail_to_pass` (deviation 5 in the module's docstring).
    """
    if log_format not in _PARSERS:
        raise ValueError(f"unknown log format {log_format!r}; known: {', '.join(LOG_FORMATS)}")
    if not fail_to_pass:
        raise ValueError("a task needs at least one FAIL_TO_PASS test; the list is empty")
    try:
        if len(log) > MAX_LOG_CHARS:  # before the copies below
            raise LogTooLargeError(_too_many_chars(log))
        # swebench reads the log file with universal newlines, which splits progress-bar "\r"s.
        statuses = parse_log(log.replace("\r\n", "\n").replace("\r", "\n"), log_format)
    except LogTooLargeError as error:
        return _rejected(str(error), fail_to_pass, pass_to_pass, 0)
    if not statuses:
        return _rejected("no test results in the log", fail_to_pass, pass_to_pass, 0)
    if exit_code not in (None, 0) and not any(
        status in (TestStatus.FAILED, TestStatus.ERROR) for status in statuses.values()
    ):
        reason = (
            f"the test command exited {exit_code} but the log reports no failed or errored "
            "test, so the log does not describe the run"
        )
        return _rejected(reason, fail_to_pass, pass_to_pass, len(statuses))

    f2p, f2p_missing = _check(fail_to_pass, statuses, maintained=False)
    p2p, p2p_missing = _check(pass_to_pass, statuses, maintained=True)
    resolution = _resolution(f2p, p2p)
    failed_parts: list[str] = []
    if f2p.failure:
        failed_parts.append(
            _failed_part(len(f2p.failure), f2p_missing, len(fail_to_pass), "FAIL_TO_PASS")
        )
    if p2p.failure:
        failed_parts.append(
            _failed_part(len(p2p.failure), p2p_missing, len(pass_to_pass), "PASS_TO_PASS")
        )
    if failed_parts:
        reason = "; ".join(failed_parts)
    else:
        f2p_total, p2p_total = len(fail_to_pass), len(pass_to_pass)
        kept = f"{p2p_total} of {_tests(p2p_total, 'PASS_TO_PASS')} still passed"
        reason = f"{f2p_total} of {_tests(f2p_total, 'FAIL_TO_PASS')} passed" + (
            f" and {kept}" if pass_to_pass else " (no PASS_TO_PASS tests)"
        )
    return Grade(
        resolved=resolution is ResolvedStatus.FULL,
        resolution=resolution,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        reason=reason,
        results=len(statuses),
    )
