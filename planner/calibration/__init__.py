"""Calibration: read what a real Megatron run printed (or what planner.instrument recorded),
compare it with the cost model, and write corrections that `--profiles DIR` loads."""
