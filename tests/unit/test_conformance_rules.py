"""The `aml check` rules as pure functions over observed responses."""

from __future__ import annotations

import pytest

from aml_contract.participant import SearchItem
from aml_devtools.conformance import (
    REPLAY_ADVICE,
    RULES,
    Report,
    RuleResult,
    call_results,
    empty_rule,
    failure_rule,
    health_rule,
    idempotency_rule,
    isolation_rule,
    merge,
    percentile,
    render,
    searchable_rule,
    shown,
    stats,
    top_k_rule,
    unauthenticated_rule,
    url_rules,
)
from aml_pipeline.participants import CallFailed, validate_search_response


def item(id_: str, content: str) -> SearchItem:
    return SearchItem(id=id_, content=content, score=1.0)


def test_percentiles_are_observed_values_by_nearest_rank() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 7.0, 8.0, 9.0]
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.9) == 9.0
    summary = stats(values)
    assert summary is not None and (summary.p50, summary.p90, summary.max) == (5.0, 9.0, 10.0)
    assert stats([]) is None
    assert percentile([7.0], 0.9) == 7.0


def test_received_body_masks_the_key_and_is_truncated() -> None:
    body = b'{"echo":"Bearer s3cret-key"}' + b"x" * 1000
    text = shown(body, "s3cret-key")
    assert text is not None
    assert "s3cret-key" not in text and "[key]" in text
    assert len(text) < 350 and text.endswith("characters)")
    assert shown(None, "k") is None


@pytest.mark.parametrize(
    ("status", "expected"), [(200, "pass"), (204, "pass"), (503, "fail"), (None, "fail")]
)
def test_health_is_any_2xx(status: int | None, expected: str) -> None:
    verdict = health_rule(status, None)
    assert verdict.status == expected
    assert (verdict.fix is None) == (expected == "pass")


def test_urls_refused_and_http_warned() -> None:
    assert url_rules(["https://memory.example.com/add"]).status == "pass"
    local = url_rules(["http://127.0.0.1:8400/add"])
    assert local.status == "warn" and "loopback" in local.detail and "plain http" in local.detail
    assert "plain http" not in url_rules(["https://[::1]/add"]).detail
    refused = url_rules(["http://10.0.0.5/add"])
    assert refused.status == "fail" and "10.0.0.5" in refused.detail
    assert url_rules(["ftp://memory.example.com/add"]).status == "fail"


@pytest.mark.parametrize(
    ("operation", "failure", "rule"),
    [
        ("add", CallFailed("authentication_error", "add: HTTP 401"), "auth.accepted"),
        ("search", CallFailed("access_denied", "search: HTTP 403"), "auth.accepted"),
        ("add", CallFailed("contract_error", "add response: success must be true"), "add.response"),
        ("add_status", CallFailed("participant_outage", "not finished"), "add.response"),
        (
            "search",
            CallFailed("contract_error", "search response: 3 items exceed top_k=2"),
            "search.top_k",
        ),
        ("search", CallFailed("wrong_url", "search: HTTP 404"), "search.shape"),
    ],
)
def test_failures_are_attributed_to_the_rule_they_break(
    operation: str, failure: CallFailed, rule: str
) -> None:
    assert failure_rule(operation, failure) == rule  # type: ignore[arg-type]


def test_call_results_fail_one_rule_and_skip_the_unchecked_one() -> None:
    failure = CallFailed("authentication_error", "add: the participant rejected (HTTP 401)")
    verdicts = call_results("add", "add.response", failure, '{"detail":"no"}')
    assert [(v.rule, v.status) for v in verdicts] == [
        ("auth.accepted", "fail"),
        ("add.response", "skip"),
    ]
    assert verdicts[0].received == '{"detail":"no"}' and verdicts[0].fix
    ok = call_results("search", "search.shape", None, None)
    assert {(v.rule, v.status) for v in ok} == {("search.shape", "pass"), ("auth.accepted", "pass")}


def test_validator_failures_map_to_shape_or_top_k() -> None:
    # The platform's own validator produces the reasons the rules classify.
    for payload, rule in (
        ({"items": []}, "search.shape"),
        ([], "search.shape"),
        ({"data": [{"id": "1", "content": "a"}] * 3}, "search.top_k"),
    ):
        with pytest.raises(CallFailed) as caught:
            validate_search_response(payload, 2)
        assert failure_rule("search", caught.value) == rule


def test_searchable_needs_the_marker_in_some_item() -> None:
    assert searchable_rule([item("1", "my zq1 notebook")], "zq1").status == "pass"
    missing = searchable_rule([item("1", "something else")], "zq1")
    assert missing.status == "fail" and "1 items: 1" in missing.detail
    assert searchable_rule([], "zq1").status == "fail"
    assert searchable_rule(None, "zq1").status == "skip"


def test_top_k_and_empty() -> None:
    two = [item("1", "a"), item("2", "b")]
    assert top_k_rule(two, 2, 4).status == "pass"
    assert top_k_rule([*two, item("3", "c")], 2, 4).status == "fail"
    assert top_k_rule(None, 2, 4).status == "skip"
    assert empty_rule([]).status == "pass"
    leaked = empty_rule([item("x", "someone's memory")])
    assert leaked.status == "fail" and "x" in leaked.detail


def test_isolation_by_exact_text_and_by_marker() -> None:
    writes = [("user-a", "I left my zqa notebook here."), ("user-b", "My bike.")]
    exact = isolation_rule("user-b", [item("m1", "I left my zqa notebook here.")], writes, [])
    assert exact.status == "fail" and "m1" in exact.detail
    rewritten = isolation_rule("user-b", [item("m2", "User owns a zqa notebook")], writes, ["zqa"])
    assert rewritten.status == "fail" and "m2" in rewritten.detail
    own = isolation_rule("user-b", [item("m3", "My bike.")], writes, ["zqa"])
    assert own.status == "pass"
    assert isolation_rule("user-b", None, writes, ["zqa"]).status == "skip"


def test_idempotency_counts_the_memory_before_and_after_the_replay() -> None:
    assert idempotency_rule(None, 2, 2, None).status == "pass"
    refused = idempotency_rule(CallFailed("contract_error", "add: unexpected HTTP 409"), 2, 2, "x")
    assert refused.status == "fail" and "409" in refused.detail and refused.received == "x"
    assert refused.fix is not None and "200" in refused.fix
    assert idempotency_rule(None, None, 2, None).status == "skip"


def test_a_replay_stored_twice_is_advice_not_a_violation() -> None:
    # ask a replay to be answered 200, not de-duplicated.
    doubled = idempotency_rule(None, 2, 4, None)
    assert doubled.status == "warn" and "stored twice" in doubled.detail
    assert doubled.fix == REPLAY_ADVICE
    report = Report(results=[doubled], latency_ms={}, response_bytes={})
    assert not report.failed and report.warnings == [doubled]
    text = render(report)
    assert "WARN  add.idempotent" in text and REPLAY_ADVICE in text
    assert "result: conformant, 1 warning(s)" in text


def test_request_without_key_should_be_refused() -> None:
    assert unauthenticated_rule(401, None).status == "pass"
    assert unauthenticated_rule(403, None).status == "pass"
    accepted = unauthenticated_rule(200, '{"data":[]}')
    assert accepted.status == "warn" and accepted.fix and "200" in accepted.detail
    assert unauthenticated_rule(None, None).status == "skip"


def test_merge_keeps_the_worst_verdict_per_rule_in_report_order() -> None:
    verdicts = [
        RuleResult(rule="search.shape", status="pass", detail="first"),
        RuleResult(rule="health", status="pass", detail="ok"),
        RuleResult(rule="search.shape", status="fail", detail="second"),
        RuleResult(rule="search.shape", status="fail", detail="third"),
        RuleResult(rule="search.top_k", status="skip", detail="s"),
    ]
    merged = merge(verdicts)
    assert [v.rule for v in merged] == [r for r in RULES if r in {v.rule for v in verdicts}]
    shape = next(v for v in merged if v.rule == "search.shape")
    assert (shape.status, shape.detail) == ("fail", "second")
