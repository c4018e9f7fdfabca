"""Developer tooling: the embedded stack and its processes, the `aml` CLI, conformance checks,
offline rescoring, trace files and generated docs. Kept apart from aml_runtime so the service
image (which leaves libs/devtools out, see .dockerignore) ships only what services import."""
