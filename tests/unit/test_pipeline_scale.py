"""The load benchmark's scale scenario (`pipeline_load.py --scenario scale`): the generated
LoCoMo-format datasets give exactly the Adds and questions asked for under the platform's own
parser and chunker, and the figures read from the simulator's records and the LLM stand-in's
intervals (chain gaps, gaps at a saturated participant, busy shares, CPU between samples) mean
what docs/performance.md says; and the embedded stack takes an external MongoDB's URL."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from scripts import load_benchmark

from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.chunker import plan_adds
from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import load_dataset
from aml_participant_simulator import RequestRecord


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("pipeline_load_scale")


def test_a_generated_dataset_has_the_adds_questions_and_users_asked_for(
    bench: ModuleType, tmp_path: Path
) -> None:
    size = bench.Size(adds=45, questions=22, users=4)
    path = tmp_path / "scale" / f"{size.dataset_id}.json"
    bench.write_scale_dataset(path, size)
    first = path.read_bytes()
    bench.write_scale_dataset(path, size)
    assert path.read_bytes() == first, "the same size and seed give the same bytes"
    # Registered the operator's way (what `aml dataset add` calls), parsed by the platform.
    done = register_dataset([path], "locomo", size.dataset_id, tmp_path)
    assert done.manifest.question_counts is not None
    assert sum(done.manifest.question_counts.values()) == 22
    assert {c for c, n in done.manifest.question_counts.items() if n} <= {1, 2, 3, 4}
    dataset = load_dataset(size.dataset_id, tmp_path)
    adds = plan_adds(dataset, "run-1")
    assert len(adds) == 45 and len(dataset.conversations) == 4
    assert sorted(len({a.seq for a in adds if a.conversation_id == c.conversation_id})
                  for c in dataset.conversations) == [11, 11, 11, 12]  # fmt: skip
    turns = {t.turn_id for c in dataset.conversations for s in c.sessions for t in s.turns}
    assert all(set(q.evidence) <= turns and q.answer for q in dataset.questions)


def test_sizes_are_parsed_smallest_first_and_refused_when_impossible(bench: ModuleType) -> None:
    sizes = bench.parse_sizes("1200/400/12, 400/200/8")
    assert [s.label for s in sizes] == ["400/200/8", "1200/400/12"]
    for wrong in ("400/200", "4/200/8", "400/4/8", "", "a/b/c"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_sizes(wrong)


def _record(
    seq: int, endpoint: str, body: dict[str, Any], arrived: float, finished: float,
    status: int = 200,
) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        seq=seq,
        endpoint=endpoint,
        method="POST",
        path=f"/{endpoint}",
        query_string="",
        headers=[],
        body=json.dumps(body).encode(),
        arrived_monotonic=arrived,
        arrived_at=datetime.fromtimestamp(1_800_000_000 + arrived, UTC),
        finished_monotonic=finished,
        concurrency_at_arrival=1,
        total_concurrency_at_arrival=1,
        outcome="ok" if status == 200 else "reject_429",
        status=status,
        latency_s=finished - arrived,
    )


def _add(
    seq: int, user: str, request: str, arrived: float, finished: float, status: int = 200
) -> RequestRecord:
    return _record(seq, "add", {"user_id": user, "request_id": request}, arrived, finished, status)


def test_chain_gaps_run_from_an_answer_to_the_same_users_next_add(bench: ModuleType) -> None:
    records = [
        _add(0, "u1", "a1", 0.00, 0.01),
        _add(1, "u2", "b1", 0.00, 0.01),
        _add(2, "u1", "a2", 0.11, 0.12),  # 100 ms after a1's answer
        _add(3, "u2", "b2", 0.02, 0.03, status=429),  # refused, then sent again
        _add(4, "u2", "b2", 0.51, 0.52),
        _add(5, "u1", "a3", 0.13, 0.14),  # 10 ms
    ]
    gaps = sorted(bench.chain_gaps_ms(records))
    assert gaps == pytest.approx([10.0, 10.0, 100.0])  # b1 -> b2: to b2's first attempt
    assert bench.conversations_written(records) == {"u1": 0.14, "u2": 0.52}


def test_free_slot_chain_gaps_leave_out_links_that_waited_for_capacity(
    bench: ModuleType,
) -> None:
    records = [
        _add(0, "u1", "a1", 0.00, 0.10),
        _add(1, "u2", "b1", 0.00, 0.05),
        # u2's next Add 10 ms after b1's answer, with u1's in flight: one of two slots free.
        _add(2, "u2", "b2", 0.06, 0.30),
        # u1's next: 100 ms after a1's answer, both slots held by u2 and u3 from 0.12 to 0.20.
        _add(3, "u3", "c1", 0.12, 0.20),
        _add(4, "u1", "a2", 0.20, 0.40),
    ]
    assert sorted(bench.chain_gaps_ms(records)) == pytest.approx([10.0, 100.0])
    assert bench.free_slot_chain_gaps_ms(records, capacity=2) == pytest.approx([10.0])
    assert sorted(bench.free_slot_chain_gaps_ms(records, capacity=3)) == pytest.approx(
        [10.0, 100.0]
    )


def test_gaps_at_a_saturated_participant_count_only_while_work_was_due(
    bench: ModuleType,
) -> None:
    search = {"user_id": "u1", "query": "q", "top_k": 5}
    records = [
        _add(0, "u1", "a1", 1.00, 1.08),
        _add(1, "u2", "b1", 1.09, 1.17),  # due since the start: 10 ms after a1's answer
        _add(2, "u1", "a2", 1.18, 1.26),  # due at 1.08: 10 ms
        _add(3, "u2", "b2", 1.27, 1.35),
        # u1's last Add was answered at 1.26: its Search was due, 5 ms
        _record(4, "search", search, 1.36, 1.44),
        # nothing arrives after it: no gap
    ]
    gaps = bench.queued_gaps_ms(records, job_start=0.0)
    assert gaps == pytest.approx([10.0, 10.0, 10.0, 10.0])
    # The same gaps by what was answered and what came next (a hand-off between services).
    by = bench.queued_gaps_by_transition(records, job_start=0.0)
    assert {name: figures["count"] for name, figures in by.items()} == {
        "add -> add": 3,
        "add -> search": 1,
    }
    assert by["add -> search"]["p50"] == pytest.approx(10.0)
    bound = bench.participant_bound(records)
    assert bound["wall_s"] == pytest.approx(0.44) and bound["service_s"] == pytest.approx(0.40)
    # A user's next Add is due the moment its previous one is answered.
    chain = [_add(0, "u1", "a1", 0.0, 0.1), _add(1, "u1", "a2", 0.5, 0.6)]
    assert bench.queued_gaps_ms(chain, job_start=0.0) == pytest.approx([400.0])
    # Nothing was due when a1 was answered (the job started, as far as b1 goes, at 0.3).
    others = [_add(0, "u1", "a1", 0.0, 0.1), _add(1, "u2", "b1", 0.5, 0.6)]
    assert bench.queued_gaps_ms(others, job_start=0.0) == pytest.approx([400.0])
    assert bench.queued_gaps_ms(others, job_start=0.3) == []


def test_busy_share_and_mean_in_flight_over_a_window(bench: ModuleType) -> None:
    intervals = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (9.0, 12.0)]
    figures = bench.busy_figures(intervals, 1.0, 11.0)
    # busy 1-3, 5-6, 9-11 = 5 of 10 s; in flight 1 + 2 + 1 + 2 = 6 s
    assert figures == {"window_s": 10.0, "busy": 0.5, "mean_in_flight": 0.6}
    assert bench.busy_figures(intervals, 4.0, 4.0)["busy"] is None
    # The calls' own time bounds the busy share: 6 s of calls cannot cover more than 6 of 10 s.
    assert bench._ceiling(figures) == pytest.approx(0.6) and figures["busy"] <= 0.6
    assert bench._ceiling({"mean_in_flight": 2.7}) == 1.0
    assert bench._ceiling({"mean_in_flight": None}) is None


def test_cpu_between_samples_is_interpolated_and_grouped(bench: ModuleType) -> None:
    samples = [
        (0.0, {"scheduler": 1.0, "nats": 0.0, "mongo": 0.0}),
        (2.0, {"scheduler": 3.0, "nats": 1.0, "mongo": 2.0}),
        (4.0, {"scheduler": 3.0, "nats": 1.0, "mongo": 4.0}),
    ]
    between = bench.cpu_between(samples, 1.0, 3.0)
    assert between == pytest.approx({"scheduler": 1.0, "nats": 0.5, "mongo": 2.0})
    groups = bench.cpu_groups(between, items=10)
    assert groups == {"services": 100.0, "nats": 50.0, "database": 200.0, "platform": 350.0}
    # An external MongoDB is no process of the stack: its CPU is not measured.
    assert bench.cpu_groups({"scheduler": 1.0}, items=10)["database"] is None


def test_the_stack_hands_an_external_mongodb_url_to_its_services(tmp_path: Path) -> None:
    url = "mongodb://db.example:27017/?replicaSet=rs0"
    stack = EmbeddedStack(
        StackConfig(data_dir=tmp_path, start_llm=False, start_mongo=False, mongo_url=url)
    )
    assert stack.mongo_url == url and stack.env()["AML_MONGO_URL"] == url
    assert stack.info().mongo_url == url
    with pytest.raises(ValueError, match="start_mongo"):
        StackConfig(data_dir=tmp_path, start_llm=False, mongo_url=url)


def test_where_one_jobs_wall_goes_against_the_llm(bench: ModuleType) -> None:
    records = [
        _add(0, "u1", "a1", 12.0, 12.5),
        _add(1, "u1", "a2", 12.6, 13.0),  # u1 written at 13.0
        _add(2, "u2", "b1", 12.1, 14.0),
        _record(3, "search", {"user_id": "u1", "query": "q"}, 13.5, 13.6),
    ]
    # Two slots: from 13.0 to 20.0 (7 s, 14 slot-seconds), 10.5 s of calls in flight.
    intervals = [(13.5, 17.0), (14.0, 18.0), (17.0, 20.0)]
    parts = bench.wall_parts(10.0, 21.5, records, intervals, capacity=2)
    assert parts == {
        "plan_s": 2.0,
        "until_written_s": 1.0,
        "llm_used": 0.75,
        "llm_unused_s": 1.8,
        "llm_after_last_search_s": 6.5,
        "completion_s": 1.5,
    }
    # Nothing written, no call: what cannot be told is None.
    empty = bench.wall_parts(10.0, 11.0, [], [], capacity=2)
    assert empty["plan_s"] is None and empty["llm_used"] is None and empty["completion_s"] is None


def test_cpu_by_stage_charges_each_workers_cpu_to_its_own_kind_of_item(
    bench: ModuleType,
) -> None:
    """The split by who does the work, whatever the time windows: the adder's 2 s over 4 Adds,
    the question stages' 1 + 2 + 3 s over 10 questions, and the scheduler's, nats-server's and
    the database's 1 + 0.4 + 2.8 s over the 14 items (the simulator and the LLM stand-in are
    not the platform's)."""
    start = {"adder": 0.0, "searcher": 0.0, "answerer": 0.0, "scorer": 0.0, "scheduler": 0.0,
             "nats": 0.0, "mongo": 0.0, "sim-scale": 0.0, "llm-standin": 0.0}  # fmt: skip
    end = {"adder": 2.0, "searcher": 1.0, "answerer": 2.0, "scorer": 3.0, "scheduler": 1.0,
           "nats": 0.4, "mongo": 2.8, "sim-scale": 9.0, "llm-standin": 9.0}  # fmt: skip
    records = [_add(0, "u1", "a1", 10.0, 10.1), _add(1, "u1", "a2", 10.5, 11.0)]
    run = bench.JobRun(None, "j", 9.0, {}, [(9.0, start), (16.0, end)], records, {}, [])
    moments = {"first_add": 10.0, "last_add": 10.5, "finished": 16.0, "first_written": 11.0}
    cpu = bench.scale_cpu(run, moments, adds=4, questions=10)
    assert cpu["by_stage"] == {"add": 500.0, "question": 600.0, "shared": 300.0}


def test_cpu_per_add_is_the_adds_alone_and_questions_pay_the_rest(bench: ModuleType) -> None:
    """A job of 4 Adds (two users) and 10 questions. The first user is written at 11 s, so the
    Adds run alone from 10 to 11 s: 2 Adds for 1 s of scheduler CPU, 0.5 s each. From 10 s to
    the end 6 s were spent; the 4 Adds are charged 2 s, the 10 questions the other 4 s. A split
    by time would have charged the Add phase (10 -> 13 s) to the Adds: 1 s each."""
    records = [
        _add(0, "u1", "a1", 10.0, 10.1),
        _add(1, "u1", "a2", 10.5, 11.0),  # u1 written at 11.0
        _add(2, "u2", "b1", 12.0, 12.1),
        _add(3, "u2", "b2", 13.0, 13.1),
    ]
    samples = [(9.0, {"scheduler": 0.0}), (10.0, {"scheduler": 1.0}),
               (11.0, {"scheduler": 2.0}), (16.0, {"scheduler": 7.0})]  # fmt: skip
    run = bench.JobRun(None, "j", 9.0, {}, samples, records, {}, [])
    moments = {"first_add": 10.0, "last_add": 13.0, "finished": 16.0, "first_written": 11.0}
    cpu = bench.scale_cpu(run, moments, adds=4, questions=10)
    assert cpu["per_add_over"] == "adds alone"
    assert cpu["per_add"]["services"] == pytest.approx(500.0)
    assert cpu["per_question"]["services"] == pytest.approx(400.0)
    assert cpu["per_item"]["services"] == pytest.approx(7000.0 / 14)
    # When a user is written at once (under a tenth of the Adds alone), the whole Add phase is
    # the Adds' window.
    moments["first_written"] = 10.05
    many = [_add(i, f"u{i}", f"r{i}", 10.0 + i * 0.3, 10.1 + i * 0.3) for i in range(11)]
    run = bench.JobRun(None, "j", 9.0, {}, samples, many, {}, [])
    cpu = bench.scale_cpu(run, moments, adds=11, questions=10)
    assert cpu["per_add_over"] == "add phase"
    assert cpu["per_add"]["services"] == pytest.approx(3000.0 / 11, abs=0.01)
