from aml_runtime.settings import LLMSettings


class ScorerSettings(LLMSettings):
    pass
