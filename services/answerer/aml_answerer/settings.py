from pathlib import Path

from aml_runtime.settings import LLMSettings


class AnswererSettings(LLMSettings):
    # Where the registered benchmark files live, as the scheduler's `datasets_root`: the coding
    # track's solve step reads a task's repository snapshot from its bundle
    # there (aml_evaluation.coding.source).
    datasets_root: Path = Path("../shared/datasets")
