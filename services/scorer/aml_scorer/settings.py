from pydantic import Field

from aml_runtime.settings import CodingWorkerSettings


class ScorerSettings(CodingWorkerSettings):
    # Coding attempts one scorer process verifies at once (each a sandboxed test run, up to
    # `coding_test_timeout_seconds`, on this process's CPU): its verify lane's bound, per
    # process, apart from the LLM budget, which judge calls alone take.
    coding_verify_concurrency: int = Field(default=2, ge=1)
