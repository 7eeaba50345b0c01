"""CP-SAT backend: the stage model of one configuration (model.py) and the master over the
degrees (master.py)."""

from solver_models.cpsat.model import CpSatSolution, CpSatStageModel, solve_cpsat

__all__ = ["CpSatSolution", "CpSatStageModel", "solve_cpsat"]
