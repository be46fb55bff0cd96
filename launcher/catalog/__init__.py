"""What launch knows without importing torch: the strategy registry and the recipes' models.
Pure data and arithmetic, imported by the spec models and the planner."""
