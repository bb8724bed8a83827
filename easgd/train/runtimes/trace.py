"""The record of a threads or ray run (WORKDIR/trace.jsonl) and its replay as ticks.

One JSON object a line, each ending with its checksum, "sum" (below):
  {"kind": "header", "version": 2, "algorithm", "workers", "config": {field: value}}
      the fields that shape the trajectory (easgd.config.hyperparameters), less the runtime
      and the timing model's (a replay keeps the recorded order instead);
  {"kind": "event", "worker": j, "step": k, "op", "local", "tick", "read", "wrote",
   "staleness", "wait", "service", "compute", "time"}
      one thing worker j did, in the order the master saw it:
        op "local":    its local step k (k local steps done before it);
        op "exchange": a request served under the lock (read and write at
                       once);
        op "read" / "write": the two halves of a Hogwild request;
        op "join" / "leave": runtime=ray's worker process (re)joins, or has
                       left for good (cluster.on_worker_loss); either way its
                       row restarts from the center: x_j <- x~, fresh
                       optimizer state;
      "cut": true (on a "join" or "leave" alone, and left out otherwise): the
      worker's process was lost with the run at a cut (its workers parked for a
      log, an evaluation or a checkpoint), whose state needs the row the process
      held. The reset is then the last operation of the cut's own tick, which it
      ends: it discards the worker's local step of that tick, if it took one
      (the process that held its result is gone), and the cut's state has the
      worker restarted from the cut's center;
      "local": true when the worker's local step k comes with the event (a
      local step, or the request of an EASGD worker's exchange step, an
      exchange or a READ);
      "read"/"wrote": the center's version it read / wrote (versions count
      the writes to the center), "staleness": writes by other workers since
      the worker's previous read, "wait": seconds it queued for the master,
      "service": seconds the master took, "compute": seconds a "local"
      event's step took on its device (a straggler's delay left out; 0 for
      the others: an exchange step computes after its request), "time": seconds of
      training since the run began (pauses at evaluations and checkpoints
      left out), "tick": the tick it falls in;
  {"kind": "process", "worker": j, "pid": p, "host": h}
      runtime=ray: worker j runs in process p on host h from here on (written
      as each worker process starts, and again as one rejoins);
  {"kind": "unvalued", "worker": j, "step": k}
      runtime=ray: worker j's local step k, traced with its request (an
      "exchange" or a "read" event before this line), gave no loss or
      accuracy: its process died as it computed the step, after the request
      was served. Written when the loss is seen, before the worker's join or
      leave (under cluster.on_worker_loss=stop, before the run stops). The row
      it computed is lost with the process, and the join or leave restarts it
      from the center; the replay takes the step, whose result that reset
      overwrites as the run's did, and leaves its values out of the logged
      loss and accuracy, as the run had to (its learning rate still counts, as
      in the run: the step was taken);
  {"kind": "round", "tick": t, "members": [...], "late": [...], "arrivals": [...],
   "closed": c}
      a synchronous rule's round under runtime=threads or ray
      (easgd.train.runtimes.threads.rounds), the exchange that ends tick t:
      members[j] whether worker j's contribution made it, late[j] whether it
      missed it and its message waits for the next round (outer.missed=late),
      arrivals[j] the seconds after the round's first arrival at which worker j
      arrived (null for one that stopped at the close without arriving), c the
      seconds after the first arrival at which the round closed. Such a trace holds rounds
      alone (and runtime=ray's "process" and "gone" lines), and
      runtime=threads replays it: each round waits for its members;
  {"kind": "gone", "worker": j, "tick": t}
      runtime=ray's synchronous rounds under cluster.on_worker_loss=continue:
      worker j's process was lost for good in the steps that began at tick t,
      and it takes no step from t on (it is absent from every later round);
  {"kind": "end", "events": N, "ticks": T}: written when the run completes;
      N counts the lines between the header and it.

The checksum chains each line to the one before it. A line's body is its
JSON object without "sum", as json.dumps writes it; the line is the body with
`, "sum": "<s>"` put before its closing brace, where s is the first 16 hex
digits of sha256(the previous line's s + the body) (the header's previous s
is ""). A reader strips exactly that suffix to get the body back (no JSON
round trip). A line edited, dropped, inserted or moved is refused at the first
line that no longer follows from the one before it. The sums catch damage and
edits by hand, not a forger: anyone can compute them. Version 1 (an earlier
version's trace) had no sums; it is refused.

Replaying packs the events, in their order, into ticks with the simulated
runtime's own packer (easgd.sim.events.TickPacker): the threads runtime
packed them the same way as it ran, so a replay takes the same T ticks,
and every event's tick is checked against the recorded one.
"""

import contextlib
import copy
import dataclasses
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterator

import ml_collections

from easgd.config import hyperparameters
from easgd.errors import ConfigError
from easgd.rules import tiers
from easgd.sim import timing
from easgd.sim.events import TickPacker
from easgd.sim.ticks import OpKind, Tick

FILE = "trace.jsonl"
VERSION = 2
OPS = {
  "local": None,
  "exchange": OpKind.EXCHANGE,
  "read": OpKind.READ,
  "write": OpKind.WRITE,
  "join": OpKind.RESET,
  "leave": OpKind.RESET,
  "send": OpKind.SEND,
  "apply": OpKind.APPLY,
  "merge": OpKind.MERGE,
}
# Two-tier servers' operations: their event's "worker" is the group it is for.
SERVER_OPS = ("send", "apply", "merge")


def recorded_fields(config: ml_collections.ConfigDict) -> dict:
  """The config fields a trace must be replayed under: those that shape the
  trajectory, less the runtime and the timing model (cluster.*)."""
  return {
    field: value
    for field, value in hyperparameters.flatten(config.to_dict()).items()
    if hyperparameters.shapes_trajectory(field, config.algorithm, config.optimizer)
    and field != "runtime"
    and not field.startswith("cluster.")
  }


def header(config: ml_collections.ConfigDict) -> dict:
  """The trace's first line; a two-tier run's (outer.two_tier) names its servers' groups
  ("groups", cluster.groups: which workers each group server served)."""
  first = {
    "kind": "header",
    "version": VERSION,
    "algorithm": config.algorithm,
    "workers": config.workers,
    "config": recorded_fields(config),
    "schedule": schedule(config),
  }
  if tiers.TWO_TIER.of(config):
    first["groups"] = list(timing.GROUPS.of(config)) or [config.workers]
  return first


def schedule(config: ml_collections.ConfigDict) -> dict:
  """Where the run's cuts fall (its logs, evaluations and checkpoints): a synchronous
  rule's rounds replay only under the schedule that recorded them, since a worker gone
  for good keeps its row at the last cut, and so do a dropped worker's statistics when
  they stay local (outer.batch_stats=local)."""
  run = config.run
  return {
    "log_every": run.log_every,
    "eval_every": run.eval_every,
    "checkpoint_every": run.checkpoint_every,
  }


def server_groups(config: ml_collections.ConfigDict) -> int:
  """The two-tier servers' groups of a run of `config` (0: one master)."""
  return (len(timing.GROUPS.of(config)) or 1) if tiers.TWO_TIER.of(config) else 0


@dataclasses.dataclass(frozen=True)
class Event:
  worker: int
  step: int
  op: str
  local: bool
  tick: int
  read: int | None = None
  wrote: int | None = None
  staleness: int = -1
  wait: float = 0.0
  time: float = 0.0
  compute: float = 0.0
  service: float = 0.0
  cut: bool = False  # a join or leave at a cut (the module's docstring)

  def record(self) -> dict:
    fields = dataclasses.asdict(self)
    if not self.cut:
      del fields["cut"]  # written only where true
    return {"kind": "event", **fields}


# The suffix a line's checksum takes (the module docstring), and its sum's length.
SUM = re.compile(r', "sum": "([0-9a-f]{16})"\}\Z')
SUM_DIGITS = 16


def checksum(previous: str, body: str) -> str:
  """The sum of a line whose body (its JSON without "sum") is `body`, after the
  line whose sum is `previous` ("" before the header)."""
  return hashlib.sha256((previous + body).encode()).hexdigest()[:SUM_DIGITS]


class Chain:
  """The running checksum of a trace's lines, from the header on."""

  def __init__(self):
    self.last = ""  # the last line's sum

  def seal(self, record: dict) -> str:
    """The line of `record` (with its newline) carrying its sum."""
    body = json.dumps(record)
    self.last = checksum(self.last, body)
    return f'{body[:-1]}, "sum": "{self.last}"}}\n'

  def follow(self, line: str) -> str | None:
    """The body of `line` (with or without its newline), if its sum follows from
    the line before; None, the chain left as it was, if not."""
    text = line.removesuffix("\n")
    match = SUM.search(text)
    if match is None:
      return None
    body = text[: match.start()] + "}"
    if checksum(self.last, body) != match.group(1):
      return None
    self.last = match.group(1)
    return body


class Writer:
  """Appends events; `sync` makes them durable (before a checkpoint counts them)."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict, keep_events: int | None):
    """keep_events: None for a new run (a new trace), else the events of the
    checkpoint being resumed: the trace is cut back to them, and its chain of
    checksums continues from the last line kept."""
    self.path = os.path.join(workdir, FILE)
    self._chain = Chain()
    if keep_events is None:
      self._file = _open(self.path, "w")
      self._file.write(self._chain.seal(header(config)))
    else:
      # Cut back under another name, then renamed: a kill meanwhile leaves the
      # trace whole for the next resume.
      kept = _kept_lines(self.path, 1 + keep_events, self._chain)
      with _open(self.path + ".cut", "w") as cut:
        cut.writelines(kept)
      os.replace(self.path + ".cut", self.path)
      self._file = _open(self.path, "a")
    self._file.flush()

  def add(self, event: Event) -> None:
    self._file.write(self._chain.seal(event.record()))

  def process(self, worker: int, pid: int, host: str) -> None:
    """Worker `worker` runs in process `pid` on `host` from here on (a line, which the
    run's count of events includes)."""
    self._file.write(
      self._chain.seal({"kind": "process", "worker": worker, "pid": pid, "host": host})
    )

  def unvalued(self, worker: int, step: int) -> None:
    """Worker `worker`'s traced local step `step` gave no values (a line, which the
    run's count of events includes)."""
    self._file.write(self._chain.seal({"kind": "unvalued", "worker": worker, "step": step}))

  def round(
    self, tick: int, members: list[bool], late: list[bool], arrivals: list, closed: float
  ) -> None:
    """A synchronous round that closed after tick `tick` (a line, which the run's count
    of events includes)."""
    record = {"kind": "round", "tick": tick, "members": members, "late": late}
    self._file.write(self._chain.seal({**record, "arrivals": arrivals, "closed": closed}))

  def gone(self, worker: int, tick: int) -> None:
    """Worker `worker` takes no step from tick `tick` on (a line, which the run's count
    of events includes)."""
    self._file.write(self._chain.seal({"kind": "gone", "worker": worker, "tick": tick}))

  def sync(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())

  def end(self, events: int, ticks: int) -> None:
    """The end line: the run completed with `events` events in `ticks` ticks."""
    self._file.write(self._chain.seal({"kind": "end", "events": events, "ticks": ticks}))
    self.sync()

  def close(self) -> None:
    self._file.close()


def _open(path: str, mode: str):
  """The trace at `path`, open for writing: its lines end in "\n" alone, on any
  platform, as the reader splits them."""
  return open(path, mode, encoding="utf-8", newline="\n")


def _file_lines(path: str, name: str, remedy: str) -> Iterator[str]:
  """The lines of the file at `path`, each with its newline (the last may lack
  it), decoded as UTF-8; ConfigError (one line, `name` the file's, then `remedy`)
  for a path that is missing, a directory, unreadable or not UTF-8 text."""
  if os.path.isdir(path):
    raise ConfigError(f"{name} is a directory: {remedy}")
  try:
    file = open(path, "rb")  # noqa: SIM115 (closed below, at the last line or an error)
  except FileNotFoundError:
    raise ConfigError(f"{name} does not exist: {remedy}") from None
  except OSError as error:
    raise ConfigError(f"{name} cannot be read ({error.strerror}): {remedy}") from None
  with file:
    # Split on b"\n" alone: the writer ends its lines so, whatever the platform.
    for number, raw in enumerate(file, 1):
      try:
        yield raw.decode("utf-8")
      except UnicodeDecodeError:
        raise ConfigError(f"{name} is not UTF-8 text at line {number}: {remedy}") from None


def _json(text: str):
  """The value of the JSON `text`, or None if it is not JSON Python can hold (a
  number of over 4,300 digits, nesting past the recursion limit)."""
  try:
    return json.loads(text)
  except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
    return None


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


# Whether a JSON value is of a type an Event field declares (JSON gives a float
# field's whole numbers back as ints).
_OF_TYPE = {
  int: _is_int,
  int | None: lambda value: value is None or _is_int(value),
  float: lambda value: isinstance(value, int | float) and not isinstance(value, bool),
  bool: lambda value: isinstance(value, bool),
  str: lambda value: isinstance(value, str),
}
# Each field of an event line, and the check of its value's type.
_EVENT_FIELDS = {field.name: _OF_TYPE[field.type] for field in dataclasses.fields(Event)}
# The fields an event line may leave out: each holds only its true value.
_OPTIONAL_FIELDS = {"cut"}


def _header_fault(line: str | None) -> str | None:
  """What is wrong with a trace's first line (None: the file is empty) as a
  version-VERSION header, or None."""
  if line is None:
    return f"does not begin with a version-{VERSION} trace header: it is empty"
  if line.endswith("\r\n"):
    return (
      "has Windows line endings (\\r\\n); the sums are of lines ending in \\n alone, "
      "as the run wrote them"
    )
  first = _json(line)
  if not isinstance(first, dict) or first.get("kind") != "header":
    return f"does not begin with a version-{VERSION} trace header"
  version = first.get("version")
  if _is_int(version) and version < VERSION:
    return (
      f"was written by an earlier version of this program (a version-{version} trace, "
      f"without the checksums of version {VERSION})"
    )
  if version != VERSION:
    return f"is a version-{version!r} trace, not version {VERSION}"
  return None


def _damaged(number: int) -> str:
  return (
    f"is damaged at line {number}: it does not follow from the line before by its checksum "
    "(the trace was edited, or lines were dropped, inserted or reordered)"
  )


def _kept_lines(path: str, count: int, chain: Chain) -> list[str]:
  """The first `count` lines of the trace a checkpoint counted, their chain of
  checksums checked (and `chain` brought to the last one's sum); ConfigError
  (one line) for a trace that cannot be continued, before anything is written."""
  remedy = "a runtime=threads workdir keeps its trace.jsonl; use another --workdir"
  if not os.path.exists(path):
    raise ConfigError(
      f"the checkpoint to resume counts {count - 1} traced events, but {path!r} is missing: "
      f"{remedy}"
    )
  with contextlib.closing(_file_lines(path, repr(path), remedy)) as file_lines:
    lines = list(itertools.islice(file_lines, count))
  fault = _header_fault(lines[0] if lines else None)
  if fault is not None:
    raise ConfigError(f"{path!r} {fault}: a resume cannot continue it; use another --workdir")
  if len(lines) < count or not lines[-1].endswith("\n"):
    raise ConfigError(
      f"{path!r} holds fewer whole lines than the checkpoint to resume counts events "
      f"({count - 1}, after the header); use another --workdir"
    )
  for number, line in enumerate(lines, 1):
    if chain.follow(line) is None:
      raise ConfigError(f"{path!r} {_damaged(number)}; use another --workdir")
  return lines


@dataclasses.dataclass
class Trace:
  header: dict
  events: list[Event]
  ticks: int
  processes: list[dict] = dataclasses.field(default_factory=list)  # runtime=ray's
  unvalued: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (worker, step)
  rounds: list[dict] = dataclasses.field(default_factory=list)  # a synchronous rule's
  gone: dict[int, int] = dataclasses.field(default_factory=dict)  # worker -> tick (its rounds')


def read(path: str) -> Trace:
  """A complete trace; ConfigError (one line) for a missing, unreadable, cut,
  damaged or malformed one, naming the line where there is one."""
  name = f"cluster.replay={path!r}"
  remedy = "give the trace.jsonl of a runtime=threads or ray run of this version"
  with contextlib.closing(_file_lines(path, name, remedy)) as file_lines:
    # The header first: a file that is not a trace is refused before the rest is read.
    first = next(file_lines, None)
    fault = _header_fault(first)
    if fault is not None:
      raise ConfigError(f"{name} {fault}: {remedy}")
    lines = [first, *file_lines]
  if not lines[-1].endswith("\n"):
    raise ConfigError(
      f"{name} is cut at line {len(lines)}: its last line has no newline (the run was "
      "stopped as it wrote, or the file cut); replay the trace of a run that completed"
    )
  chain = Chain()
  bodies = []
  for number, line in enumerate(lines, 1):
    body = chain.follow(line)
    if body is None:
      raise ConfigError(f"{name} {_damaged(number)}")
    bodies.append(body)
  # The checksums hold what the writer wrote; what follows checks the writer.
  records = []
  for number, body in enumerate(bodies, 1):
    record = _json(body)
    if not isinstance(record, dict):
      raise ConfigError(f"{name} is malformed at line {number}: not a JSON object")
    records.append(record)
  first = records[0]
  workers = first.get("workers")
  if not _is_int(workers) or workers < 1 or not isinstance(first.get("config"), dict):
    raise ConfigError(f"{name}'s header lacks its workers or config")
  groups = first.get("groups", [])
  if not isinstance(groups, list) or not all(_is_int(n) and n >= 1 for n in groups):
    raise ConfigError(f"{name}'s header has malformed groups: {groups!r}")
  end = records[-1]
  if end.get("kind") != "end":
    raise ConfigError(
      f"{name} is truncated: it has no end line (the run was stopped or the file cut); "
      "replay the trace of a run that completed"
    )
  events, processes, unvalued, rounds, gone = [], [], [], [], {}
  for number, record in enumerate(records[1:-1], 2):
    if record.get("kind") == "gone":
      valid = set(record) == {"kind", "worker", "tick"} and _unvalued_record(
        {"kind": "unvalued", "worker": record["worker"], "step": record["tick"]}, workers
      )
      if not valid or record["worker"] in gone:
        raise ConfigError(
          f"{name} is malformed at line {number}: not a worker of its {workers} gone once "
          "(worker, tick)"
        )
      gone[record["worker"]] = record["tick"]
      continue
    if record.get("kind") == "round":
      if not _round_record(record, workers) or (rounds and record["tick"] <= rounds[-1]["tick"]):
        raise ConfigError(
          f"{name} is malformed at line {number}: not a round of its {workers} workers after "
          "the round before (tick, members, late, arrivals, closed)"
        )
      rounds.append(record)
      continue
    if record.get("kind") == "unvalued":
      if not _unvalued_record(record, workers):
        raise ConfigError(
          f"{name} is malformed at line {number}: not an unvalued step of one of its "
          f"{workers} workers (worker, step)"
        )
      step = (record["worker"], record["step"])
      if step in unvalued:
        raise ConfigError(f"{name} is malformed at line {number}: an unvalued step given twice")
      unvalued.append(step)
      continue
    if record.get("kind") == "process":
      if not _process_record(record, workers):
        raise ConfigError(
          f"{name} is malformed at line {number}: not a process of one of its {workers} "
          "workers (worker, pid, host)"
        )
      processes.append(record)
      continue
    fields = {key: value for key, value in record.items() if key != "kind"}
    wrong = sorted(
      key
      for key in fields.keys() | (_EVENT_FIELDS.keys() - _OPTIONAL_FIELDS)
      if key not in fields
      or key not in _EVENT_FIELDS
      or not _EVENT_FIELDS[key](fields[key])
      or (key in _OPTIONAL_FIELDS and fields[key] is not True)
    )
    # A server's operation names its group; a worker's event, the worker.
    count = len(groups) if fields.get("op") in SERVER_OPS else workers
    if (
      record.get("kind") != "event"
      or wrong
      or fields["op"] not in OPS
      or not 0 <= fields["worker"] < count
      or (fields.get("cut") and fields["op"] not in ("join", "leave"))
    ):
      raise ConfigError(
        f"{name} is malformed at line {number}: not an event of one of its {workers} "
        f"workers with an op of {', '.join(OPS)} (fields missing, unknown or of the wrong "
        f"type: {', '.join(wrong) or 'none'})"
      )
    events.append(Event(**fields))
  if end.get("events") != len(records) - 2 or not _is_int(end.get("ticks")):
    raise ConfigError(
      f"{name} is inconsistent: its end line counts {end.get('events')} events, "
      f"it holds {len(records) - 2}"
    )
  if (rounds or gone) and events:
    raise ConfigError(f"{name} is malformed: it holds both rounds and events")
  return Trace(records[0], events, int(end["ticks"]), processes, unvalued, rounds, gone)


def _round_record(record: dict, workers: int) -> bool:
  def seconds(value) -> bool:
    return _OF_TYPE[float](value) and value >= 0

  def masks(value) -> bool:
    return (
      isinstance(value, list)
      and len(value) == workers
      and all(isinstance(entry, bool) for entry in value)
    )

  members, late, arrivals = record.get("members"), record.get("late"), record.get("arrivals")
  return (
    set(record) == {"kind", "tick", "members", "late", "arrivals", "closed"}
    and _is_int(record["tick"])
    and record["tick"] >= 0
    and masks(members)
    and any(members)
    and masks(late)
    and not any(m and lag for m, lag in zip(members, late, strict=True))
    and isinstance(arrivals, list)
    and len(arrivals) == workers
    and all(arrival is None or seconds(arrival) for arrival in arrivals)
    and all(arrivals[j] is not None for j in range(workers) if members[j] or late[j])
    and seconds(record["closed"])
  )


def _process_record(record: dict, workers: int) -> bool:
  return (
    set(record) == {"kind", "worker", "pid", "host"}
    and _is_int(record["worker"])
    and 0 <= record["worker"] < workers
    and _is_int(record["pid"])
    and isinstance(record["host"], str)
  )


def _unvalued_record(record: dict, workers: int) -> bool:
  return (
    set(record) == {"kind", "worker", "step"}
    and _is_int(record["worker"])
    and 0 <= record["worker"] < workers
    and _is_int(record["step"])
    and record["step"] >= 0
  )


def check_replay(config: ml_collections.ConfigDict) -> list[Tick]:
  """The ticks of the trace config.cluster.replay names, checked against `config`;
  ConfigError if it is not a trace of this configuration, or not consistent.

  The runtime's check asks first, the replay's clock then: the file is read,
  checked and packed once, and each asker gets ticks of its own (the clock
  writes into them). The file is read again if it changed in between."""
  path = config.cluster.replay
  status = os.stat(path) if os.path.isfile(path) else None
  identity = None
  if status is not None:
    identity = (
      status.st_dev,
      status.st_ino,
      status.st_mtime_ns,
      status.st_ctime_ns,
      status.st_size,
    )
  here = recorded_fields(config)
  fields = json.dumps(here, sort_keys=True, default=str)
  groups = header(config).get("groups", [])
  key = (os.path.abspath(path), identity, fields, config.run.total_steps, str(groups))
  if identity is None or key != _checked.get("key"):
    _checked.clear()
    _checked.update(key=key, ticks=_check_replay(path, here, config.run.total_steps, groups))
  return copy.deepcopy(_checked["ticks"])


# The last replay checked: its key (path, file identity, fields, length) and ticks.
_checked: dict = {}


def _check_replay(path: str, here: dict, total_steps: int, here_groups: list) -> list[Tick]:
  trace = read(path)
  _check_recorded(path, trace, here, total_steps, here_groups)
  if trace.rounds:
    raise ConfigError(
      f"cluster.replay={path!r} holds a synchronous rule's rounds: runtime=threads replays "
      "it, not runtime=simulated"
    )
  ticks = pack(trace.events, trace.header["workers"], trace.unvalued, len(here_groups))
  if len(ticks) != trace.ticks:
    raise ConfigError(
      f"cluster.replay={path!r} is inconsistent: its events fill {len(ticks)} ticks, "
      f"its end line counts {trace.ticks}"
    )
  return ticks


def _check_recorded(path: str, trace: Trace, here: dict, total_steps: int, here_groups: list):
  """ConfigError unless `trace` was recorded under this run's trajectory fields (`here`),
  steps and two-tier groups."""
  recorded = trace.header["config"]
  for field in sorted(set(recorded) | set(here)):
    if recorded.get(field) != here.get(field):
      raise ConfigError(
        f"cluster.replay={path!r} was recorded with config.{field}={recorded.get(field)!r}, "
        f"this run has {here.get(field)!r}: replay it under the configuration that recorded it"
      )
  if total_steps != trace.ticks:
    raise ConfigError(
      f"run.total_steps={total_steps}: cluster.replay={path!r} holds "
      f"{trace.ticks} ticks; set run.total_steps={trace.ticks}"
    )
  groups = trace.header.get("groups", [])
  if groups != here_groups:
    raise ConfigError(
      f"cluster.replay={path!r} was recorded with two-tier servers of groups {groups or None}, "
      f"this run has {here_groups or None}: replay it with the cluster.groups (and "
      "outer.two_tier) that recorded it"
    )


@dataclasses.dataclass
class RoundsReplay:
  """What a replay of a synchronous rule's trace follows: each round's (members, late
  workers), by the tick it ends (`Writer.round`), and the workers gone for good, each
  with the tick from which it takes no step (`Writer.gone`)."""

  rounds: dict[int, tuple[list[bool], list[bool]]]
  gone: dict[int, int]


def check_rounds_replay(config: ml_collections.ConfigDict, exchanges: list[int]) -> RoundsReplay:
  """The rounds of the trace config.cluster.replay names, checked against `config`, whose
  rule exchanges after the ticks `exchanges`; ConfigError if it is not a trace of a
  synchronous rule's rounds under this configuration."""
  path = config.cluster.replay
  trace = read(path)
  _check_recorded(path, trace, recorded_fields(config), config.run.total_steps, [])
  if trace.events or (exchanges and not trace.rounds):
    raise ConfigError(
      f"cluster.replay={path!r} holds no rounds: runtime=threads replays the trace of a "
      "synchronous rule's run under runtime=threads (a parameter-server rule's trace "
      "replays under runtime=simulated)"
    )
  recorded = trace.header.get("schedule")
  if recorded != schedule(config):
    fields = ", ".join(f"run.{name}={value}" for name, value in (recorded or {}).items())
    raise ConfigError(
      f"cluster.replay={path!r} was recorded with its cuts at {fields or 'another schedule'}: "
      "replay a synchronous rule's rounds under the schedule that recorded them"
    )
  rounds = {record["tick"]: (record["members"], record["late"]) for record in trace.rounds}
  inconsistent = f"cluster.replay={path!r} is inconsistent:"
  if sorted(rounds) != exchanges:
    raise ConfigError(f"{inconsistent} its rounds end other ticks than {config.algorithm}'s")
  for tick, (members, late) in rounds.items():
    if any(late) and config.outer.missed != "late":
      raise ConfigError(f"{inconsistent} its round at tick {tick} has late workers")
    for j, gone_at in trace.gone.items():
      if gone_at <= tick and (members[j] or late[j]):
        raise ConfigError(f"{inconsistent} worker {j}, gone at tick {gone_at}, is in a round after")
  return RoundsReplay(rounds, trace.gone)


def pack(
  events: list[Event],
  num_workers: int,
  unvalued: list[tuple[int, int]] = (),
  groups: int = 0,
) -> list[Tick]:
  """The ticks of `events` in their order; each event must fall in its recorded tick.
  `unvalued`: the (worker, step) local steps that gave no values, each marked in
  its tick; `groups`: two-tier servers' groups, whose operations are rows of their
  own (TickPacker). (A request's bytes are left to the clock that replays them.)"""
  packer = TickPacker(num_workers, groups)
  leaves = []  # (tick, worker) of each "leave"
  unvalued_left = set(unvalued)
  marks = []  # (tick, worker) of each unvalued step
  for number, event in enumerate(events):
    op = OPS[event.op]
    row = num_workers + event.worker if event.op in SERVER_OPS else event.worker
    try:
      tick = packer.emit(
        event.time,
        row,
        event.local,
        op,
        event.staleness,
        event.wait,
        at_cut=event.tick if event.cut else None,
      )
    except ValueError as error:
      raise ConfigError(
        f"the trace's event {number} (worker {event.worker}) cannot be packed: {error}: "
        "the trace is inconsistent"
      ) from None
    if tick != event.tick:
      raise ConfigError(
        f"the trace's event {number} (worker {event.worker}) packs into tick {tick}, "
        f"it was recorded in tick {event.tick}: the trace is inconsistent"
      )
    if event.op == "leave":
      leaves.append((tick, event.worker))
    requested = event.op in ("exchange", "read")  # a step computed after its request
    if requested and (event.worker, event.step) in unvalued_left:
      unvalued_left.discard((event.worker, event.step))
      marks.append((tick, event.worker))
  if unvalued_left:
    worker, step = min(unvalued_left)
    raise ConfigError(
      f"the trace says worker {worker}'s local step {step} gave no values, and has no "
      "request of that step: the trace is inconsistent"
    )
  ticks = packer.release_all()
  for tick, worker in leaves:
    ticks[tick].left.append(worker)
  for tick, worker in marks:
    ticks[tick].unvalued.append(worker)
  return ticks
