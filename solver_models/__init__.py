"""Search backends over the shared integer cost tables: the tables (tables.py), their integer
resolution (scaling.py), the backends' interface (base.py), the backends themselves (hsdp.py,
brute.py, cpsat/) and their registry (backends.py).  Imports only planner.schemas."""
