"""The one place with unit constants.

Inside the planner every quantity is SI: seconds, bytes, FLOP, bytes per second.
Names carry their unit as a suffix (`_s`, `_bytes`, `_gib`, `_flop`, `_tflops`,
`_gb_per_s`).  Datasheet figures in profiles use the units vendors print
(TFLOP/s, GiB or GB, GB/s) and are converted with these constants.
"""

GIB_BYTES = 1024**3
GB_BYTES = 1000**3
US_S = 1e-6
