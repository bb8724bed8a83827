"""Trains a CNN with a distributed SGD rule: python train.py --config configs/default.py.

Config fields are overridden with --config.FIELD=VALUE; runs are written to
--workdir (TensorBoard events and checkpoints) and resumed from it. Several
processes join one run with --coordinator_address, --num_processes and
--process_id (or a scheduler's environment; see easgd.infra.distributed and
`python -m easgd.launch`). SIGTERM stops a run after its current step with a
checkpoint (exit 0); the same command resumes it. A process whose step,
evaluation or checkpoint makes no progress for --step_timeout seconds stops
with status 3 (easgd.infra.watchdog); the same command resumes it too.

One run a workdir: a second train.py on a workdir that a run is using is refused
(exit 2) in one line naming it. --stop_after=STEP stops the run after STEP with a
checkpoint, as SIGTERM does (a sweep's scheduler trains in such segments);
--changed_fields=FIELD,... lets those fields differ from the checkpoint's when the
run resumes, a deliberate change that the run records (population-based training).
"""

import logging as std_logging
import os
import sys

from absl import app, flags, logging

from easgd import cli
from easgd.config import hyperparameters
from easgd.errors import CheckpointUnreadable, ConfigError, TrainingDiverged, WorkerFailed
from easgd.infra import compile as compile_lib
from easgd.infra import distributed, platform, sharding, watchdog
from easgd.train import trainer

_CONFIG = cli.define_config(cli.packaged_config("default.py"))
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Where events and checkpoints go (default: runs/<config.algorithm>)."
)
_STOP_AFTER = flags.DEFINE_integer(
  "stop_after",
  None,
  "Stop after this step with a checkpoint, as SIGTERM stops a run (exit 0); the same "
  "command without it goes on.",
  lower_bound=1,
)
_CHANGED_FIELDS = flags.DEFINE_list(
  "changed_fields",
  [],
  "Config fields (comma-separated) whose values may differ from the checkpoint's when "
  "the run resumes: a deliberate change, recorded in the run (population-based "
  "training); only fields a run can change mid-run.",
)
_COMPILATION_CACHE = flags.DEFINE_string(
  "compilation_cache",
  None,
  "Where compiled programs are kept between runs ('' for nowhere; default: "
  "$JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/easgd/jax).",
)


def _quiet_orbax(record) -> bool:
  """Keeps orbax's per-save INFO lines out of the training log."""
  return "orbax" not in record.pathname or record.levelno >= std_logging.WARNING


def main(argv):
  logging.get_absl_logger().addFilter(_quiet_orbax)
  logging.get_absl_handler().python_handler.addFilter(_quiet_orbax)
  platform.quiet_absent_backends()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  config = cli.config_value(_CONFIG)
  # One run per algorithm unless told: trying another rule does not meet the
  # last one's checkpoint.
  workdir = _WORKDIR.value if _WORKDIR.value is not None else f"runs/{config.algorithm}"
  cli.check_workdir(workdir, inputs={"config.run.data_dir": config.run.data_dir})
  cli.with_rule_defaults(config, workdir)
  cache = compile_lib.cache_dir(_COMPILATION_CACHE.value)
  if cache:
    cli.check_workdir(cache, "--compilation_cache")
  problem = watchdog.check_timeout(watchdog.configured_timeout())
  if problem:
    cli.fail(problem)
  try:
    hyperparameters.check_mid_run(_CHANGED_FIELDS.value, "--changed_fields")
    runtime = trainer.check(config)
    processes = distributed.requested_processes()
    if processes > 1:  # process 0 serves the coordinator: its port must be free
      cli.check_coordinator(flags.FLAGS.coordinator_address, flags.FLAGS.process_id)
    # The backend's own settings (easgd.infra.platform) are made before JAX
    # starts its backends, and only for the backend that runs. Each process
    # gets an equal share of the run's devices.
    devices = hyperparameters.resolve_devices(config)
    if devices % processes:
      raise ConfigError(
        f"config.run.devices={devices} is invalid: must be a multiple of the {processes} processes"
      )
    backend = platform.expected_backend()
    for name, value in runtime.environment(config, backend).items():
      os.environ.setdefault(name, value)  # a value the user set is kept
    if backend == "gpu":
      platform.make_gpu_deterministic()
    distributed.initialize(processes)
    if backend == "cpu":  # accelerators are devices of their own
      sharding.configure_cpu_devices(devices // processes)
    compile_lib.use_persistent_cache(cache)
    result = trainer.train_and_evaluate(
      config,
      workdir,
      runtime,
      stop_after=_STOP_AFTER.value,
      changing=_CHANGED_FIELDS.value,
    )
  except ConfigError as error:
    cli.fail(str(error))
  except CheckpointUnreadable as error:
    # The other processes may wait for this one in a collective, and a normal
    # exit would wait for them in jax.distributed's shutdown barrier: leave
    # at once, and they abort when its heartbeats stop.
    print(f"error: {error}", file=sys.stderr, flush=True)
    os._exit(1)
  except (TrainingDiverged, WorkerFailed) as error:
    cli.fail(str(error), code=1)
  if result.preempted:
    if result.noticed:
      logging.info("stopped by a preemption notice; run the same command to resume")
    return
  logging.info(
    "done: %s",
    ", ".join(f"{tag} {value:.4g}" for tag, value in sorted(result.metrics.items())),
  )


if __name__ == "__main__":
  cli.run(main)
