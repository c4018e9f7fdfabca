"""NATS subject and stream names: the internal integration surface (SPEC R-8.5).

Work subjects feed the stage workers; event subjects report back to the scheduler. Each subject
has exactly one durable consumer (shared by that service's replicas), which is what lets both
streams use work-queue retention.
"""

from typing import Final

WORK_STREAM: Final = "AML_WORK"
EVENTS_STREAM: Final = "AML_EVENTS"

JOB_SUBMITTED: Final = "aml.jobs.submitted"
JOB_FINISHED: Final = "aml.jobs.finished"

WORK_ADD: Final = "aml.work.add"
WORK_SEARCH: Final = "aml.work.search"
WORK_ANSWER: Final = "aml.work.answer"
WORK_SCORE: Final = "aml.work.score"

ADD_DONE: Final = "aml.done.add"
QUESTION_DONE: Final = "aml.done.question"

WORK_SUBJECTS: Final = (WORK_ADD, WORK_SEARCH, WORK_ANSWER, WORK_SCORE)
# JOB_FINISHED lives in its own stream (limits retention) so the publisher reads it without
# competing with the scheduler's work-queue consumers.
EVENT_SUBJECTS: Final = (JOB_SUBMITTED, ADD_DONE, QUESTION_DONE)
FINISHED_STREAM: Final = "AML_FINISHED"
