"""Service plumbing every process shares: settings, the NATS broker and stream declarations,
the MongoDB handle and the stored documents, logging, telemetry, metrics and probes, sealed
secrets, the clock, and the service skeleton. The pipeline logic built on it is `aml_pipeline`."""
