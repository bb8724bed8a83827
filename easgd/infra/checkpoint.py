"""Orbax checkpoints of the whole training state under <workdir>/checkpoints.

Each checkpoint holds the TrainState (workers, center, optimizer states,
steps, RNG; the data order follows from RNG and the workers' step counts),
the state of the timing model's clock, and the configuration that wrote it,
so that a workdir is only resumed by the same run.

A checkpoint also holds a fingerprint of its arrays, computed on the devices
when it is written, in the same pass that checks that every float in the
state is finite: a state that is not is never saved (TrainingDiverged names
the step and the first such leaf), so the newest checkpoint is always the
last finite state and a rerun does not resume into the divergence. (The
pipeline checks each model's slot itself, `finite_slots`: a model already
reported diverged is carried on, and saved, as it is.)

Restoring recomputes the fingerprint: a checkpoint that cannot be
read (a truncated file) or whose arrays differ from what was written (a
flipped bit) is moved to <workdir>/corrupt_checkpoints/ with a warning, and
the one before it is tried. Orbax writes a checkpoint into a temporary
directory and renames it when complete, so a process killed while saving
leaves no half-written checkpoint behind.
"""

import json
import logging as std_logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax import lax
from jax.experimental import multihost_utils

# Not exported by orbax.checkpoint: the store its default jax.Array handler keeps.
from orbax.checkpoint._src.metadata import array_metadata_store

from easgd.errors import CheckpointUnreadable, ConfigError, TrainingDiverged
from easgd.rules import TrainState

_FINGERPRINT = "fingerprint"
_REVISION = "revision"
# The deliberate changes of the configuration the state went through, oldest first
# (easgd.train.trainer: population-based training's), each {"step", "fields": {field:
# [old, new]}}; absent where there were none.
_CHANGES = "changes"

# What the arrays of a checkpoint mean, where a rule's trajectory changed since
# (`Rule.changed_since` says for which configurations):
#   1  (none recorded) before the revisions;
#   2  the MEASGD rules' Nesterov step is EAMSGD's look-ahead form, and their
#      inner state holds the velocity v_i instead of optax's trace m_i.
REVISION = 2


def _write_replicated_arrays_once() -> None:
  """Each replicated array is written whole by its first replica.

  Orbax's default, unless JAX_PLATFORMS names a GPU platform, is to split such
  an array into one slice per replica. Each slice is then copied by a small
  compiled program of its own: about 2.5 s per save of a new state layout on
  the CPU, and 0.7 s per save after that, to write the same bytes.

  Orbax takes the setting from the handler it registers for jax.Array, so that
  handler is replaced by one that differs in this setting alone: it keeps
  the array metadata store of orbax's own handler (its type_handler_registry
  builds the default so). Replacing a handler is the intended use of
  `override`, so orbax's warning that it was replaced is kept out of the log.
  """
  handler = ocp.type_handlers.ArrayHandler(
    use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()
  )
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  absl_logger.setLevel(std_logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_logger.setLevel(level)


_write_replicated_arrays_once()


def _as_uint32(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32 words (one a 1-, 2- or 4-byte element, two an 8-byte one)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = x.dtype.itemsize
  if size == 8:
    return lax.bitcast_convert_type(x, jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
  return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


@jax.jit
def fingerprint(tree) -> jax.Array:
  """One uint32 a leaf: sum_k (2k + 1) w_k mod 2^32 over the leaf's words w_k.

  Any single changed word changes it (the weights are odd, hence invertible
  mod 2^32), and so does swapping two different words.
  """

  def one(leaf):
    words = _as_uint32(leaf).ravel()
    weights = 2 * jnp.arange(words.size, dtype=jnp.uint32) + 1
    return jnp.sum(words * weights, dtype=jnp.uint32)

  return jnp.stack([one(leaf) for leaf in jax.tree.leaves(tree)])


@jax.jit
def _fingerprint_and_finite(tree) -> tuple[jax.Array, jax.Array]:
  """fingerprint(tree), and whether each leaf holds only finite numbers (integers always do)."""

  def finite(leaf):
    if not jnp.issubdtype(leaf.dtype, jnp.inexact):
      return jnp.array(True)
    return jnp.all(jnp.isfinite(leaf))

  return fingerprint(tree), jnp.stack([finite(leaf) for leaf in jax.tree.leaves(tree)])


@jax.jit
def finite_slots(tree) -> jax.Array:
  """[M] bool: whether slot m of every leaf of `tree` (each stacked on a leading axis
  of M slots) holds only finite numbers."""
  leaves = [leaf for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
  flags = [jnp.isfinite(leaf).reshape(leaf.shape[0], -1).all(axis=1) for leaf in leaves]
  return jnp.stack(flags).all(axis=0)


def _fingerprint_list(tree) -> list[int]:
  return [int(word) for word in jax.device_get(fingerprint(tree))]


def checked_fingerprint(tree, step: int) -> list[int]:
  """fingerprint(tree) as ints; raises TrainingDiverged if a float in `tree` is not finite."""
  words, finite = jax.device_get(_fingerprint_and_finite(tree))
  if not finite.all():
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)]
    first = paths[int(np.flatnonzero(~finite)[0])]
    raise TrainingDiverged(
      f"the state after step {step} is not finite (first in state{first}); it was not saved"
    )
  return [int(word) for word in words]


def directory(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def saved_step(workdir: str) -> int | None:
  """The step of the newest checkpoint in `workdir`, or None; writes nothing."""
  path = directory(workdir)
  if not os.path.isdir(path):
    return None
  with ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False)) as manager:
    return manager.latest_step()


def saved_steps(workdir: str) -> list[int]:
  """The steps of the checkpoints in `workdir`, oldest first; writes nothing."""
  path = directory(workdir)
  if not os.path.isdir(path):
    return []
  # Orbax writes a checkpoint under a temporary name and renames it to its step.
  return sorted(int(name) for name in os.listdir(path) if name.isdigit())


def read_leaves(path: str) -> list[np.ndarray]:
  """The leaves of the training state saved at `path` (<workdir>/checkpoints/<step>/
  state) as NumPy arrays, whatever device layout wrote them: for comparing two
  runs' states bit for bit, without building a template."""
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  return [np.asarray(leaf) for leaf in jax.tree.leaves(restored)]


def saved_leaves(workdir: str, step: int) -> list[np.ndarray]:
  """`read_leaves` of the state that `workdir`'s checkpoint of step `step` holds."""
  return read_leaves(os.path.join(directory(workdir), str(step), "state"))


def saved_config(workdir: str) -> dict | None:
  """The configuration of the newest readable checkpoint in `workdir`, or None; writes nothing.

  Read from the files, not through a CheckpointManager: opening one joins
  collectives, and the processes of a run ask this before they agree on
  anything (one may already have created the directory that another has not
  seen yet).
  """
  newest = _newest_readable(workdir)
  return None if newest is None else dict(newest[1])


def config_at(workdir: str, step: int) -> dict | None:
  """The configuration saved with the checkpoint of `step` in `workdir`, or None."""
  try:
    with open(os.path.join(directory(workdir), str(step), "config", "metadata")) as handle:
      return json.load(handle)
  except (OSError, ValueError):
    return None


def saved_revision(workdir: str) -> int | None:
  """The REVISION of the newest readable checkpoint in `workdir` (1 for one written
  before revisions were recorded), or None if there is none; writes nothing."""
  newest = _newest_readable(workdir)
  if newest is None:
    return None
  path = os.path.join(newest[0], _REVISION, "metadata")
  try:
    with open(path) as handle:
      return int(json.load(handle)[_REVISION])
  except FileNotFoundError:
    return 1
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise ConfigError(
      f"{path} is not a checkpoint revision ({type(error).__name__}); "
      "move the checkpoint away or use another --workdir"
    ) from None


def _newest_readable(workdir: str) -> tuple[str, dict] | None:
  """(folder, configuration) of the newest checkpoint whose configuration reads."""
  path = directory(workdir)
  if not os.path.isdir(path):
    return None
  for step in reversed(saved_steps(workdir)):
    folder = os.path.join(path, str(step))
    try:
      with open(os.path.join(folder, "config", "metadata")) as handle:
        return folder, json.load(handle)
    except (OSError, ValueError):  # a corrupt checkpoint; restore() reports it
      continue
  return None


class Checkpointer:
  """Saves and restores TrainStates."""

  def __init__(self, workdir: str, max_to_keep: int = 3):
    self._workdir = os.path.abspath(workdir)
    # The deliberate changes of the configuration so far, saved with every checkpoint.
    self.changes: list[dict] = []
    self._manager = ocp.CheckpointManager(
      directory(workdir),
      # Synchronous saves: a checkpoint is complete on disk when save()
      # returns, before the next step reuses (donates) the state's buffers.
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
      ),
    )

  @property
  def workdir(self) -> str:
    """The run's workdir (absolute), which holds the checkpoints folder."""
    return self._workdir

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(
    self, state, clock: dict, config: ml_collections.ConfigDict, check_finite: bool = True
  ) -> None:
    """Saves the state, the clock's `state_dict()` and the configuration.

    Raises TrainingDiverged, and writes nothing, if the state is not finite
    (unless the caller checked it itself: `check_finite`=False).
    """
    step = int(jax.device_get(state.step))
    if check_finite:
      words = checked_fingerprint(state, step)
    else:
      words = _fingerprint_list(state)
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        clock=ocp.args.JsonSave(clock),
        config=ocp.args.JsonSave(config.to_dict()),
        **{_REVISION: ocp.args.JsonSave({_REVISION: REVISION})},
        **{_FINGERPRINT: ocp.args.JsonSave(words)},
        **({_CHANGES: ocp.args.JsonSave(self.changes)} if self.changes else {}),
      ),
    )

  def restore(self, template: TrainState) -> tuple[int, TrainState, dict]:
    """The newest intact checkpoint: its step, its state laid out with the
    shardings of `template`, and its clock. Corrupt ones are set aside.

    Raises ConfigError if there are checkpoints but none is intact.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    set_aside = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      # Checkpoints of earlier versions have no fingerprint; they are read unchecked.
      checked = os.path.isdir(os.path.join(directory(self._workdir), str(step), _FINGERPRINT))
      items = {"state": ocp.args.StandardRestore(abstract), "clock": ocp.args.JsonRestore()}
      if checked:
        items[_FINGERPRINT] = ocp.args.JsonRestore()
      changed = os.path.isdir(os.path.join(directory(self._workdir), str(step), _CHANGES))
      if changed:
        items[_CHANGES] = ocp.args.JsonRestore()
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as error:  # noqa: BLE001 (orbax and tensorstore raise many kinds)
        problem = f"it cannot be read ({type(error).__name__}: {_first_line(error)})"
        if jax.process_count() > 1:
          # Each process reads only its own shards, so the others may have
          # read theirs and wait in a collective: stop the run (they abort
          # when this process's heartbeats stop), and let the rerun find
          # the checkpoint gone.
          where = self._set_aside(step, by_all=False)
          raise CheckpointUnreadable(
            f"process {jax.process_index()} could not read the checkpoint of step {step}: "
            f"{problem}; it was moved to {where}; run the same command again to resume "
            "from the one before"
          ) from None
      else:
        # The fingerprint is the same number in every process: all agree.
        if not checked or _fingerprint_list(restored.state) == list(restored[_FINGERPRINT]):
          if set_aside:
            self._manager.reload()
          self.changes = list(restored[_CHANGES]) if changed else []
          return step, restored.state, dict(restored.clock)
        problem = "its arrays differ from the fingerprint written with them"
      where = self._set_aside(step, by_all=True)
      set_aside.append(step)
      logging.warning(
        "the checkpoint of step %d is corrupt: %s; moved to %s, trying the one before",
        step,
        problem,
        where,
      )
    raise ConfigError(
      f"no checkpoint in {directory(self._workdir)} is intact (steps "
      f"{', '.join(map(str, set_aside))} were moved to {self._corrupt_dir()}); "
      "run the command again to start afresh"
    )

  def _corrupt_dir(self) -> str:
    return os.path.join(self._workdir, "corrupt_checkpoints")

  def _set_aside(self, step: int, by_all: bool) -> str:
    """Moves checkpoint `step` out of the manager's directory: if `by_all`, every
    process calls this, process 0 moves and all wait; else this process moves.
    """
    source = os.path.join(directory(self._workdir), str(step))
    target = os.path.join(self._corrupt_dir(), str(step))
    if not by_all or jax.process_index() == 0:
      os.makedirs(self._corrupt_dir(), exist_ok=True)
      # A step set aside before (and trained again since) keeps its copy.
      copies = 1
      while os.path.exists(target) and os.path.exists(source):
        target = os.path.join(self._corrupt_dir(), f"{step}.{copies}")
        copies += 1
      try:
        os.rename(source, target)
      except FileNotFoundError:
        pass  # another process that could not read it moved it first
    if by_all and jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
    return target

  def close(self) -> None:
    """Waits for pending saves to finish."""
    self._manager.wait_until_finished()
    self._manager.close()


def _first_line(error: Exception) -> str:
  # TensorStore's messages go on with a pointer to "full details" that says nothing here.
  text = str(error).strip().split(". See full TensorStore details")[0]
  return text.splitlines()[0][:200] if text else "no message"
