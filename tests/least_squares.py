"""The tiny smooth model of the rule tests: least squares of a linear map."""

import jax.numpy as jnp

DIM, OUT = 5, 3


def loss_fn(params, batch):
  """0.5 * mean_n ||x_n W + b - y_n||^2, and a dummy accuracy."""
  residual = batch["x"] @ params["w"] + params["b"] - batch["y"]
  return 0.5 * jnp.mean(jnp.sum(residual**2, axis=-1)), {"accuracy": jnp.zeros(())}


def numpy_grad(params, batch):
  """loss_fn's gradient in NumPy, with r_n = x_n W + b - y_n:
  dL/dW = (1/N) sum_n x_n^T r_n,  dL/db = (1/N) sum_n r_n."""
  residual = batch["x"] @ params["w"] + params["b"] - batch["y"]
  return {"w": batch["x"].T @ residual / len(residual), "b": residual.mean(axis=0)}
