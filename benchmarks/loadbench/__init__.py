"""The pipeline load benchmark's parts; `benchmarks/pipeline_load.py` is its entry point (the
command line and the run's course), and its docstring says what the benchmark measures.

- sampling:  the machine's speed, each stack process's CPU and peak RSS (from /proc);
- harness:   the callees' profiles, starting them and the platform, submitting and awaiting jobs;
- figures:   what the participants and the LLM saw, and a scenario's lower bound;
- datasets:  the scale scenarios' generated LoCoMo-format datasets;
- scenarios: solo, repeat, teams-alone and teams;
- scale:     scale and saturated;
- report:    the targets, the tables printed, the figures written (JSON and the dated record).

Its modules import each other relatively, so the tests may load it under any name
(tests/scripts.py)."""
