"""AML's wire formats as pydantic models: the participant contract, the internal NATS messages
and subjects, and the platform API's bodies. No I/O here."""
