"""CP-SAT backend: the stage model of one configuration (model.py) and the master over the
degrees (master.py)."""
