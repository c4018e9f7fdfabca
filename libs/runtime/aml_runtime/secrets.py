"""Memory System Keys at rest (SPEC R-7.2): encrypted with the operator's keys, decrypted only
where a participant is called. Several keys may be configured: the first encrypts, all decrypt,
so a new key is put first while the older ones still open what they sealed."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import SecretStr


class SecretBox:
    def __init__(self, keys: SecretStr) -> None:
        raw = [k.strip() for k in keys.get_secret_value().split(",") if k.strip()]
        if not raw:
            raise ValueError("AML_SECRET_KEYS is empty: configure at least one Fernet key")
        self._fernet = MultiFernet([Fernet(k.encode()) for k in raw])

    @staticmethod
    def new_key() -> str:
        return Fernet.generate_key().decode()

    def seal(self, secret: SecretStr) -> bytes:
        return self._fernet.encrypt(secret.get_secret_value().encode())

    def open(self, sealed: bytes) -> SecretStr:
        try:
            return SecretStr(self._fernet.decrypt(sealed).decode())
        except InvalidToken:
            raise ValueError(
                "a stored secret cannot be decrypted with the configured keys"
            ) from None
