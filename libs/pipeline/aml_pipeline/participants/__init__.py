"""Calling a participant's memory system (SPEC R-4.2 - R-4.10): one client (`client`), the retry
table it follows (`retries`), the audit record of each attempt (`attempts`), and the defensive
reading of what a participant answers: a bounded body (`reading`), checked against the contract
(`validation`) and against what a store can keep (`sizing`). Anything a participant's bytes can
make go wrong is a contract violation (final, R-4.9), never a platform error (`failures`).
"""

from aml_pipeline.participants.attempts import Attempt, Observer, Operation
from aml_pipeline.participants.client import (
    ACCEPT_ENCODING,
    CONNECT_TIMEOUT_SECONDS,
    HEALTH_TIMEOUT_SECONDS,
    AnswerHook,
    DeadlineExceeded,
    ParticipantClient,
)
from aml_pipeline.participants.endpoint import Endpoint, auth_headers
from aml_pipeline.participants.failures import REASON_QUOTE_MAX, CallFailed, Failure, short
from aml_pipeline.participants.reading import BodyRejected, read_capped
from aml_pipeline.participants.retries import (
    ADD_RETRYABLE,
    DOWN_STATUSES,
    SEARCH_RETRYABLE,
    RetryPolicy,
    parse_retry_after,
    participant_down,
)
from aml_pipeline.participants.sizing import bson_size, storage_problem
from aml_pipeline.participants.validation import (
    parse_json,
    status_url,
    validate_add_response,
    validate_search_response,
)

__all__ = [
    "ACCEPT_ENCODING",
    "ADD_RETRYABLE",
    "CONNECT_TIMEOUT_SECONDS",
    "DOWN_STATUSES",
    "HEALTH_TIMEOUT_SECONDS",
    "REASON_QUOTE_MAX",
    "SEARCH_RETRYABLE",
    "AnswerHook",
    "Attempt",
    "BodyRejected",
    "CallFailed",
    "DeadlineExceeded",
    "Endpoint",
    "Failure",
    "Observer",
    "Operation",
    "ParticipantClient",
    "RetryPolicy",
    "auth_headers",
    "bson_size",
    "parse_json",
    "parse_retry_after",
    "participant_down",
    "read_capped",
    "short",
    "status_url",
    "storage_problem",
    "validate_add_response",
    "validate_search_response",
]
