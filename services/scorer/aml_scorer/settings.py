from pathlib import Path

from aml_runtime.settings import LLMSettings


class ScorerSettings(LLMSettings):
    # Where the registered benchmark files live, as the scheduler's `datasets_root`: the coding
    # track's verify step reads a task's repository snapshot and hidden tests from its bundle
    # there (aml_evaluation.coding.source).
    datasets_root: Path = Path("../shared/datasets")
