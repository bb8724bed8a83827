"""Orbax checkpoints of the whole training state under <workdir>/checkpoints.

Each checkpoint holds the TrainState (workers, center, optimizer states,
steps, RNG; the data order follows from RNG and the workers' step counts),
the state of the timing model's clock, and the configuration that wrote it,
so that a workdir is only resumed by the same run.
"""

import os

import jax
import ml_collections
import orbax.checkpoint as ocp

from easgd.rules import TrainState


def directory(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def saved_step(workdir: str) -> int | None:
  """The step of the newest checkpoint in `workdir`, or None; writes nothing."""
  path = directory(workdir)
  if not os.path.isdir(path):
    return None
  with ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False)) as manager:
    return manager.latest_step()


def saved_config(workdir: str) -> dict | None:
  """The configuration of the newest checkpoint in `workdir`, or None; writes nothing."""
  path = directory(workdir)
  if not os.path.isdir(path):
    return None
  with ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False)) as manager:
    step = manager.latest_step()
    if step is None:
      return None
    restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return dict(restored.config)


class Checkpointer:
  """Saves and restores TrainStates."""

  def __init__(self, workdir: str, max_to_keep: int = 3):
    self._manager = ocp.CheckpointManager(
      directory(workdir),
      # Synchronous saves: a checkpoint is complete on disk when save()
      # returns, before the next step reuses (donates) the state's buffers.
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
      ),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, state: TrainState, clock: dict, config: ml_collections.ConfigDict) -> None:
    """Saves the state, the clock's `state_dict()` and the configuration."""
    step = int(jax.device_get(state.step))
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        clock=ocp.args.JsonSave(clock),
        config=ocp.args.JsonSave(config.to_dict()),
      ),
    )

  def restore(self, template: TrainState) -> tuple[TrainState, dict]:
    """The newest state, laid out with the shardings of `template`, and its clock."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    restored = self._manager.restore(
      self._manager.latest_step(),
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), clock=ocp.args.JsonRestore()
      ),
    )
    return restored.state, dict(restored.clock)

  def close(self) -> None:
    """Waits for pending saves to finish."""
    self._manager.wait_until_finished()
    self._manager.close()
