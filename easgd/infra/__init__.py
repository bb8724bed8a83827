"""Infrastructure that knows no algorithm: the device mesh and layouts, checkpoints,
TensorBoard events, several processes and preemption."""
