"""publisher: the automatic publication gate (R-3.8) over every finished job; a job that passes
is queued for admin review."""
