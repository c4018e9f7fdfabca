"""The coding track's evaluation rules (SPEC R-2.5): the coding dataset bundle and its imports,
and the grading of a task's test log with SWE-bench's semantics."""
