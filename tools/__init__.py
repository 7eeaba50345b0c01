"""Development tools, not part of the planner package (nothing in planner/ imports them): the
command-line fuzzer (tools/fuzz/, `python -m tools.fuzz`), the search-time benchmark
(`python -m tools.bench_search`) and small scripts.  Run them from the repository root."""
