"""Sharded evaluation agrees with a direct NumPy count; consensus distance with its formula."""

import jax
import jax.numpy as jnp
import numpy as np

from easgd import evaluation
from easgd.infra import sharding


def _apply(params, images):
  return images.reshape(images.shape[0], -1).astype(jnp.float32) @ params["w"]


def test_accuracies_match_a_direct_count_with_padding():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 255, size=(301, 2, 2, 1)).astype(np.uint8)  # 301: padded
  labels = rng.integers(0, 3, size=301).astype(np.int32)
  workers = {"w": rng.normal(size=(8, 4, 3)).astype(np.float32)}
  mesh = sharding.make_mesh(8)
  evaluator = evaluation.Evaluator(mesh, _apply, images, labels)
  flat = images.reshape(301, -1).astype(np.float32)
  expected = [np.mean((flat @ w).argmax(-1) == labels) for w in workers["w"]]
  np.testing.assert_allclose(evaluator.worker_accuracies(workers), expected)
  center = {"w": workers["w"][5]}
  assert abs(evaluator.center_accuracy(center) - expected[5]) < 1e-12


def test_consensus_distance_is_mean_relative_norm():
  rng = np.random.default_rng(1)
  center = {"a": rng.normal(size=(3,)), "b": rng.normal(size=(2, 2))}
  workers = jax.tree.map(lambda c: c + rng.normal(size=(4, *c.shape)), center)
  norm_c = np.sqrt(sum(np.sum(c**2) for c in center.values()))
  expected = np.mean(
    [
      np.sqrt(sum(np.sum((workers[k][i] - center[k]) ** 2) for k in center)) / norm_c
      for i in range(4)
    ]
  )
  np.testing.assert_allclose(evaluation.consensus_distance(workers, center), expected, rtol=1e-5)
