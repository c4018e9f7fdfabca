"""An ATM-Bench job through every service as separate processes, on real components (nats-server
with JetStream, nx-27017, loopback HTTP): a bundle in ATM-Bench's own layout, generated here
(emails, images made with Pillow, a short video encoded with PyAV), registered with
`aml dataset add --format atm-bench`, run as a multimodal smoke job against the participant
simulator, with the LLM stand-in as answer model and judge.

Checked: what the participant received (one Add per memory unit, in time order, each led by its
`ID:` line, images and the video's sampled frames as image parts); how each answer was scored
(exact match, Jaccard, or the benchmark's own judge prompt for open_end answers only); and the
results: QS per answer type and Overall, Recall@k and Joint@k recomputed here from the
candidates the participant returned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from job_support import accepted_bodies, job_results, submit_and_wait
from pymongo import MongoClient

from aml_devtools.cli import main
from aml_devtools.platform import PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.atmbench import synthetic
from aml_evaluation.atmbench.frames import FRAME_COUNT
from aml_evaluation.evidence import EVIDENCE_K
from aml_llm_standin import create_app
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.server import serve_in_thread

pytestmark = pytest.mark.integration

if find_executable("nats-server") is None or find_executable("nx-27017") is None:
    pytest.skip("nats-server or nx-27017 is not installed", allow_module_level=True)

DATASET = "atm-small"
JOB_TIMEOUT = 300.0
UNITS = (*synthetic.EMAIL_IDS, *synthetic.IMAGE_IDS, synthetic.VIDEO_ID)


@dataclass
class Run:
    job_id: str
    status: dict[str, Any]
    results: dict[str, Any]
    adds: list[dict[str, Any]]
    scores: dict[str, dict[str, Any]]
    searches: dict[str, dict[str, Any]]
    llm_calls: dict[str, int]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("datasets")
    synthetic.write_bundle(root / "atm")
    add = ["dataset", "add", str(root / "atm"), "--format", "atm-bench", "--id", DATASET]
    registered = main([*add, "--datasets-root", str(root)])
    assert registered == 0
    simulator = Simulator(Script())
    with (
        serve_in_thread(create_app(0.0, 16)) as llm_url,
        running_simulator(simulator) as participant_url,
        EmbeddedStack(StackConfig(data_dir=tmp_path_factory.mktemp("platform"))) as stack,
    ):
        stack.start_infra()
        config = PlatformConfig(
            datasets_root=root,
            llm_concurrency=8,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm_url}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                "AML_ANSWER_MODEL_IMAGES": "false",
                "AML_SMOKE_DATASETS": json.dumps([DATASET]),
            },
        )
        platform = start_platform(stack, config)
        version_id, key = register_participant(
            platform, participant_url, "team-atm", "sim-atm", track="multimodal"
        )
        job = {
            "version_id": version_id,
            "mode": "smoke",
            "track": "multimodal",
            "run_label": "atm",
            "datasets": [DATASET],
        }
        job_id, status = submit_and_wait(platform.gateway_url, key, job, JOB_TIMEOUT)
        mongo: MongoClient[dict[str, Any]]
        with MongoClient(platform.stack.mongo_url) as mongo:
            db = mongo["aml"]
            scores = {doc["_id"]: doc for doc in db["scores"].find({"job_id": job_id})}
            searches = {doc["_id"]: doc for doc in db["searches"].find({"job_id": job_id})}
        yield Run(
            job_id=job_id,
            status=status,
            results=job_results(platform.gateway_url, key, job_id),
            adds=accepted_bodies(simulator.requests, "add"),
            scores=scores,
            searches=searches,
            llm_calls=httpx.get(f"{llm_url}/stats", timeout=10).json()["by_kind"],
        )


def test_the_job_completes(run: Run) -> None:
    assert run.status["state"] == "completed", json.dumps(run.status)
    assert run.status["errors"] == [] and run.status["platform_failures"] == 0


def test_each_memory_unit_is_one_add_in_time_order_led_by_its_id(run: Run) -> None:
    assert len(run.adds) == len(UNITS)
    messages = [add["messages"] for add in run.adds]
    assert all(len(sent) == 1 for sent in messages)
    stamps = [sent[0]["timestamp"] for sent in messages]
    assert stamps == sorted(stamps)
    ids = []
    for add in run.adds:
        content = add["messages"][0]["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        first_line = text.split("\n", 1)[0]
        assert first_line.startswith("ID: ")
        unit = first_line.removeprefix("ID: ")
        ids.append(unit)
        # One user for the owner, one session per unit.
        assert add["session_id"].endswith(unit)
        images = [] if isinstance(content, str) else content[1:]
        expected = (
            1 if unit in synthetic.IMAGE_IDS else FRAME_COUNT if unit == synthetic.VIDEO_ID else 0
        )
        assert [part["type"] for part in images] == ["image_url"] * expected
    assert sorted(ids) == sorted(UNITS)
    assert len({add["user_id"] for add in run.adds}) == 1


def test_answers_are_scored_by_their_type(run: Run) -> None:
    by_type: dict[str, list[dict[str, Any]]] = {}
    for score in run.scores.values():
        by_type.setdefault(score["answer_type"], []).append(score)
    assert {kind: len(docs) for kind, docs in by_type.items()} == {
        "number": 3,
        "list_recall": 3,
        "open_end": 3,
    }
    for score in by_type["number"]:
        assert score["qs_method"] == "exact_match" and score["qs"] in (0.0, 1.0)
        assert score.get("judge_calls") is None
    for score in by_type["list_recall"]:
        assert score["qs_method"] == "jaccard" and 0.0 <= score["qs"] <= 1.0
        assert score.get("judge_calls") is None
    for score in by_type["open_end"]:
        assert score["qs_method"] == "judge" and score["judge_prompt"] == "judge_atm_v1"
        assert score["qs"] == (1.0 if score["judge_label"] == "CORRECT" else 0.0)
    # The judge was asked about the open_end answers only.
    assert run.llm_calls.get("judge") == 3


def _evidence_ranks_here(search: dict[str, Any], evidence: list[str]) -> dict[str, int | None]:
    """Where each unit's `ID:` line first appears among the returned candidates."""
    texts = []
    for candidate in search["candidates"]:
        content = candidate["content"]
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content]
        texts.append("\n".join(parts))
    return {
        unit: next((rank for rank, text in enumerate(texts, 1) if f"ID: {unit}" in text), None)
        for unit in evidence
    }


def test_qs_and_evidence_recall_in_the_results(run: Run) -> None:
    cell = run.results["datasets"][DATASET]
    assert cell["overall"]["headline"] == run.results["overall"]["headline"] == "qs_mean"
    scores = list(run.scores.values())
    for kind in ("number", "list_recall", "open_end"):
        values = [s["qs"] for s in scores if s["answer_type"] == kind]
        assert cell["categories"][kind]["qs_mean"] == pytest.approx(sum(values) / len(values))
    assert cell["overall"]["qs_mean"] == pytest.approx(sum(s["qs"] for s in scores) / 9)
    # Recall@k and Joint@k from the candidates, recomputed here.
    recalls: dict[int, list[float]] = {k: [] for k in EVIDENCE_K}
    joints: dict[int, list[float]] = {k: [] for k in EVIDENCE_K}
    for item_id, score in run.scores.items():
        evidence = list(score["evidence_ranks"])
        ranks = _evidence_ranks_here(run.searches[item_id], evidence)
        assert score["evidence_ranks"] == ranks
        for k in EVIDENCE_K:
            recall = sum(1 for r in ranks.values() if r is not None and r <= k) / len(ranks)
            recalls[k].append(recall)
            joints[k].append(recall if score["qs"] else 0.0)
    figures = cell["overall"]["evidence"]
    assert figures["questions"] == 9
    for k in EVIDENCE_K:
        assert figures["recall"][str(k)] == pytest.approx(sum(recalls[k]) / 9)
        assert figures["joint"][str(k)] == pytest.approx(sum(joints[k]) / 9)
    # The participant stores what it is given, so its candidates do name the evidence.
    assert figures["recall"]["10"] > 0
    assert run.results["overall"]["evidence"] == figures
    print(f"QS {cell['overall']['qs_mean']:.3f}, evidence {figures}")  # for the report
