"""The tiny smooth model of the rule tests: least squares of a linear map."""

import jax.numpy as jnp

DIM, OUT = 5, 3


def loss_fn(params, batch):
  """0.5 * mean_n ||x_n W + b - y_n||^2, and a dummy accuracy."""
  residual = batch["x"] @ params["w"] + params["b"] - batch["y"]
  return 0.5 * jnp.mean(jnp.sum(residual**2, axis=-1)), {"accuracy": jnp.zeros(())}


# Its gradient in NumPy is numpy_reference.least_squares_grad.
