"""Warm-up instrumentation of a real Megatron run (paper section 4, "lightweight runtime
instrumentation"): router statistics, iteration time breakdown and peak memory per rank for a
few iterations, written to files `python cli.py calibrate` reads; the hooks then remove
themselves.  See planner/instrument/README.md.  Needs torch (imported lazily)."""

from planner.instrument.hooks import InstrumentSession, RouterRecorder, find_routers

__all__ = ["InstrumentSession", "RouterRecorder", "find_routers"]
