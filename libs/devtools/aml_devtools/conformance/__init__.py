"""`aml check`: a participant's own conformance check of its Add/Search/Health endpoints
against the contract (SPEC R-4.2 - R-4.11), before it asks for an evaluation.

- `rules`: what counts as a violation or a warning, as plain functions over what was observed;
- `probe`: the calls to the memory system that observe it (`run_check`);
- `report`: the report's figures and its text and JSON renderings;
- `cli`: the `aml check` arguments and exit codes.
"""

from aml_devtools.conformance.cli import add_arguments, main_from_args
from aml_devtools.conformance.probe import CheckTarget, run_check
from aml_devtools.conformance.report import Report, percentile, render, stats
from aml_devtools.conformance.rules import (
    REPLAY_ADVICE,
    RULES,
    RuleResult,
    call_results,
    empty_rule,
    failure_rule,
    health_rule,
    idempotency_rule,
    isolation_rule,
    merge,
    searchable_rule,
    shown,
    top_k_rule,
    unauthenticated_rule,
    url_rules,
)

__all__ = [
    "REPLAY_ADVICE",
    "RULES",
    "CheckTarget",
    "Report",
    "RuleResult",
    "add_arguments",
    "call_results",
    "empty_rule",
    "failure_rule",
    "health_rule",
    "idempotency_rule",
    "isolation_rule",
    "main_from_args",
    "merge",
    "percentile",
    "render",
    "run_check",
    "searchable_rule",
    "shown",
    "stats",
    "top_k_rule",
    "unauthenticated_rule",
    "url_rules",
]
