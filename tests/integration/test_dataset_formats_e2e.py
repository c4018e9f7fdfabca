"""Whole jobs on the operator dataset formats, through every service as separate processes on
real components (nats-server with JetStream, nx-27017): a small LongMemEval file and a small
PersonaMem bundle (its two files), written here under a fresh datasets root and registered as an
operator does (`aml_evaluation.registration.register_dataset`, what `aml dataset add` runs), then
run as smoke jobs against the participant simulator, which records every request it receives.
The answer and judge model is the LLM stand-in (aml_llm_standin, deterministic replies), behind
a recorder that keeps every prompt sent.

The assertions are what a participant (the requests that arrived) and an auditor (the stored
records and the results) can check; they say nothing of the model's quality."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_support import submit_and_wait
from pymongo import MongoClient

from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_devtools.tables import render_results
from aml_evaluation.registration import register_dataset
from aml_llm_standin import create_app
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.recording import RequestRecord
from aml_participant_simulator.server import serve_in_thread

pytestmark = pytest.mark.integration

if find_executable("nats-server") is None or find_executable("nx-27017") is None:
    pytest.skip("nats-server or nx-27017 is not installed", allow_module_level=True)

JOB_TIMEOUT = 300.0
LONGMEMEVAL = "lme-e2e"
PERSONAMEM = "pm-e2e"

# --- the datasets -----------------------------------------------------------------------------


def _turns(*texts: str) -> list[dict[str, str]]:
    return [
        {"role": "user" if index % 2 == 0 else "assistant", "content": text}
        for index, text in enumerate(texts)
    ]


# Three instances, each its own user. The first lists its sessions out of date order (as the
# oracle file does): they must be written in date order. The second is an abstention question.
LONGMEMEVAL_INSTANCES: list[dict[str, Any]] = [
    {
        "question_id": "lme-q1",
        "question_type": "single-session-user",
        "question": "What is the name of my dog?",
        "answer": "Rex",
        "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": ["s-late", "s-early"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/02 (Tue) 09:15"],
        "haystack_sessions": [
            _turns("I walked my dog Rex in the park today.", "Rex sounds like a happy dog."),
            _turns("I am moving to a flat with a garden.", "A garden is lovely for a pet."),
        ],
        "answer_session_ids": ["s-late"],
    },
    {
        "question_id": "lme-q2_abs",
        "question_type": "multi-session",
        "question": "How many violin lessons did I take last month?",
        "answer": "The user never mentioned violin lessons.",
        "question_date": "2023/07/10 (Mon) 18:30",
        "haystack_session_ids": ["t-1", "t-2"],
        "haystack_dates": ["2023/07/01 (Sat) 08:00", "2023/07/05 (Wed) 20:45"],
        "haystack_sessions": [
            _turns("My piano teacher praised my scales.", "Well done on the scales."),
            _turns("I bought new piano sheet music.", "Enjoy playing the new pieces."),
        ],
    },
    {
        "question_id": "lme-q3",
        "question_type": "temporal-reasoning",
        "question": "How many days before my trip to Lisbon did I renew my passport?",
        "answer": "10 days",
        "question_date": "2023/09/01 (Fri) 12:00",
        "haystack_session_ids": ["u-1"],
        "haystack_dates": ["2023/08/01 (Tue) 09:00"],
        "haystack_sessions": [
            _turns(
                "I renewed my passport on August 1st.",
                "Good, you are ready to travel.",
                "My trip to Lisbon starts on August 11th.",
                "Lisbon is beautiful in August.",
            )
        ],
    },
]

PERSONAMEM_SYSTEM = "PERSONA CARD: the user is a retired chemist who loves hiking."
PERSONAMEM_CONTEXTS: dict[str, list[dict[str, str]]] = {
    "ctx-a": [
        {"role": "system", "content": PERSONAMEM_SYSTEM},
        {"role": "user", "content": "User: I started drinking green tea every morning."},
        {"role": "assistant", "content": "Assistant: Green tea is a fine habit."},
        {"role": "system", "content": "Setting: a conversation about travel plans."},
        {"role": "user", "content": "I now prefer trains over planes for short trips."},
        {"role": "assistant", "content": "Trains are relaxing and scenic."},
    ],
    "ctx-b": [
        {"role": "user", "content": "I am learning to bake sourdough bread."},
        {"role": "assistant", "content": "Sourdough takes patience."},
    ],
}
# (question_id, context, type, question, options, correct label); every end index is the end of
# its context, so the assertions hold whether a question is asked there or after all Adds.
PERSONAMEM_QUESTIONS = [
    ("pm-1", "ctx-a", "recall_user_shared_facts", "What do I drink every morning?",
     ["(a) Coffee", "(b) Green tea", "(c) Orange juice"], "(b)"),
    ("pm-2", "ctx-a", "acknowledge_latest_user_preferences",
     "How should I travel to a nearby city?",
     ["(a) By plane", "(b) By car", "(c) By train", "(d) On foot"], "(c)"),
    ("pm-3", "ctx-b", "suggest_new_ideas", "What could I bake next weekend?",
     ["(a) A rye sourdough loaf", "(b) Nothing at all"], "(a)"),
]  # fmt: skip


CONTEXTS = list(PERSONAMEM_CONTEXTS.items())


def _personamem_files() -> tuple[bytes, bytes]:
    """(questions .csv, shared contexts .jsonl) in the released files' layout."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["persona_id", "question_id", "question_type", "topic", "user_question_or_message",
         "correct_answer", "all_options", "shared_context_id", "end_index_in_shared_context"]
    )  # fmt: skip
    for question_id, context, kind, text, options, correct in PERSONAMEM_QUESTIONS:
        persona = "persona-1" if context == "ctx-a" else "persona-2"
        end = len(PERSONAMEM_CONTEXTS[context])
        writer.writerow(
            [persona, question_id, kind, "misc", text, correct, json.dumps(options), context, end]
        )
    contexts = "".join(f"{json.dumps({name: messages})}\n" for name, messages in CONTEXTS)
    return out.getvalue().encode(), contexts.encode()


def _register_personamem(root: Path) -> None:
    """Both files of the bundle placed under the datasets root and registered together, as
    `aml dataset add questions.csv shared_contexts.jsonl --format personamem` does."""
    questions, contexts = _personamem_files()
    folder = root / "personamem"
    folder.mkdir()
    named = (("questions_e2e.csv", questions), ("shared_contexts_e2e.jsonl", contexts))
    for name, content in named:
        (folder / name).write_bytes(content)
    done = register_dataset(
        [folder / name for name, _ in named], "personamem", PERSONAMEM, root, version="e2e"
    )
    assert [entry.path for entry in done.manifest.files] == [
        f"personamem/{name}" for name, _ in named
    ]


# --- the stack --------------------------------------------------------------------------------


@dataclass
class RecordingLLM:
    """An ASGI wrapper of the LLM stand-in that keeps the prompt of every chat completion."""

    app: Any
    prompts: list[str] = field(default_factory=list)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        messages = json.loads(body)["messages"]
        self.prompts.append(str(messages[-1]["content"]))

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


@dataclass
class Stack:
    platform: Platform
    llm: RecordingLLM
    simulator: Simulator
    participant_url: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("datasets")
    (root / "longmemeval").mkdir()
    lme_file = root / "longmemeval" / "longmemeval_e2e.json"
    lme_file.write_text(json.dumps(LONGMEMEVAL_INSTANCES), encoding="utf-8")
    register_dataset(lme_file, "longmemeval", LONGMEMEVAL, root)
    _register_personamem(root)
    llm = RecordingLLM(create_app(0.0, 16))
    simulator = Simulator(Script())
    data_dir = tmp_path_factory.mktemp("platform")
    with (
        serve_in_thread(llm) as llm_url,
        running_simulator(simulator) as participant_url,
        EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as embedded,
    ):
        embedded.start_infra()
        config = PlatformConfig(
            datasets_root=root,
            llm_concurrency=8,
            answer_context_tokens=2000,
            answer_max_tokens=64,
            judge_max_tokens=64,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm_url}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                "AML_SMOKE_DATASETS": json.dumps([LONGMEMEVAL, PERSONAMEM]),
                "AML_QUOTAS": json.dumps({"smoke_interval": 0}),
            },
        )
        yield Stack(start_platform(embedded, config), llm, simulator, participant_url)


@dataclass
class Run:
    job_id: str
    status: dict[str, Any]
    results: dict[str, Any]
    adds: list[RequestRecord]
    searches: list[RequestRecord]
    prompts: list[str]
    db: dict[str, list[dict[str, Any]]]


def _run(stack: Stack, dataset_id: str) -> Run:
    """A smoke job of a new team on `dataset_id` alone, to its end; what arrived meanwhile."""
    platform = stack.platform
    version_id, key = register_participant(
        platform, stack.participant_url, f"team-{dataset_id}", f"sim-{dataset_id}"
    )
    seen_requests, seen_prompts = len(stack.simulator.requests), len(stack.llm.prompts)
    job = {"version_id": version_id, "run_label": dataset_id, "datasets": [dataset_id]}
    job_id, status = submit_and_wait(platform.gateway_url, key, job, JOB_TIMEOUT)
    assert status["state"] == "completed", status
    results = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{job_id}/results",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert results.status_code == 200, results.text
    requests = stack.simulator.requests[seen_requests:]
    with MongoClient(platform.stack.mongo_url) as mongo:
        db = mongo["aml"]
        stored = {
            name: list(db[name].find({"job_id": job_id}))
            for name in ("questions", "add_chunks", "answers", "scores")
        }
    return Run(
        job_id=job_id,
        status=status,
        results=results.json(),
        adds=[r for r in requests if r.endpoint == "add"],
        searches=[r for r in requests if r.endpoint == "search"],
        prompts=stack.llm.prompts[seen_prompts:],
        db=stored,
    )


def _body(record: RequestRecord) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(record.body)
    return body


# --- LongMemEval ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def longmemeval_run(stack: Stack) -> Run:
    return _run(stack, LONGMEMEVAL)


def test_longmemeval_instances_are_users_written_in_date_order(longmemeval_run: Run) -> None:
    run = longmemeval_run
    assert run.status["errors"] == [] and run.status["track"] == "textual"
    adds, searches = [_body(r) for r in run.adds], [_body(r) for r in run.searches]
    # Each instance is its own user, whose Adds hold only its own haystack's texts.
    users: dict[str, str] = {}  # user id -> question id
    for add in adds:
        for instance in LONGMEMEVAL_INSTANCES:
            texts = {t["content"] for s in instance["haystack_sessions"] for t in s}
            if any(m["content"] in texts for m in add["messages"]):
                assert all(m["content"] in texts for m in add["messages"]), add
                assert (
                    users.setdefault(add["user_id"], instance["question_id"])
                    == (instance["question_id"])
                )
    assert sorted(users.values()) == sorted(i["question_id"] for i in LONGMEMEVAL_INSTANCES)
    # Sessions arrive in date order (the first instance lists them the other way round), every
    # message stamped with its session's date, roles kept and the text unchanged.
    by_user: dict[str, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
    for record, add in zip(run.adds, adds, strict=True):
        by_user[add["user_id"]].append((record.arrived_monotonic, add))
    for user, timeline in by_user.items():
        timeline.sort(key=lambda pair: pair[0])
        stamps = [m["timestamp"] for _, add in timeline for m in add["messages"]]
        assert stamps == sorted(stamps) and None not in stamps
        assert {m["role"] for _, add in timeline for m in add["messages"]} <= {"user", "assistant"}
        if users[user] == "lme-q1":
            assert [add["session_id"].rsplit("s-", 1)[-1] for _, add in timeline] == [
                "early",
                "late",
            ]
    # Its question is searched after every Add of its user, with the question text alone.
    questions = {i["question"]: i for i in LONGMEMEVAL_INSTANCES}
    assert sorted(s["query"] for s in searches) == sorted(questions)
    for record, search in zip(run.searches, searches, strict=True):
        instance = questions[search["query"]]
        assert users[search["user_id"]] == instance["question_id"]
        assert "options" not in search or search["options"] is None
        assert instance["question_date"] not in record.body.decode()
        assert instance["answer"] not in record.body.decode()
        last_add = max(t for t, _ in by_user[search["user_id"]])
        assert record.arrived_monotonic > last_add


def test_longmemeval_judged_by_type_and_dated_for_the_answer_model(longmemeval_run: Run) -> None:
    run = longmemeval_run
    question_of = {q["_id"]: q for q in run.db["questions"]}
    prompts = {question_of[s["_id"]]["question_id"]: s["judge_prompt"] for s in run.db["scores"]}
    assert prompts == {
        "lme-q1": "judge_v1",
        "lme-q2_abs": "judge_longmemeval_abstention_v1",
        "lme-q3": "judge_longmemeval_temporal_v1",
    }
    # The abstention question has no gold: the judge saw the explanation, never an answer.
    abstention = next(q for q in run.db["questions"] if q["question_id"] == "lme-q2_abs")
    assert abstention["gold_answer"] is None
    # The answer model got each question with its date; the judge prompts are the others.
    for instance in LONGMEMEVAL_INSTANCES:
        dated = [p for p in run.prompts if f"Current date: {instance['question_date']}" in p]
        assert dated and all(instance["question"] in p for p in dated)
    results = run.results
    assert results["track"] == "textual"
    dataset = results["datasets"][LONGMEMEVAL]
    assert set(dataset["categories"]) == {
        "single-session-user",
        "multi-session",
        "temporal-reasoning",
    }
    assert dataset["overall"]["questions"] == dataset["overall"]["scored"] == 3
    assert dataset["overall"]["option_questions"] == 0
    assert dataset["overall"]["option_accuracy"] is None


# --- PersonaMem -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def personamem_run(stack: Stack, longmemeval_run: Run) -> Run:
    # After the LongMemEval job: the simulator and the recorder are read by arrival.
    return _run(stack, PERSONAMEM)


def test_personamem_search_carries_options_never_the_gold(personamem_run: Run) -> None:
    run = personamem_run
    assert run.status["errors"] == []
    searches = [_body(r) for r in run.searches]
    expected = {
        text: ([o.split(") ", 1)[1] for o in options], options["abcd".index(correct[1])])
        for _, _, _, text, options, correct in PERSONAMEM_QUESTIONS
    }
    assert sorted(s["query"] for s in searches) == sorted(expected)
    for search in searches:
        options, gold_label = expected[search["query"]]
        assert search["options"] == options
        # The gold is one of the options, so it appears only as one of them: never as a field.
        assert set(search) <= {"query", "user_id", "top_k", "options"}
        assert gold_label not in json.dumps(search)
    # System messages (the persona card, the block settings) never reach Add; speaker tags
    # are removed; the roles are kept.
    messages = [m for r in run.adds for m in _body(r)["messages"]]
    contents = [m["content"] for m in messages]
    assert "I started drinking green tea every morning." in contents
    assert all("PERSONA CARD" not in c and not c.startswith("Setting:") for c in contents)
    assert all(not c.startswith(("User:", "Assistant:")) for c in contents)
    assert {m["role"] for m in messages} == {"user", "assistant"}

    # One user per shared context; each question searched after its context's last message.
    def texts(context: str) -> set[str]:
        return {m["content"] for m in PERSONAMEM_CONTEXTS[context]}

    user_of_context = {
        context: {
            add["user_id"]
            for add in map(_body, run.adds)
            if {m["content"] for m in add["messages"]} & texts(context)
        }
        for context in PERSONAMEM_CONTEXTS
    }
    assert all(len(users) == 1 for users in user_of_context.values())
    assert len(set.union(*user_of_context.values())) == 2
    for record, search in zip(run.searches, searches, strict=True):
        context = next(q[1] for q in PERSONAMEM_QUESTIONS if q[3] == search["query"])
        (user,) = user_of_context[context]
        assert search["user_id"] == user
        # Searched after the Add holding its context's last message (its end index).
        final = PERSONAMEM_CONTEXTS[context][-1]["content"]
        last = max(
            r.arrived_monotonic
            for r in run.adds
            if final in {m["content"] for m in _body(r)["messages"]}
        )
        assert record.arrived_monotonic > last
    # The answer model saw the options lettered.
    answers = [p for p in run.prompts if "\nOptions:\n" in p]
    assert len(answers) == len(PERSONAMEM_QUESTIONS)
    assert any("\nA. Coffee\nB. Green tea\nC. Orange juice" in p for p in answers)


def test_personamem_results_carry_option_accuracy(personamem_run: Run) -> None:
    run = personamem_run
    scores = {s["_id"]: s for s in run.db["scores"]}
    assert len(scores) == len(PERSONAMEM_QUESTIONS)
    assert all(s["multiple_choice"] and s.get("judge_prompt") is None for s in scores.values())
    results = run.results
    assert results["track"] == "textual"
    dataset = results["datasets"][PERSONAMEM]
    assert set(dataset["categories"]) == {
        "recall_user_shared_facts",
        "suggest_new_ideas",
        "acknowledge_latest_user_preferences",
    }
    correct = sum(bool(s["choice_correct"]) for s in scores.values())
    readable = sum(s["chosen_option"] is not None for s in scores.values())
    for cell in [*dataset["categories"].values(), dataset["overall"], results["overall"]]:
        assert cell["option_questions"] == cell["scored"] <= cell["questions"]
        assert cell["option_accuracy"] == (
            cell["option_correct"] / cell["option_questions"] if cell["option_questions"] else None
        )
    overall = dataset["overall"]
    assert (overall["option_correct"], overall["option_questions"]) == (correct, readable)
    assert overall["judge_accuracy"] is None and overall["accuracy"] == overall["option_accuracy"]
    # What `aml team results` prints of them: the track, then an MC column with the figure.
    table = render_results(results).splitlines()
    assert table[0].startswith("track textual:") and table[1].split()[-1] == "MC"
    mc = "-" if overall["option_accuracy"] is None else f"{100 * overall['option_accuracy']:.1f}"
    dataset_row = next(
        line for line in table if line.startswith(PERSONAMEM) and "(dataset)" in line
    )
    assert dataset_row.split()[-1] == mc
