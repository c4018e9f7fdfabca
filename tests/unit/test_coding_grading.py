"""The coding track's grading (aml_evaluation.coding.grading, SPEC R-2.5) on hand-made logs and
on logs of real `pytest -rA` and `python -m unittest -v` runs, and the cross-check against
swebench 5.0.2's own functions on the same logs.

The cross-check tests take the `swebench` fixture, which skips them where swebench is not
installed (the project's venv, until it is pinned as a dev dependency); every other test runs
everywhere. To run the cross-check, use a venv with swebench==5.0.2 and pytest:
`PYTHONPATH=libs/evaluation VENV/bin/python -m pytest tests/unit/test_coding_grading.py`.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aml_evaluation.coding import grading
from aml_evaluation.coding.grading import TestStatus as S

# The throwaway test files whose runs gave the two logs below (run again live, see `live_logs`).
PYTEST_SOURCE = """\
import pytest


def test_add():
    assert 1 + 1 == 2


def test_sub():
    assert 2 - 1 == 0, "subtraction - broken"


@pytest.fixture
def broken():
    raise RuntimeError("fixture boom")


def test_setup_error(broken):
    pass


@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown boom")


def test_teardown_error(bad_teardown):
    pass


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="fixed already")
def test_xpass():
    pass


@pytest.mark.xfail(strict=True, reason="strict")
def test_xpass_strict():
    pass


@pytest.mark.parametrize("value", [1, "a b", "x - y", "\u00fcn\u00ef"])
def test_param(value):
    assert value != "x - y"


def test_prints():
    print("PASSED tests/test_calc.py::test_printed")


class TestGroup:
    def test_m\u00e9todo(self):
        assert "\u00df".upper() == "SS"
"""

UNITTEST_SOURCE = '''\
import sys
import unittest


class Arith(unittest.TestCase):
    def test_add(self):
        self.assertEqual(1 + 1, 2)

    def test_sub(self):
        self.assertEqual(2 - 1, 0)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("not today")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass

    def test_prints(self):
        sys.stderr.write("output of the test\\n")

    def test_documented(self):
        """Adds two numbers."""
        self.assertEqual(2 + 2, 4)

    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    def test_m\u00e9todo(self):
        self.assertEqual("\u00df".upper(), "SS")


class Other(unittest.TestCase):
    def test_add(self):
        self.assertEqual(3, 3)
'''

# `PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider --color=no
# tests/test_calc.py 2>&1` in /testbed (Python 3.11.7, pytest 9.2.0), exit status 1.
PYTEST_LOG = r"""============================= test session starts ==============================
platform linux -- Python 3.11.7, pytest-9.2.0, pluggy-1.7.0
rootdir: /testbed
configfile: pytest.ini
collected 14 items

tests/test_calc.py .FE.EsxXF..F...                                       [100%]

==================================== ERRORS ====================================
______________________ ERROR at setup of test_setup_error ______________________

    @pytest.fixture
    def broken():
>       raise RuntimeError("fixture boom")
E       RuntimeError: fixture boom

tests/test_calc.py:14: RuntimeError
___________________ ERROR at teardown of test_teardown_error ___________________

    @pytest.fixture
    def bad_teardown():
        yield
>       raise RuntimeError("teardown boom")
E       RuntimeError: teardown boom

tests/test_calc.py:24: RuntimeError
=================================== FAILURES ===================================
___________________________________ test_sub ___________________________________

    def test_sub():
>       assert 2 - 1 == 0, "subtraction - broken"
E       AssertionError: subtraction - broken
E       assert (2 - 1) == 0

tests/test_calc.py:9: AssertionError
______________________________ test_xpass_strict _______________________________
[XPASS(strict)] strict
______________________________ test_param[x - y] _______________________________

value = 'x - y'

    @pytest.mark.parametrize("value", [1, "a b", "x - y", "ünï"])
    def test_param(value):
>       assert value != "x - y"
E       AssertionError: assert 'x - y' != 'x - y'

tests/test_calc.py:53: AssertionError
==================================== PASSES ====================================
_________________________________ test_prints __________________________________
----------------------------- Captured stdout call -----------------------------
PASSED tests/test_calc.py::test_printed
=================================== XPASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_add
PASSED tests/test_calc.py::test_teardown_error
PASSED tests/test_calc.py::test_param[1]
PASSED tests/test_calc.py::test_param[a b]
PASSED tests/test_calc.py::test_param[\xfcn\xef]
PASSED tests/test_calc.py::test_prints
PASSED tests/test_calc.py::TestGroup::test_método
SKIPPED [1] tests/test_calc.py:31: not today
XFAIL tests/test_calc.py::test_xfail - known bug
XPASS tests/test_calc.py::test_xpass - fixed already
ERROR tests/test_calc.py::test_setup_error - RuntimeError: fixture boom
ERROR tests/test_calc.py::test_teardown_error - RuntimeError: teardown boom
FAILED tests/test_calc.py::test_sub - AssertionError: subtraction - broken
FAILED tests/test_calc.py::test_xpass_strict - [XPASS(strict)] strict
FAILED tests/test_calc.py::test_param[x - y] - AssertionError: assert 'x - y'...
==== 3 failed, 7 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 errors in 0.04s ====
"""
# `python3 -m unittest -v tests.test_calc_unit 2>&1` in /testbed (Python 3.11.2), exit status 1.
UNITTEST_LOG = """test_add (tests.test_calc_unit.Arith.test_add) ... ok
test_documented (tests.test_calc_unit.Arith.test_documented)
Adds two numbers. ... ok
test_error (tests.test_calc_unit.Arith.test_error) ... ERROR
test_expected_failure (tests.test_calc_unit.Arith.test_expected_failure) ... expected failure
test_método (tests.test_calc_unit.Arith.test_método) ... ok
test_prints (tests.test_calc_unit.Arith.test_prints) ... output of the test
ok
test_skipped (tests.test_calc_unit.Arith.test_skipped) ... skipped 'not today'
test_sub (tests.test_calc_unit.Arith.test_sub) ... FAIL
test_subtests (tests.test_calc_unit.Arith.test_subtests) ...\x20
  test_subtests (tests.test_calc_unit.Arith.test_subtests) (i=1) ... FAIL
test_unexpected_success (tests.test_calc_unit.Arith.test_unexpected_success) ... unexpected success
test_add (tests.test_calc_unit.Other.test_add) ... ok

======================================================================
ERROR: test_error (tests.test_calc_unit.Arith.test_error)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/test_calc_unit.py", line 13, in test_error
    raise RuntimeError("boom")
RuntimeError: boom

======================================================================
FAIL: test_sub (tests.test_calc_unit.Arith.test_sub)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/test_calc_unit.py", line 10, in test_sub
    self.assertEqual(2 - 1, 0)
AssertionError: 1 != 0

======================================================================
FAIL: test_subtests (tests.test_calc_unit.Arith.test_subtests) (i=1)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/test_calc_unit.py", line 37, in test_subtests
    self.assertNotEqual(i, 1)
AssertionError: 1 == 1

======================================================================
UNEXPECTED SUCCESS: test_unexpected_success (tests.test_calc_unit.Arith.test_unexpected_success)
----------------------------------------------------------------------
Ran 11 tests in 0.001s

FAILED (failures=2, errors=1, skipped=1, expected failures=1, unexpected successes=1)
"""
P = "tests/test_calc.py::"
PYTEST_EXPECTED = {
    # Printed by test_prints into its captured output, which -rA shows: swebench reads it too.
    P + "test_printed": S.PASSED,
    P + "test_add": S.PASSED,
    # PASSED, then ERROR at teardown further down the summary: the last line counts.
    P + "test_teardown_error": S.ERROR,
    P + "test_param[1]": S.PASSED,
    # `test_param[a b]` and `test_param[x - y]`, cut at their first space.
    P + "test_param[a": S.PASSED,
    P + "test_param[\\xfcn\\xef]": S.PASSED,
    P + "test_prints": S.PASSED,
    P + "TestGroup::test_m\u00e9todo": S.PASSED,
    P + "test_xfail": S.XFAIL,
    P + "test_setup_error": S.ERROR,
    P + "test_sub": S.FAILED,
    P + "test_xpass_strict": S.FAILED,
    P + "test_param[x": S.FAILED,
    # Absent: test_skipped (`SKIPPED [1] path:line`), test_xpass (`XPASS` is no status).
}
U = "tests.test_calc_unit.Arith."
UNITTEST_EXPECTED = {
    f"test_add ({U}test_add)": S.PASSED,
    # The docstring's first line stands where the test's name would.
    "Adds two numbers.": S.PASSED,
    f"test_error ({U}test_error)": S.ERROR,
    f"test_m\u00e9todo ({U}test_m\u00e9todo)": S.PASSED,
    # `... output of the test`, then `ok` on its own line.
    f"test_prints ({U}test_prints)": S.PASSED,
    f"test_skipped ({U}test_skipped)": S.SKIPPED,
    f"test_sub ({U}test_sub)": S.FAILED,
    f"test_subtests ({U}test_subtests) (i=1)": S.FAILED,
    "test_add (tests.test_calc_unit.Other.test_add)": S.PASSED,
    # The `FAIL:` / `ERROR:` headers, keyed by their first word.
    "test_error": S.ERROR,
    "test_sub": S.FAILED,
    "test_subtests": S.FAILED,
    # Absent: test_expected_failure, test_unexpected_success, the parent test_subtests.
}
REAL_LOGS = {"pytest": PYTEST_LOG, "unittest": UNITTEST_LOG}
EXPECTED = {"pytest": PYTEST_EXPECTED, "unittest": UNITTEST_EXPECTED}


def run_logged(command: list[str], cwd: Path) -> tuple[str, int]:
    """The command's stdout and stderr as one stream, as the verify step captures them."""
    env = {
        **os.environ,
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "COLUMNS": "80",
    }
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        errors="replace",
        timeout=120,
        check=False,
    )
    return done.stdout, done.returncode


@pytest.fixture(scope="module")
def live_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, int]]:
    """Fresh logs of the two throwaway test files, run by this Python and its pytest."""
    root = tmp_path_factory.mktemp("testbed")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_calc.py").write_text(PYTEST_SOURCE, encoding="utf-8")
    (root / "tests" / "test_calc_unit.py").write_text(UNITTEST_SOURCE, encoding="utf-8")
    # Keeps the run from taking the settings of a project it sits in.
    (root / "pytest.ini").write_text("[pytest]\n")
    pytest_command = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider"]
    return {
        "pytest": run_logged([*pytest_command, "--color=no", "tests/test_calc.py"], root),
        "unittest": run_logged(
            [sys.executable, "-m", "unittest", "-v", "tests.test_calc_unit"], root
        ),
    }


def statuses(log: str, log_format: grading.LogFormat) -> dict[str, str]:
    return grading.parse_log(log, log_format)


# -- the parsers on real logs ---------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
def test_the_parsers_read_the_real_logs(log_format: grading.LogFormat) -> None:
    assert statuses(REAL_LOGS[log_format], log_format) == EXPECTED[log_format]


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
def test_the_parsers_read_a_live_run(
    live_logs: dict[str, tuple[str, int]], log_format: grading.LogFormat
) -> None:
    log, exit_code = live_logs[log_format]
    assert exit_code == 1, log
    assert statuses(log, log_format) == EXPECTED[log_format], log


def test_grading_the_real_pytest_log() -> None:
    passing = [P + "test_add", P + "test_xfail", P + "TestGroup::test_m\u00e9todo"]
    resolved = grading.grade(PYTEST_LOG, "pytest", passing, [P + "test_prints"], exit_code=1)
    assert resolved.resolved
    assert resolved.resolution == "RESOLVED_FULL"
    assert resolved.reason == (
        "3 of 3 FAIL_TO_PASS tests passed and 1 of 1 PASS_TO_PASS test still passed"
    )
    assert resolved.results == len(PYTEST_EXPECTED)

    failing = grading.grade(
        PYTEST_LOG,
        "pytest",
        [P + "test_add", P + "test_sub", P + "test_setup_error"],
        [P + "test_teardown_error", P + "test_skipped"],
        exit_code=1,
    )
    assert not failing.resolved
    assert failing.resolution == "RESOLVED_NO"  # PARTIAL only while PASS_TO_PASS holds
    assert failing.report() == {
        "FAIL_TO_PASS": {
            "success": [P + "test_add"],
            "failure": [P + "test_sub", P + "test_setup_error"],
        },
        "PASS_TO_PASS": {
            "success": [],
            "failure": [P + "test_teardown_error", P + "test_skipped"],
        },
    }
    assert failing.reason == (
        "2 of 3 FAIL_TO_PASS tests failed; 2 of 2 PASS_TO_PASS tests failed (1 not in the log)"
    )


def test_grading_the_real_unittest_log() -> None:
    f2p = [f"test_add ({U}test_add)", "Adds two numbers."]
    p2p = [f"test_skipped ({U}test_skipped)", f"test_prints ({U}test_prints)"]
    assert grading.grade(UNITTEST_LOG, "unittest", f2p, p2p, exit_code=1).resolved

    # Skipped keeps a PASS_TO_PASS test but does not make a FAIL_TO_PASS test pass.
    skipped = grading.grade(UNITTEST_LOG, "unittest", [f"test_skipped ({U}test_skipped)"], [])
    assert not skipped.resolved
    assert skipped.reason == "1 of 1 FAIL_TO_PASS test failed"

    # Expected failures and unexpected successes record nothing, as in swebench.
    for name in ("test_expected_failure", "test_unexpected_success", "test_subtests"):
        absent = grading.grade(UNITTEST_LOG, "unittest", [f"{name} ({U}{name})"], [])
        assert absent.reason == "1 of 1 FAIL_TO_PASS test failed (1 not in the log)"


# -- statuses and lists ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "as_fail_to_pass", "as_pass_to_pass"),
    [
        ("PASSED t.py::x", True, True),
        ("XFAIL t.py::x - known", True, True),
        ("SKIPPED t.py::x", False, True),
        ("FAILED t.py::x - AssertionError", False, False),
        ("ERROR t.py::x - RuntimeError", False, False),
        ("XPASS t.py::x", False, False),  # no status word: absent
        ("PASSED t.py::y", False, False),  # another test: x is absent
    ],
)
def test_each_status_counts_as_swebench_counts_it(
    line: str, as_fail_to_pass: bool, as_pass_to_pass: bool
) -> None:
    log = f"PASSED t.py::other\n{line}\n"
    assert grading.grade(log, "pytest", ["t.py::x"], []).resolved is as_fail_to_pass
    assert grading.grade(log, "pytest", ["t.py::other"], ["t.py::x"]).resolved is as_pass_to_pass


def test_a_test_named_twice_counts_its_last_line() -> None:
    log = "PASSED t.py::a\nFAILED t.py::b\nERROR t.py::a - teardown\nPASSED t.py::b\n"
    assert statuses(log, "pytest") == {"t.py::a": S.ERROR, "t.py::b": S.PASSED}
    log = "t (m.C.t) ... FAIL\nt (m.C.t) ... ok\nu (m.C.u) ... ok\nu (m.C.u) ... ERROR\n"
    assert statuses(log, "unittest") == {"t (m.C.t)": S.PASSED, "u (m.C.u)": S.ERROR}


def test_a_test_listed_twice_is_counted_twice() -> None:
    result = grading.grade("PASSED t.py::a\nFAILED t.py::b\n", "pytest", ["t.py::b", "t.py::b"], [])
    assert result.fail_to_pass == grading.ListReport((), ("t.py::b", "t.py::b"))
    assert result.reason == "2 of 2 FAIL_TO_PASS tests failed"


def test_partial_resolution() -> None:
    result = grading.grade(
        "PASSED t::a\nFAILED t::b\nPASSED t::c\n", "pytest", ["t::a", "t::b"], ["t::c"]
    )
    assert (result.resolved, result.resolution) == (False, "RESOLVED_PARTIAL")
    result = grading.grade("PASSED t::a\nFAILED t::b\n", "pytest", ["t::a"], ["t::b"])
    assert (result.resolved, result.resolution) == (False, "RESOLVED_NO")
    result = grading.grade("PASSED t::a\n", "pytest", ["t::a"], [])
    assert (result.resolved, result.reason) == (
        True,
        "1 of 1 FAIL_TO_PASS test passed (no PASS_TO_PASS tests)",
    )


def test_cut_parametrized_ids_match_by_prefix() -> None:
    log = (
        "PASSED t::p[a b]\nPASSED t::p[a c]\nFAILED t::q[x - y] - boom\n"
        "PASSED t::r[1]\nFAILED t::r[2]\n"
    )
    assert statuses(log, "pytest") == {
        "t::p[a": S.PASSED,
        "t::q[x": S.FAILED,
        "t::r[1]": S.PASSED,
        "t::r[2]": S.FAILED,
    }
    # Listed as the dataset holds them: whole, or cut (SWE-bench Verified).
    assert grading.grade(log, "pytest", ["t::p[a b]"], []).resolved is False  # not a key
    assert grading.grade(log, "pytest", ["t::p[a"], []).resolved
    assert grading.grade(log, "pytest", ["t::p["], []).resolved  # a prefix of a key
    assert not grading.grade(log, "pytest", ["t::q["], []).resolved
    # Keys under the prefix that disagree on passing: no match, so a failure.
    assert not grading.grade(log, "pytest", ["t::r["], []).resolved
    # An id with balanced brackets never matches by prefix.
    assert not grading.grade(log, "pytest", ["t::r"], []).resolved


def test_prefix_matching_takes_the_first_key_in_log_order() -> None:
    # Both keys are non-passing, so they agree; the first in the log (SKIPPED) is taken, which
    # keeps a PASS_TO_PASS test, where the later FAILED key would not.
    log = "PASSED t::ok\nSKIPPED t::p[b]\nFAILED t::p[a]\n"
    assert grading.grade(log, "pytest", ["t::ok"], ["t::p["]).resolved
    log = "PASSED t::ok\nFAILED t::p[b]\nSKIPPED t::p[a]\n"
    assert not grading.grade(log, "pytest", ["t::ok"], ["t::p["]).resolved


# -- logs that are not results --------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
@pytest.mark.parametrize(
    "log",
    [
        "",
        "\n\n\n",
        "   \t  ",
        "bash: pytest: command not found\n",
        "Traceback (most recent call last):\nImportError: No module named x\n",
        "\x00\x01\x02\ufffd\ufffd garbage \udcff\n" * 100,
        "PASSED\nFAILED\nERROR\n",  # status words without a test
        "SKIPPED [3] t.py:1: unconditional skip\n",
        "\x1b[32mPASSED\x1b[0m t.py::x\n",  # coloured output
        "Ran 0 tests in 0.000s\n\nOK\n",
    ],
)
def test_a_log_without_results_is_not_resolved(log: str, log_format: grading.LogFormat) -> None:
    result = grading.grade(log, log_format, ["t.py::x", "x (m.C.x)"], ["t.py::y"])
    assert not result.resolved
    assert result.reason == "no test results in the log"
    assert result.results == 0
    assert result.fail_to_pass.failure == ("t.py::x", "x (m.C.x)")
    assert result.pass_to_pass.failure == ("t.py::y",)


def test_a_nonzero_exit_with_no_failure_in_the_log_is_not_resolved() -> None:
    log = "PASSED t.py::x\nPASSED t.py::y\n"
    assert grading.grade(log, "pytest", ["t.py::x"], [], exit_code=0).resolved
    assert grading.grade(log, "pytest", ["t.py::x"], []).resolved
    refused = grading.grade(log, "pytest", ["t.py::x"], [], exit_code=2)
    assert not refused.resolved
    assert refused.reason.startswith("the test command exited 2 but the log reports no failed")
    assert refused.results == 2
    # A failure elsewhere in the log explains the exit status.
    log += "FAILED t.py::z - boom\n"
    assert grading.grade(log, "pytest", ["t.py::x"], [], exit_code=1).resolved


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one FAIL_TO_PASS test"):
        grading.grade("PASSED t::a\n", "pytest", [], ["t::a"])
    with pytest.raises(ValueError, match="unknown log format 'junit'"):
        grading.grade("PASSED t::a\n", "junit", ["t::a"], [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown log format"):
        grading.parse_log("", "tap")  # type: ignore[arg-type]


# -- the pytest parser ----------------------------------------------------------------------


def test_pytest_lines_are_read_as_swebench_reads_them() -> None:
    log = (
        "PASSED t.py::a [100%]\n"  # the second word is the id, the rest is ignored
        "FAILED t.py::b - x - y\n"
        "FAILED - t.py::c\n"  # " - " dropped on FAILED lines before splitting
        "  PASSED t.py::d\n"  # indented: not a summary line
        "ERROR t.py::e\r\n"  # "\r" is whitespace to split
        "PASSED:  t.py::f\n"  # the word is kept as the status (deviation 1)
        "XFAIL\tt.py::g\n"
        "SKIPPED [2] t.py:4: reason\n"
        "SKIPPED t.py::h\n"  # an id, not a count: kept
    )
    assert statuses(log, "pytest") == {
        "t.py::a": S.PASSED,
        "t.py::b": S.FAILED,
        "t.py::c": S.FAILED,
        "t.py::e": S.ERROR,
        "t.py::f": "PASSED:",
        "t.py::g": S.XFAIL,
        "t.py::h": S.SKIPPED,
    }


def test_an_odd_status_word_is_a_failure() -> None:
    log = "PASSED t.py::a\nPASSEDX t.py::b\nERRORS t.py::c\n"
    result = grading.grade(log, "pytest", ["t.py::a", "t.py::b"], ["t.py::c"])
    assert not result.resolved
    assert result.reason == "1 of 2 FAIL_TO_PASS tests failed; 1 of 1 PASS_TO_PASS test failed"


def test_weird_unicode() -> None:
    # str.split's whitespace (U+3000, U+001C, NBSP, ...) ends an id as in swebench; "\u2028" and
    # "\x85" are no line breaks for "\n"-splitting, nor for the grader's newline translation.
    log = (
        "PASSED t.py::emoji[\U0001f600]\n"
        "PASSED t.py::cjk_\u6e2c\u8a66\u3000trailing\n"
        "PASSED t.py::nbsp\u00a0x\n"
        "FAILED t.py::combining_e\u0301 - \u2028PASSED t.py::not_a_line\n"
        "PASSED t.py::sep\x1cx\n"
        "PASSED t.py::rtl_\u05e9\u05dc\u05d5\u05dd\x85PASSED t.py::nel\n"
        "\ufeffPASSED t.py::bom\n"  # a BOM before the word: not a summary line
    )
    assert statuses(log, "pytest") == {
        "t.py::emoji[\U0001f600]": S.PASSED,
        "t.py::cjk_\u6e2c\u8a66": S.PASSED,
        "t.py::nbsp": S.PASSED,
        "t.py::combining_e\u0301": S.FAILED,
        "t.py::sep": S.PASSED,
        "t.py::rtl_\u05e9\u05dc\u05d5\u05dd": S.PASSED,
    }
    ids = [
        "t.py::emoji[\U0001f600]",
        "t.py::cjk_\u6e2c\u8a66",
        "t.py::rtl_\u05e9\u05dc\u05d5\u05dd",
    ]
    assert grading.grade(log, "pytest", ids, []).resolved
    unittest_log = "test_\u00fc (m.\u00c7.test_\u00fc) ... ok\n\U0001f600 docstring ... FAIL\n"
    assert statuses(unittest_log, "unittest") == {
        "test_\u00fc (m.\u00c7.test_\u00fc)": S.PASSED,
        "\U0001f600 docstring": S.FAILED,
    }


def test_carriage_returns_are_line_breaks_when_grading() -> None:
    # swebench reads its log file with universal newlines: "\r\n" and "\r" end lines.
    log = "collecting ...\rPASSED t.py::a\r\nFAILED t.py::b\r"
    assert grading.grade(log, "pytest", ["t.py::a"], []).resolved
    assert not grading.grade(log, "pytest", ["t.py::b"], []).resolved
    assert statuses(log, "pytest") == {"t.py::b": S.FAILED}  # the parser itself splits on "\n"


# -- the unittest parser --------------------------------------------------------------------


def test_unittest_ids_are_the_text_before_the_dots() -> None:
    log = (
        "test_new (pkg.mod.Class.test_new) ... ok\n"  # Python 3.11+
        "test_old (pkg.mod.Class) ... ok\n"  # Python 3.10 and older
        "test_fail (pkg.mod.Class) ... FAIL\n"
        "test_error (pkg.mod.Class) ... ERROR\n"
        "test_skip (pkg.mod.Class) ... skipped 'because'\n"
        "test_xfail (pkg.mod.Class) ... expected failure\n"
        "test_xpass (pkg.mod.Class) ... unexpected success\n"
        "test_upper (pkg.mod.Class) ... OK\n"
        "test_spaces (pkg.mod.Class) ...  OK\n"
        "    test_indented (pkg.mod.Class) ... ok   \n"
        "a ... ok ... ok\n"  # the text before the last " ... ok"
        "c ... FAIL ... FAIL\n"  # the text before the first " ... FAIL"
        "test_subtest (pkg.mod.Class.test_subtest) ...\x20\n"
        "  test_subtest (pkg.mod.Class.test_subtest) (n=2) ... ERROR\n"
        "\n"
        "FAIL: test_fail (pkg.mod.Class)\n"
        "ERROR: test_error (pkg.mod.Class)\n"
        "ERROR:\n"  # no name: skipped (swebench raises IndexError, deviation 6)
        "Ran 13 tests in 0.002s\n"
    )
    assert statuses(log, "unittest") == {
        "test_new (pkg.mod.Class.test_new)": S.PASSED,
        "test_old (pkg.mod.Class)": S.PASSED,
        "test_fail (pkg.mod.Class)": S.FAILED,
        "test_error (pkg.mod.Class)": S.ERROR,
        "test_skip (pkg.mod.Class)": S.SKIPPED,
        "test_upper (pkg.mod.Class)": S.PASSED,
        "test_spaces (pkg.mod.Class)": S.PASSED,
        "test_indented (pkg.mod.Class)": S.PASSED,
        "a ... ok": S.PASSED,
        "c": S.FAILED,
        "test_subtest (pkg.mod.Class.test_subtest) (n=2)": S.ERROR,
        "test_fail": S.FAILED,
        "test_error": S.ERROR,
    }


def test_unittest_results_after_the_tests_output() -> None:
    log = (
        "test_a (m.C.test_a) ... printed by a\n"
        "more output\n"
        "ok\n"
        "test_b (m.C.test_b) ... FAIL\n"
        "ok\n"  # test_b's line has its result: this "ok" is output, not a result
        "test_c (m.C.test_c) ... printed by c\n"
        "okay, c printed this\n"  # not exactly "ok" (deviation 2)
        "FAIL\n"  # a result alone on its line other than ok: swebench reads none either
        "test_d (m.C.test_d) ... expected failure\n"
        "ok\n"
        "test_e (m.C.test_e) ... printed by e\n"
        "\n"
        "======================================================================\n"
        "FAIL: test_b (m.C.test_b)\n"
        "Traceback (most recent call last):\n"
        "    ok = check()\n"  # swebench would mark test_e (its prev_test) PASSED here
        "ok\n"
    )
    assert statuses(log, "unittest") == {
        "test_a (m.C.test_a)": S.PASSED,
        "test_b (m.C.test_b)": S.FAILED,
        "test_b": S.FAILED,
    }


# -- bounds ---------------------------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
def test_a_huge_log_is_refused_at_once(log_format: grading.LogFormat) -> None:
    huge = "PASSED t.py::x\n" + "x" * 50_000_000
    started = time.perf_counter()
    result = grading.grade(huge, log_format, ["t.py::x"], [])
    assert time.perf_counter() - started < 0.5
    assert not result.resolved
    assert result.reason == (
        "the log is 50,000,015 characters, over the 16,777,216 the grader reads"
    )
    with pytest.raises(grading.LogTooLargeError, match="50,000,015 characters"):
        grading.parse_log(huge, log_format)

    many_lines = "\n" * 5_000_000
    started = time.perf_counter()
    result = grading.grade(many_lines, log_format, ["t.py::x"], [])
    assert time.perf_counter() - started < 0.5
    assert result.reason == "the log has 5,000,001 lines, over the 200,000 the grader reads"


LIMIT, LINES = grading.MAX_LOG_CHARS, grading.MAX_LOG_LINES - 1
# Logs at the caps that make each parser work hardest: per character, or per line.
LOGS_AT_THE_CAPS = {
    "one long line": lambda: "a " * (LIMIT // 2),
    "long status line": lambda: "PASSED t.py::x " + "y" * (LIMIT - 20),
    "long dashed line": lambda: "FAILED t.py::x" + " - " * ((LIMIT - 20) // 3),
    "longest lines": lambda: ("x (m.C.x) ... " + "skipped" * 10 + " ... FAIL\n") * LINES,
    "most results": lambda: "".join(
        f"PASSED t.py::test_{n}\nt{n} (m.C.t{n}) ... ok\n" for n in range(LINES // 2)
    ),
}


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
@pytest.mark.parametrize("name", list(LOGS_AT_THE_CAPS))
def test_a_log_at_the_caps_is_read_quickly(log_format: grading.LogFormat, name: str) -> None:
    log = LOGS_AT_THE_CAPS[name]()[:LIMIT]
    started = time.perf_counter()
    result = grading.grade(log, log_format, ["t.py::x", "x (m.C.x)"], ["t.py::test_1["])
    # At most about 0.3 s on a CI machine; the bound leaves room for a busy one.
    assert time.perf_counter() - started < 2
    assert result.results < LINES


def test_cut_ids_stay_fast_against_many_results() -> None:
    log = "".join(f"PASSED t.py::p[{n}]\n" for n in range(LINES))
    cut = [f"t.py::p[{n}" for n in range(1, 1000)]
    started = time.perf_counter()
    result = grading.grade(log, "pytest", ["t.py::p[0]"], cut)
    assert time.perf_counter() - started < 2
    assert result.resolved


# -- the cross-check against swebench 5.0.2 -------------------------------------------------

SWEBENCH_PARSER = {"pytest": "parse_log_pytest", "unittest": "parse_log_django"}


@pytest.fixture(scope="module")
def swebench() -> SimpleNamespace:
    """swebench's grading functions, or a skip where swebench is not installed."""
    reason = "swebench==5.0.2 is not installed: the cross-check runs where it is"
    harness = pytest.importorskip("swebench.harness.grading", reason=reason)
    parsers = pytest.importorskip("swebench.harness.log_parsers.python", reason=reason)
    constants = pytest.importorskip("swebench.harness.constants", reason=reason)
    types = pytest.importorskip("swebench.types", reason=reason)
    return SimpleNamespace(
        version=importlib.metadata.version("swebench"),
        harness=harness,
        constants=constants,
        TestSpec=types.TestSpec,
        parsers={"pytest": parsers.parse_log_pytest, "unittest": parsers.parse_log_django},
    )


def swebench_statuses(sw: SimpleNamespace, log: str, log_format: str) -> dict[str, str]:
    result: dict[str, str] = sw.parsers[log_format](log, None)
    return result


def swebench_grade(
    sw: SimpleNamespace,
    log: str,
    log_format: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    exit_code: int | None = None,
) -> tuple[bool, dict[str, Any] | None]:
    """swebench's verdict on the log as its harness writes it: between the eval script's markers,
    with the exit-status line after them; (resolved, the FAIL_TO_PASS / PASS_TO_PASS report, or
    None when `get_logs_eval` refuses the log)."""
    c = sw.constants
    spec = sw.TestSpec(
        instance_id="task",
        image="",
        eval_script_list=[],
        repo="",
        version="",
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        log_parser=SWEBENCH_PARSER[log_format],
        eval_type="pass_and_fail",
    )
    exit_line = "" if exit_code is None else f"{c.TEST_EXIT_CODE}: {exit_code}\n"
    content = f"{c.START_TEST_OUTPUT}\n{log}\n{c.END_TEST_OUTPUT}\n{exit_line}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "test_output.txt"
        path.write_text(content, encoding="utf-8", newline="")
        status_map, found = sw.harness.get_logs_eval(spec, str(path))
    if not found:
        return False, None
    gold = {c.FAIL_TO_PASS: fail_to_pass, c.PASS_TO_PASS: pass_to_pass}
    report = sw.harness.get_eval_tests_report(status_map, gold)
    resolved = sw.harness.get_resolution_status(report) == c.ResolvedStatus.FULL.value
    lists = {name: report[name] for name in (c.FAIL_TO_PASS, c.PASS_TO_PASS)}
    return resolved, lists


HAND_MADE_LOGS: list[tuple[str, grading.LogFormat]] = [
    ("PASSED t.py::a\nFAILED t.py::b - x - y\nERROR t.py::c\nXFAIL t.py::d - r\n", "pytest"),
    (
        "PASSED t::p[a b]\nFAILED t::q[x - y] - e\nPASSED t::r[1]\nFAILED t::r[2]\nPASSED t::s[a\n",
        "pytest",
    ),
    ("PASSED t::a\nERROR t::a - teardown\nFAILED t::b\nPASSED t::b\nSKIPPED t::c\n", "pytest"),
    ("collecting ...\rPASSED t::a\r\nFAILED t::b\r\nXFAIL\u3000t::c\n\x85PASSED t::d\n", "pytest"),
    ("PASSED t.py::\U0001f600[\u00e9]\nFAILED t.py::\u6e2c - \u8a66\n", "pytest"),
    ("PASSED t::a\nSKIPPED t::p[b]\nFAILED t::p[a]\nXFAIL t::r[1]\nPASSED t::r[2]\n", "pytest"),
    ("PASSED t::a\nFAILED t::p[b]\nSKIPPED t::p[a]\n", "pytest"),
    ("PASSED: t::a\nPASSED t::b\n", "pytest"),  # an odd word (the status maps still agree)
    ("", "pytest"),
    ("no results at all\n", "unittest"),
    ("t (m.C.t) ... FAIL\nt (m.C.t) ... ok\nu (m.C.u) ... ok\nu (m.C.u) ... ERROR\n", "unittest"),
    ("a (m.C.a) ... out\nok\nb (m.C.b) ... skipped 'x'\nDoc. ... ok\nc ... d ... ok\n", "unittest"),
    (
        "a ... ok ... ok\nb ... FAIL ... FAIL\nc ... skipped ... ok\nd ... ok ... ERROR\n",
        "unittest",
    ),
    (
        "x (m.C) ... OK\ny (m.C) ...  OK\n  z (m.C.z) (i=1) ... FAIL\nFAIL: z (m.C.z) (i=1)\n",
        "unittest",
    ),
]


def cross_check_cases(log: str, log_format: grading.LogFormat) -> list[tuple[list[str], list[str]]]:
    """Lists to grade a log with: each of its tests, and ids it lacks, alone in either list;
    then all of them."""
    keys = list(grading.parse_log(log.replace("\r\n", "\n").replace("\r", "\n"), log_format))
    others = ["t.py::absent", "t::p[", "t::r[", "t::s[", "absent (m.C.absent)"]
    passing = [key for key in keys if grading.grade(log, log_format, [key], []).resolved]
    cases: list[tuple[list[str], list[str]]] = [([case], []) for case in keys + others]
    cases += [(passing[:1] or ["t.py::absent"], [case]) for case in keys + others]
    cases += [(keys or ["t.py::absent"], keys), (passing or keys or others, passing)]
    return cases


def assert_same_verdicts(sw: SimpleNamespace, log: str, log_format: grading.LogFormat) -> None:
    for exit_code in (None, 0, 1):
        for fail_to_pass, pass_to_pass in cross_check_cases(log, log_format):
            ours = grading.grade(log, log_format, fail_to_pass, pass_to_pass, exit_code=exit_code)
            resolved, lists = swebench_grade(
                sw, log, log_format, fail_to_pass, pass_to_pass, exit_code
            )
            case = (exit_code, fail_to_pass, pass_to_pass)
            assert ours.resolved is resolved, case
            if lists is not None:
                assert ours.report() == lists, case


def test_swebench_is_the_mirrored_version(swebench: SimpleNamespace) -> None:
    assert swebench.version == "5.0.2", "grading.py mirrors 5.0.2: re-read the new version"
    assert [s.value for s in swebench.constants.TestStatus] == [s.value for s in S]
    assert [s.value for s in swebench.constants.ResolvedStatus] == [
        s.value for s in grading.ResolvedStatus
    ]


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
def test_same_status_maps_on_the_real_logs(
    swebench: SimpleNamespace,
    live_logs: dict[str, tuple[str, int]],
    log_format: grading.LogFormat,
) -> None:
    for log in (REAL_LOGS[log_format], live_logs[log_format][0]):
        assert statuses(log, log_format) == swebench_statuses(swebench, log, log_format)


@pytest.mark.parametrize("log_format", ["pytest", "unittest"])
def test_same_verdicts_on_the_real_logs(
    swebench: SimpleNamespace,
    live_logs: dict[str, tuple[str, int]],
    log_format: grading.LogFormat,
) -> None:
    assert_same_verdicts(swebench, REAL_LOGS[log_format], log_format)
    assert_same_verdicts(swebench, live_logs[log_format][0], log_format)


@pytest.mark.parametrize(("log", "log_format"), HAND_MADE_LOGS)
def test_same_status_maps_and_verdicts_on_hand_made_logs(
    swebench: SimpleNamespace, log: str, log_format: grading.LogFormat
) -> None:
    assert statuses(log, log_format) == swebench_statuses(swebench, log, log_format)
    if "PASSED:" not in log:  # deviation 1, tested below
        assert_same_verdicts(swebench, log, log_format)


# Each deviation from swebench 5.0.2 (the module's docstring), shown on swebench itself.


def test_deviation_1_an_odd_status_word_fails_the_test(swebench: SimpleNamespace) -> None:
    log = "PASSED t::a\nPASSED: t::b\n"
    assert swebench_statuses(swebench, log, "pytest") == {"t::a": "PASSED", "t::b": "PASSED:"}
    assert swebench_grade(swebench, log, "pytest", ["t::a", "t::b"], []) == (
        True,
        {
            "FAIL_TO_PASS": {"success": ["t::a"], "failure": []},
            "PASS_TO_PASS": {"success": [], "failure": []},
        },
    )
    assert grading.grade(log, "pytest", ["t::a", "t::b"], []).fail_to_pass == grading.ListReport(
        ("t::a",), ("t::b",)
    )


def test_deviation_2_a_later_ok_line_is_no_result(swebench: SimpleNamespace) -> None:
    log = "t (m.C.t) ... FAIL\n\nFAIL: t (m.C.t)\nTraceback (most recent call last):\n"
    log += "  ok = check()\n"  # a source line in the traceback
    assert swebench_statuses(swebench, log, "unittest")["t (m.C.t)"] == "PASSED"
    assert swebench_grade(swebench, log, "unittest", ["t (m.C.t)"], [])[0]
    assert statuses(log, "unittest")["t (m.C.t)"] == S.FAILED
    assert not grading.grade(log, "unittest", ["t (m.C.t)"], []).resolved


def test_deviation_3_no_django_workarounds(swebench: SimpleNamespace) -> None:
    log = "--version is equivalent to version\nt ... ok\n"
    assert swebench_grade(swebench, log, "unittest", ["--version is equivalent to version"], [])[0]
    assert statuses(log, "unittest") == {"t": S.PASSED}


def test_deviations_4_and_5_no_results_and_no_fail_to_pass(swebench: SimpleNamespace) -> None:
    # A JavaScript runner's summary makes swebench go on with no results; with empty lists
    # that resolves the task.
    assert swebench_grade(swebench, "3 passing\n", "pytest", [], [])[0]
    assert not grading.grade("3 passing\n", "pytest", ["t::a"], []).resolved
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        grading.grade("PASSED t::a\n", "pytest", [], [])


def test_deviation_6_a_header_without_a_name(swebench: SimpleNamespace) -> None:
    with pytest.raises(IndexError):
        swebench_statuses(swebench, "ERROR:\n", "unittest")
    assert statuses("ERROR:\n", "unittest") == {}


# Random logs. The pytest maps always agree, and so do the verdicts unless a listed test has an
# odd status word (deviation 1). The unittest maps and verdicts agree while no line starts with
# "ok" (deviation 2). And grading never resolves what swebench does not.

PYTEST_IDS = ["t::a", "t::b", "t::p[x", "t::p[x y]", "t::p[1]", "[1]", "-"]
PYTEST_LINE = st.builds(
    lambda word, gap, test, tail: f"{word}{gap}{test}{tail}",
    st.sampled_from(
        ["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS", "PASSED:", "ok", ""]
    ),
    st.sampled_from([" ", "  ", "\t", " - ", "\u3000", ""]),
    st.sampled_from(PYTEST_IDS),
    st.sampled_from(["", " - boom - x", " [100%]", "\r", "\r\n", "\rPASSED t::a", "\n3 passing"]),
)
# Listed ids: also one cut, matched by prefix against t::p[x, t::p[1] and any t::p[x y].
PYTEST_LISTED = st.sampled_from([*PYTEST_IDS, "t::p["])
UNITTEST_IDS = ["a (m.C.a)", "b (m.C.b)", "Doc line.", "a"]
UNITTEST_RESULT_LINE = st.one_of(
    st.builds(
        lambda indent, test, result: f"{indent}{test}{result}",
        st.sampled_from(["", "  "]),
        st.sampled_from(UNITTEST_IDS),
        st.sampled_from(
            [
                " ... ok",
                " ... OK",
                " ...  OK",
                " ... FAIL",
                " ... ERROR",
                " ... skipped 'x'",
                " ... expected failure",
                " ... unexpected success",
                " ... ",
                " ... output",
                " ... ok ... ok",
                " ... ok ... FAIL",
                " ... FAIL ... FAIL",
                " ... skipped ... ok",
                " ... ok ... ERROR\r",
            ]
        ),
    ),
    st.sampled_from(["FAIL", "ERROR", "", "Ran 2 tests", "\r", "Doc line."]),
    st.builds(
        lambda head, test: f"{head} {test}",
        st.sampled_from(["FAIL:", "ERROR:"]),
        st.sampled_from(UNITTEST_IDS),
    ),
)
UNITTEST_LINE = st.one_of(
    UNITTEST_RESULT_LINE, st.sampled_from(["ok", "  ok", "okay", "ok ... ok", "ok ... "])
)
EXIT_CODES = st.sampled_from([None, 0, 1])


def assert_same_verdict(
    sw: SimpleNamespace,
    log: str,
    log_format: grading.LogFormat,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    exit_code: int | None,
) -> None:
    ours = grading.grade(log, log_format, fail_to_pass, pass_to_pass, exit_code=exit_code)
    resolved, lists = swebench_grade(sw, log, log_format, fail_to_pass, pass_to_pass, exit_code)
    assert ours.resolved is resolved
    if lists is not None:
        assert ours.report() == lists


def assert_never_more_lenient(
    sw: SimpleNamespace,
    log: str,
    log_format: grading.LogFormat,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    exit_code: int | None,
) -> None:
    ours = grading.grade(log, log_format, fail_to_pass, pass_to_pass, exit_code=exit_code)
    resolved, lists = swebench_grade(sw, log, log_format, fail_to_pass, pass_to_pass, exit_code)
    if ours.resolved:
        assert resolved
    if lists is not None:
        # Every success here is one in swebench too.
        for ours_list, name in (
            (ours.fail_to_pass, "FAIL_TO_PASS"),
            (ours.pass_to_pass, "PASS_TO_PASS"),
        ):
            theirs = list(lists[name]["success"])
            for case in ours_list.success:
                assert case in theirs, (name, case)
                theirs.remove(case)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(PYTEST_LINE, max_size=12),
    fail_to_pass=st.lists(PYTEST_LISTED, min_size=1, max_size=3),
    pass_to_pass=st.lists(PYTEST_LISTED, max_size=3),
    exit_code=EXIT_CODES,
)
def test_random_pytest_logs(
    swebench: SimpleNamespace,
    lines: list[str],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    exit_code: int | None,
) -> None:
    log = "\n".join(lines)
    assert statuses(log, "pytest") == swebench_statuses(swebench, log, "pytest")
    graded = statuses(log.replace("\r\n", "\n").replace("\r", "\n"), "pytest")
    if all(status in set(S) for status in graded.values()):
        assert_same_verdict(swebench, log, "pytest", fail_to_pass, pass_to_pass, exit_code)
    else:
        assert_never_more_lenient(swebench, log, "pytest", fail_to_pass, pass_to_pass, exit_code)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(UNITTEST_RESULT_LINE, max_size=12),
    fail_to_pass=st.lists(st.sampled_from(UNITTEST_IDS), min_size=1, max_size=3),
    pass_to_pass=st.lists(st.sampled_from(UNITTEST_IDS), max_size=3),
    exit_code=EXIT_CODES,
)
def test_random_unittest_logs_without_ok_lines(
    swebench: SimpleNamespace,
    lines: list[str],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    exit_code: int | None,
) -> None:
    log = "\n".join(lines)
    assert statuses(log, "unittest") == swebench_statuses(swebench, log, "unittest")
    assert_same_verdict(swebench, log, "unittest", fail_to_pass, pass_to_pass, exit_code)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(UNITTEST_LINE, max_size=12),
    fail_to_pass=st.lists(st.sampled_from(UNITTEST_IDS), min_size=1, max_size=3),
    pass_to_pass=st.lists(st.sampled_from(UNITTEST_IDS), max_size=3),
)
def test_random_unittest_logs(
    swebench: SimpleNamespace, lines: list[str], fail_to_pass: list[str], pass_to_pass: list[str]
) -> None:
    # Without an exit status: with one, swebench can refuse a log that this copy grades (its
    # misread FAIL, deviation 2, leaves no failure to explain the status; see below).
    log = "\n".join(lines)
    assert_never_more_lenient(swebench, log, "unittest", fail_to_pass, pass_to_pass, None)


def test_deviation_2_with_an_exit_status(swebench: SimpleNamespace) -> None:
    log = "b (m.C.b) ... ok\na (m.C.a) ... FAIL\nokay\n"
    # swebench reads a as PASSED, so nothing explains the exit status and it refuses the log.
    assert swebench_grade(swebench, log, "unittest", ["b (m.C.b)"], [], 1) == (False, None)
    assert grading.grade(log, "unittest", ["b (m.C.b)"], [], exit_code=1).resolved
    assert not grading.grade(log, "unittest", ["b (m.C.b)"], ["a (m.C.a)"], exit_code=1).resolved
