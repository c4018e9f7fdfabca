"""NATS subject and stream names: the internal integration surface (SPEC R-8.5).

Work subjects feed the stage workers; event subjects report back to the scheduler. Work is
addressed per participant version and job, `aml.work.<stage>.<version>.<job>`, so that
- a worker fetches a version's work only when that version has free capacity (one durable
  consumer per *lane*: per version for the participant-facing stages add and search, one lane
  for each LLM stage, and one for the score stage's coding attempts, `verify`, whose test runs
  call no LLM), and one version's limits never hold another version's work;
- a failed job's remaining work is purged by subject before anything calls the participant.
Consumers' filter subjects never overlap, which is what lets both streams use work-queue
retention.
"""

import hashlib
import re
from typing import Final, Literal

WORK_STREAM: Final = "AML_WORK"
EVENTS_STREAM: Final = "AML_EVENTS"

JOB_SUBMITTED: Final = "aml.jobs.submitted"
JOB_FINISHED: Final = "aml.jobs.finished"

# `verify` is the score stage's work for a coding attempt, queued apart so that the scorer
# admits it under its sandboxes' bound rather than the LLM's (aml_pipeline.question_stage).
WorkStage = Literal["add", "search", "answer", "score", "verify"]
WORK_ADD: Final = "aml.work.add"
WORK_SEARCH: Final = "aml.work.search"
WORK_ANSWER: Final = "aml.work.answer"
WORK_SCORE: Final = "aml.work.score"
WORK_VERIFY: Final = "aml.work.verify"
WORK_PREFIX: Final[dict[WorkStage, str]] = {
    "add": WORK_ADD,
    "search": WORK_SEARCH,
    "answer": WORK_ANSWER,
    "score": WORK_SCORE,
    "verify": WORK_VERIFY,
}
# Core NATS (not stored): a worker that frees a capacity credit says so, so workers of other
# processes waiting for that key's capacity look again at once instead of at their next poll.
CAPACITY_FREED: Final = "aml.capacity.freed"
# Core NATS (not stored): a capacity key's outage was declared, resumed or ended
# (aml_pipeline.outages); the body is the key. Every worker re-reads that key's pause.
LANE_OUTAGE: Final = "aml.lanes.outage"
# Core NATS (not stored): a stage was refused a capacity key's slot while it had work for it;
# the body is "<stage> <key>". The other stage calling the same key then keeps to its share
# (aml_pipeline.stage_worker, `Lanes.shares_with`).
CAPACITY_WANTED: Final = "aml.capacity.wanted"

ADD_DONE: Final = "aml.done.add"
QUESTION_DONE: Final = "aml.done.question"
# A streaming question's search that holds back its user's next Add is final (SearchDone).
SEARCH_DONE: Final = "aml.done.search"

WORK_SUBJECTS: Final = tuple(f"{prefix}.*.*" for prefix in WORK_PREFIX.values())
# JOB_FINISHED lives in its own stream (limits retention) so the publisher reads it without
# competing with the scheduler's work-queue consumers.
EVENT_SUBJECTS: Final = (JOB_SUBMITTED, ADD_DONE, QUESTION_DONE, SEARCH_DONE)
FINISHED_STREAM: Final = "AML_FINISHED"


_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def token(value: str) -> str:
    """`value` as one subject token (and part of a consumer name): ids as the platform makes
    them (`ver-1a2b…`, `j3c4d…`) stay readable; anything else is hashed, the same everywhere."""
    if _TOKEN.match(value):
        return value
    return "h" + hashlib.sha256(value.encode()).hexdigest()[:32]


def work_subject(stage: WorkStage, version_id: str, job_id: str) -> str:
    return f"{WORK_PREFIX[stage]}.{token(version_id)}.{token(job_id)}"


def job_work_filter(version_id: str, job_id: str) -> str:
    """Every stage's remaining work of one job (what a failed job's purge removes)."""
    return f"aml.work.*.{token(version_id)}.{token(job_id)}"
