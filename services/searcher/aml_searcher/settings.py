from aml_runtime.settings import ParticipantCallSettings


class SearcherSettings(ParticipantCallSettings):
    pass
