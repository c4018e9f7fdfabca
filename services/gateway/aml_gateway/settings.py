from pydantic import SecretStr

from aml_runtime.settings import ParticipantCallSettings


class GatewaySettings(ParticipantCallSettings):
    # Admin endpoints are closed unless the operator configures a token.
    admin_token: SecretStr = SecretStr("")
    host: str = "127.0.0.1"
    port: int = 8000
