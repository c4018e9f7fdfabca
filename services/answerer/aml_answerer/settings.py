from aml_runtime.settings import LLMSettings


class AnswererSettings(LLMSettings):
    pass
