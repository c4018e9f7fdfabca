"""A multimodal job through every service as separate processes, on real components (nats-server
with JetStream, nx-27017): the shipped `synthetic_multimodal` dataset (Mem-Gallery format) run
as a smoke job of the multimodal track against the participant simulator, which records every
request it receives. The answer model is the LLM stand-in (aml_llm_standin, deterministic
replies), configured as the local stack configures its text-only model
(AML_ANSWER_MODEL_IMAGES=false): images reach the participant, the answer model reads text.

What is checked is what the participant received (Add messages with the bundle's images as PNG
data URLs, Search queries with the question's image) and what an auditor can read (F1-only
scores, no judge call, results headlined by F1)."""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_support import accepted_bodies, job_results, submit_and_wait
from pymongo import MongoClient

from aml_devtools.platform import PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.datasets import Dataset, Turn
from aml_evaluation.registry import PACKAGE_DATA_DIR, load_dataset
from aml_llm_standin import create_app
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.server import serve_in_thread

pytestmark = pytest.mark.integration

if find_executable("nats-server") is None or find_executable("nx-27017") is None:
    pytest.skip("nats-server or nx-27017 is not installed", allow_module_level=True)

DATASET = "synthetic_multimodal"
# The bundle's images, read here from the package files, not through the platform's loader.
IMAGES = PACKAGE_DATA_DIR / "synthetic_multimodal" / "image"
PNG_DATA_URL = "data:image/png;base64,"
JOB_TIMEOUT = 300.0


@dataclass
class Run:
    job_id: str
    status: dict[str, Any]
    results: dict[str, Any]
    adds: list[dict[str, Any]]
    searches: list[dict[str, Any]]
    scores: list[dict[str, Any]]
    job: dict[str, Any]
    llm_calls: dict[str, int]
    llm_messages: list[list[dict[str, Any]]]


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    # Shipped inside the package: no datasets root is read.
    return load_dataset(DATASET, Path("/nonexistent"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    simulator = Simulator(Script())
    data_dir = tmp_path_factory.mktemp("platform")
    with (
        serve_in_thread(create_app(0.0, 16)) as llm_url,
        running_simulator(simulator) as participant_url,
        EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as stack,
    ):
        stack.start_infra()
        config = PlatformConfig(
            datasets_root=tmp_path_factory.mktemp("datasets"),
            llm_concurrency=8,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm_url}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                # As for the local stack's SmolLM2: the answer model is told of images in text.
                "AML_ANSWER_MODEL_IMAGES": "false",
            },
        )
        platform = start_platform(stack, config)
        version_id, key = register_participant(
            platform, participant_url, "team-mm", "sim-mm", track="multimodal"
        )
        job = {
            "version_id": version_id,
            "mode": "smoke",
            "track": "multimodal",
            "run_label": "multimodal",
            "datasets": [DATASET],
        }
        job_id, status = submit_and_wait(platform.gateway_url, key, job, JOB_TIMEOUT)
        mongo: MongoClient[dict[str, Any]]
        with MongoClient(platform.stack.mongo_url) as mongo:
            scores: list[dict[str, Any]] = list(mongo["aml"]["scores"].find({"job_id": job_id}))
            stored_job = mongo["aml"]["jobs"].find_one({"_id": job_id}) or {}
        llm_calls = httpx.get(f"{llm_url}/stats", timeout=10).json()["by_kind"]
        llm_messages = httpx.get(f"{llm_url}/requests", timeout=10).json()["requests"]
        yield Run(
            job_id=job_id,
            status=status,
            results=job_results(platform.gateway_url, key, job_id),
            adds=accepted_bodies(simulator.requests, "add"),
            searches=accepted_bodies(simulator.requests, "search"),
            scores=scores,
            job=stored_job,
            llm_calls=llm_calls,
            llm_messages=llm_messages,
        )


def _user(run: Run, conversation_id: str) -> str:
    return f"eval:{run.job_id}:{DATASET}:{conversation_id}"


def _assert_image_parts(parts: list[dict[str, Any]], references: tuple[str, ...]) -> None:
    """`parts` are image_url parts carrying the PNG files `references` name, in order."""
    assert [part["type"] for part in parts] == ["image_url"] * len(references)
    for part, reference in zip(parts, references, strict=True):
        url = part["image_url"]["url"]
        assert url.startswith(PNG_DATA_URL), url[:40]
        decoded = base64.b64decode(url.removeprefix(PNG_DATA_URL), validate=True)
        assert decoded == (IMAGES / reference).read_bytes(), reference


def _assert_message_of(message: dict[str, Any], turn: Turn) -> None:
    assert message["role"] == turn.speaker
    if not turn.images:
        assert message["content"] == turn.text
        return
    text, *images = message["content"]
    assert text == {"type": "text", "text": turn.text}
    _assert_image_parts(images, turn.images)


def test_the_job_completes_on_the_multimodal_track(run: Run) -> None:
    assert run.status["state"] == "completed", run.status
    assert run.status["errors"] == [] and run.status["track"] == "multimodal"
    # The chunk rule its Adds were planned with is recorded on the job.
    assert run.job["chunkers"] == {DATASET: "chunk-mm-v1"}


def test_adds_carry_each_turns_images_as_png_data_urls(run: Run, dataset: Dataset) -> None:
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for add in run.adds:
        by_user[add["user_id"]].append(add)
    assert set(by_user) == {_user(run, c.conversation_id) for c in dataset.conversations}
    images_sent = 0
    for conversation in dataset.conversations:
        adds = by_user[_user(run, conversation.conversation_id)]
        adds.sort(key=lambda add: int(add["request_id"].rsplit("-", 1)[1]))
        messages = [message for add in adds for message in add["messages"]]
        turns = [turn for session in conversation.sessions for turn in session.turns]
        assert len(messages) == len(turns)
        for message, turn in zip(messages, turns, strict=True):
            _assert_message_of(message, turn)
            images_sent += len(turn.images)
    # Both kinds are there: the check above covered image turns and plain ones.
    assert images_sent == 8
    assert any(isinstance(m["content"], str) for add in run.adds for m in add["messages"])


def test_questions_showing_an_image_search_with_it(run: Run, dataset: Dataset) -> None:
    assert len(run.searches) == len(dataset.questions) == 11
    searched: dict[tuple[str, str], Any] = {}
    for search in run.searches:
        query = search["query"]
        text = query if isinstance(query, str) else query[0]["text"]
        searched[(search["user_id"], text)] = query
    shown = 0
    for question in dataset.questions:
        query = searched[(_user(run, question.conversation_id), question.question)]
        if not question.images:
            assert query == question.question
            continue
        shown += 1
        text, *images = query
        assert text == {"type": "text", "text": question.question}
        _assert_image_parts(images, question.images)
    assert shown == 3


def test_results_are_f1_only_and_no_judge_was_asked(run: Run, dataset: Dataset) -> None:
    results = run.results
    assert results["track"] == "multimodal", results
    cells = results["datasets"][DATASET]
    assert cells["f1_variant"] == "f1-memgallery-v1"
    for cell in [cells["overall"], *cells["categories"].values()]:
        assert cell["headline"] == "f1_mean" and cell["f1_mean"] is not None, cell
    assert cells["overall"]["questions"] == 11
    # Every question was scored by token F1 alone: no judge verdict and no judge call stored.
    assert len(run.scores) == 11
    for score in run.scores:
        assert score["f1"] is not None and score["f1_version"] == "f1-memgallery-v1", score
        assert score.get("judge_label") is None and score.get("judge_calls") is None, score
        assert not score.get("judge_replies"), score
    # The model was asked each question once, as an answer model, and read text only.
    assert run.llm_calls == {"answer": len(dataset.questions)}
    assert run.llm_messages and all(
        isinstance(message["content"], str) for messages in run.llm_messages for message in messages
    )
