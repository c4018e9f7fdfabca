"""scheduler: plans jobs, releases work in order, notices completion and aggregates."""
