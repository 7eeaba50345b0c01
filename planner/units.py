"""The one place with unit constants and conversions.

Inside the planner every quantity is SI: seconds, bytes, FLOP, bytes per second.
Names carry their unit as a suffix (`_s`, `_bytes`, `_gib`, `_flop`, `_tflops`,
`_gb_per_s`).  Datasheet figures in profiles use the units vendors print
(TFLOP/s, GiB or GB, GB/s) and are converted here, nowhere else.
"""

GIB_BYTES = 1024**3
GB_BYTES = 1000**3
TFLOP = 1e12
US_S = 1e-6
MS_S = 1e-3


def gib_to_bytes(gib: float) -> float:
    return gib * GIB_BYTES


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / GIB_BYTES


def gb_per_s_to_bytes_per_s(gb_per_s: float) -> float:
    """Gigabytes (10^9 bytes) per second to bytes per second."""
    return gb_per_s * GB_BYTES


def tflops_to_flop_per_s(tflops: float) -> float:
    return tflops * TFLOP


BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
