from aml_runtime.settings import CodingWorkerSettings


class AnswererSettings(CodingWorkerSettings):
    """The answer model's settings, and the coding track's solve step's sandboxes."""
