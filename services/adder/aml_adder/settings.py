from aml_runtime.settings import ParticipantCallSettings


class AdderSettings(ParticipantCallSettings):
    pass
