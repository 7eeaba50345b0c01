"""CP-SAT backend over the shared integer cost tables (see model.py for the problem)."""

from solver_models.cpsat.model import CpSatSolution, CpSatStageModel, last_stats, solve_cpsat

__all__ = ["CpSatSolution", "CpSatStageModel", "last_stats", "solve_cpsat"]
