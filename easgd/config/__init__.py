"""The configuration: its schema (groups, defaults, what shapes a trajectory, old
names), and the checks of its fields."""
