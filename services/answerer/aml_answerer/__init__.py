"""answerer: the fixed answer model over the participant's candidates."""
