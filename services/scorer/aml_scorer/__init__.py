"""scorer: the LLM judge and token F1 for each answered question."""
