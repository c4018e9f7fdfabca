"""The bodies of the gateway's REST API (the participant-facing contract), one module per
context; the context's own module is the only place to import a body from."""
