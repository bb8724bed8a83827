"""Infrastructure: the device mesh and layouts, compiler options, checkpoints,
TensorBoard events, several processes and preemption. It names no algorithm:
the layouts know the shape of the training state, not the rule that fills it."""
