"""The configuration: every field declared once (fields.py), what the declarations
imply (hyperparameters.py: the defaults, which fields shape a trajectory, old names),
and the checks of its fields."""
