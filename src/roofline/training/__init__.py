"""Training: the step model (timeline, memory per chip, MFU, run cost), the feasibility
rules a plan must satisfy, and the planner that searches the plans a stack can run."""
