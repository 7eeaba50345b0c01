"""Measured profiles: torch micro-benchmarks of the model's own kernels and torch.distributed
collectives, converted into a DeviceProfile (profiles/devices schema, provenance `measured`).

Only `shapes` and `tables` import without torch; `kernels`, `collectives` and `runner` need it."""
