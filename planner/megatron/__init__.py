"""Megatron-LM's (and FlagScale's) own knowledge, in one place: which configurations it accepts
(`rules`), its flags and how they map to the planner's specs (`flags`), and its pipeline layouts
(`layout`).  Nothing here imports Megatron, nor the planner's inputs, search or outputs."""
