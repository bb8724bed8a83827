"""Training: the loop every run shares, its setup, and the runtimes that drive it."""
