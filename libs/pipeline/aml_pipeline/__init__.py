"""The pipeline logic the services share: the participant client and the URL check in front of
it (R-4.1), declared capacity and admission (R-4.12), the audit trail (R-7.3), job transitions
and progress counters, the LLM client, retention, the evaluation spec, the stage-worker skeleton
and the per-question stage. Service plumbing (settings, broker, database, documents, logging,
telemetry, secrets, clock) is `aml_runtime`; nothing here is imported by it."""
