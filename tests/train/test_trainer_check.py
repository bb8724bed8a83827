"""trainer.check starts no JAX backend, for any algorithm on any runtime.

train.py runs the checks, then sets the backend's environment and the number
of CPU devices, which JAX takes only before a backend starts: a check that
made an array first (streaming_diloco's split of the model, once) broke
train.py for its rule while every in-process test, whose devices conftest
had set, passed. So this runs what train.py runs before it sets the devices
in a fresh process, for every algorithm and runtime, and asks JAX after each.
"""

import subprocess
import sys

import pytest

import runs

SCRIPT = """
import sys

from jax._src import xla_bridge

from easgd import cli, registry
from easgd.config import hyperparameters
from easgd.errors import ConfigError
from easgd.infra import platform
from easgd.train import trainer
from easgd.train.runtimes import registry as runtimes

checked = []
for algorithm in registry.ALGORITHMS:
  for runtime in runtimes.named():
    config = hyperparameters.default_config()
    config.algorithm, config.runtime = algorithm, runtime
    cli.with_rule_defaults(config)
    try:
      chosen = trainer.check(config)
      chosen.environment(config, platform.expected_backend())
      hyperparameters.resolve_devices(config)
      checked.append(algorithm)
    except ConfigError:
      pass  # a pair the runtime refuses: its checks may start no backend either
    if xla_bridge.backends_are_initialized():
      sys.exit(f"the checks of {algorithm} on runtime={runtime} started a JAX backend")
print(" ".join(sorted(set(checked))))
"""


@pytest.mark.e2e  # a process of its own: the tests' own has its backend started
def test_no_check_of_any_algorithm_or_runtime_starts_a_backend():
  from easgd import registry  # noqa: PLC0415 (after conftest set the devices)

  done = subprocess.run(
    [sys.executable, "-c", SCRIPT],
    cwd=runs.REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  # Every algorithm was checked on at least one runtime.
  assert done.stdout.split() == sorted(registry.ALGORITHMS), done.stdout
