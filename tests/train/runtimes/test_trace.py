"""The trace's integrity, without a training run: its chain of checksums refuses a
line edited, dropped, inserted or moved, every bad file is refused in one line,
and a resumed trace continues the chain."""

import hashlib
import json
import re

import pytest

from easgd.configs.default import get_config
from easgd.errors import ConfigError
from easgd.train import trainer
from easgd.train.runtimes import trace

# The suffix a line's checksum takes, as the trace's module docstring describes it.
SUM = re.compile(r', "sum": "[0-9a-f]{16}"\}\n\Z')

# Two workers' events: a few local steps and exchanges, as a threads run writes them.
EVENTS = [
  trace.Event(0, 0, "local", True, 0, time=0.1, compute=0.1),
  trace.Event(1, 0, "local", True, 0, time=0.12, compute=0.12),
  trace.Event(0, 1, "exchange", True, 1, read=0, wrote=1, staleness=0, time=0.2, service=0.01),
  trace.Event(1, 1, "exchange", True, 1, read=1, wrote=2, staleness=0, time=0.25, service=0.01),
  trace.Event(0, 2, "local", True, 2, time=0.3, compute=0.1),
]


def _config():
  config = get_config()
  config.algorithm = "async_easgd"
  config.workers = 2
  return config


def _write(workdir, events=EVENTS, ticks=3, keep_events=None, end=True):
  """The lines of the trace a Writer leaves in `workdir` after `events` (and the
  end line, unless `end` is false)."""
  writer = trace.Writer(str(workdir), _config(), keep_events)
  for event in events:
    writer.add(event)
  if end:
    writer.end((keep_events or 0) + len(events), ticks)
  writer.close()
  return (workdir / trace.FILE).read_text().splitlines(keepends=True)


def _bodies(lines):
  """Each line's JSON body: the line without its checksum."""
  return [SUM.sub("}", line) for line in lines]


def _chained(bodies):
  """The lines of `bodies`, each carrying its checksum: the first 16 hex digits of
  sha256 of the line before's (the header's: "") and the body."""
  lines, previous = [], ""
  for body in bodies:
    previous = hashlib.sha256((previous + body).encode()).hexdigest()[:16]
    lines.append(f'{body[:-1]}, "sum": "{previous}"}}\n')
  return lines


def _refused(path, pattern):
  with pytest.raises(ConfigError, match=pattern) as error:
    trace.read(str(path))
  assert "\n" not in str(error.value)


def test_a_written_trace_is_read_back_and_its_sums_are_the_formats(tmp_path):
  lines = _write(tmp_path)
  recorded = trace.read(str(tmp_path / trace.FILE))
  assert recorded.events == EVENTS and recorded.ticks == 3
  assert recorded.header["version"] == trace.VERSION == 2
  assert recorded.header["workers"] == 2 and "sum" not in recorded.header
  assert [json.loads(line)["kind"] for line in lines] == ["header", *["event"] * 5, "end"]
  assert _chained(_bodies(lines)) == lines  # the chain, computed from the description


def _damage(lines):
  """(name, the damaged file's text or bytes, the pattern its refusal matches)."""
  text = "".join(lines)
  last = len(lines)
  damaged = "is damaged at line {}: it does not follow from the line before by its checksum"
  return [
    ("worker.jsonl", text.replace('"worker": 1', '"worker": 0', 1), damaged.format(3)),
    ("op.jsonl", text.replace('"op": "local"', '"op": "lokal"', 1), damaged.format(2)),
    ("header.jsonl", text.replace('"workers": 2', '"workers": 3', 1), damaged.format(1)),
    ("dropped.jsonl", "".join(lines[:3] + lines[4:]), damaged.format(4)),
    ("swapped.jsonl", "".join([*lines[:2], lines[3], lines[2], *lines[4:]]), damaged.format(3)),
    ("repeated.jsonl", "".join([*lines[:3], lines[2], *lines[3:]]), damaged.format(4)),
    ("inserted.jsonl", "".join([*lines[:3], '{"kind": "event"}\n', *lines[3:]]), damaged.format(4)),
    ("end.jsonl", text.replace('"events": 5', '"events": 4'), damaged.format(last)),
    ("reversed.jsonl", "".join([lines[0], *lines[1:-1][::-1], lines[-1]]), damaged.format(2)),
    (
      "no_sum.jsonl",
      "".join([*lines[:2], _bodies(lines)[2] + "\n", *lines[3:]]),
      damaged.format(3),
    ),
    ("cut.jsonl", text[:-10], f"is cut at line {last}: its last line has no newline"),
    ("no_end.jsonl", "".join(lines[:-1]), "is truncated: it has no end line"),
    ("header_only.jsonl", lines[0], "is truncated: it has no end line"),
    ("binary.jsonl", lines[0].encode() + b"\xff\xfe\x00\x01\n", "is not UTF-8 text at line 2"),
    ("empty.jsonl", "", "does not begin with a version-2 trace header: it is empty"),
    ("not_a_trace.jsonl", '{"kind": "end"}\n', "does not begin with a version-2 trace header"),
    ("a_list.jsonl", "[1, 2]\n", "does not begin with a version-2 trace header"),
    ("not_json.jsonl", "epoch,loss\n1,0.5\n", "does not begin with a version-2 trace header"),
    ("version_3.jsonl", text.replace('"version": 2', '"version": 3'), "is a version-3 trace"),
    ("version_true.jsonl", text.replace('"version": 2', '"version": true'), "a version-True"),
    ("huge.jsonl", text.replace('"version": 2', '"version": ' + "1" * 5000), "trace header"),
    ("deep.jsonl", "[" * 100_000 + "\n", "does not begin with a version-2 trace header"),
    ("crlf.jsonl", text.replace("\n", "\r\n"), r"has Windows line endings \(\\r\\n\)"),
  ]


def test_every_damage_is_refused_in_one_line_naming_its_line(tmp_path):
  lines = _write(tmp_path)
  for name, content, pattern in _damage(lines):
    path = tmp_path / name
    if isinstance(content, bytes):
      path.write_bytes(content)
    else:
      path.write_text(content)
    _refused(path, pattern)
  _refused(tmp_path / "nowhere.jsonl", r"=.*nowhere.jsonl' does not exist: give the trace.jsonl")
  _refused(tmp_path, r"is a directory: give the trace.jsonl of a runtime=threads or ray run")


def _version_1(lines):
  """The trace of `lines` as an earlier version wrote it: version 1, no sums."""
  records = [json.loads(body) for body in _bodies(lines)]
  records[0]["version"] = 1
  return "".join(json.dumps(record) + "\n" for record in records)


def test_a_trace_of_an_earlier_version_is_refused_naming_it(tmp_path):
  lines = _write(tmp_path)
  path = tmp_path / "version_1.jsonl"
  path.write_text(_version_1(lines))
  _refused(path, r"was written by an earlier version of this program \(a version-1 trace, ")
  # A threads run whose workdir holds one cannot resume it, and leaves it as it was.
  resumed = tmp_path / "resumed"
  resumed.mkdir()
  (resumed / trace.FILE).write_text(_version_1(lines))
  with pytest.raises(ConfigError, match=r"was written by an earlier version.*another --workdir"):
    trace.Writer(str(resumed), _config(), 3)
  assert (resumed / trace.FILE).read_text() == _version_1(lines)


def test_the_structural_checks_catch_what_the_sums_cannot(tmp_path):
  """A line changed and the chain computed again (as a writer with a bug would
  write it) passes the sums; the checks of the events' contents refuse it."""
  bodies = _bodies(_write(tmp_path))
  header = json.loads(bodies[0])
  del header["workers"]
  cases = [
    ("op", 3, bodies[3].replace('"op": "exchange"', '"op": "fly"'), "line 4: .* op of local,"),
    ("worker", 2, bodies[2].replace('"worker": 1', '"worker": 7'), "line 3: .* its 2 workers"),
    ("field", 5, bodies[5].replace('"local": true', '"lokal": true'), "line 6: .*: local, lokal"),
    ("type", 1, bodies[1].replace('"worker": 0', '"worker": "0"'), r"line 2: .*type: worker\)"),
    ("bool", 1, bodies[1].replace('"worker": 0', '"worker": false'), r"line 2: .*type: worker\)"),
    ("list", 3, bodies[3].replace('"op": "exchange"', '"op": ["x"]'), r"line 4: .*type: op\)"),
    ("time", 2, bodies[2].replace('"time": 0.12', '"time": "0.12"'), r"line 3: .*type: time\)"),
    ("deep", 2, '{"worker": ' + "[" * 100_000 + "}", "line 3: not a JSON object"),
    ("kind", 2, bodies[2].replace('"kind": "event"', '"kind": "end"'), "line 3: not an event"),
    ("header", 0, json.dumps(header), "header lacks its workers or config"),
    ("count", 6, bodies[6].replace('"events": 5', '"events": 4'), "end line counts 4 events"),
    ("ticks", 6, '{"kind": "end", "events": 5}', "is inconsistent"),
  ]
  for name, number, body, pattern in cases:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(_chained([*bodies[:number], body, *bodies[number + 1 :]])))
    _refused(path, pattern)


def test_a_resumed_trace_continues_the_chain(tmp_path):
  # A run killed after its 5th event, mid-way through writing its 6th.
  lines = _write(tmp_path, end=False)
  (tmp_path / trace.FILE).write_text("".join(lines) + '{"kind": "event", "wor')
  # Its checkpoint counted 3 events: the trace is cut back to them, then continues.
  more = [trace.Event(1, 2, "local", True, 2, time=0.4), trace.Event(0, 3, "local", True, 3)]
  resumed = _write(tmp_path, events=more, ticks=4, keep_events=3)
  assert resumed[:4] == lines[:4]
  recorded = trace.read(str(tmp_path / trace.FILE))  # the whole file verifies
  assert recorded.events == [*EVENTS[:3], *more] and recorded.ticks == 4
  assert not (tmp_path / (trace.FILE + ".cut")).exists()


def test_a_resume_refuses_a_kept_prefix_that_was_edited_writing_nothing(tmp_path):
  lines = _write(tmp_path, end=False)
  lines[2] = lines[2].replace('"worker": 1', '"worker": 0')
  edited = "".join(lines)
  (tmp_path / trace.FILE).write_text(edited)
  damaged = r"trace.jsonl' is damaged at line 3: it does not follow .* use another --workdir$"
  with pytest.raises(ConfigError, match=damaged) as error:
    trace.Writer(str(tmp_path), _config(), 3)
  assert "\n" not in str(error.value)
  assert (tmp_path / trace.FILE).read_text() == edited
  assert not (tmp_path / (trace.FILE + ".cut")).exists()
  # A line past the checkpoint's events is dropped, whatever it holds.
  _write(tmp_path, events=[], keep_events=1)
  assert trace.read(str(tmp_path / trace.FILE)).events == EVENTS[:1]


def test_a_resume_refuses_a_trace_shorter_than_its_checkpoint(tmp_path):
  lines = _write(tmp_path, end=False)
  (tmp_path / trace.FILE).write_text("".join(lines[:3]) + lines[3][:-1])  # event 3 cut
  with pytest.raises(ConfigError, match=r"holds fewer whole lines than the checkpoint"):
    trace.Writer(str(tmp_path), _config(), 3)
  (tmp_path / trace.FILE).write_text("".join(lines).replace("\n", "\r\n"))
  with pytest.raises(ConfigError, match=r"has Windows line endings .* use another --workdir$"):
    trace.Writer(str(tmp_path), _config(), 3)
  (tmp_path / trace.FILE).write_bytes(b"\xff\n")
  with pytest.raises(ConfigError, match=r"is not UTF-8 text at line 1: .* use another --workdir$"):
    trace.Writer(str(tmp_path), _config(), 3)


def test_a_trace_is_replayed_only_under_the_configuration_that_recorded_it(tmp_path):
  """Refused before any tick is packed: another configuration, another length, and a
  replay asked of the threads runtime or of a synchronous rule (the whole replay is
  test_threads.py's, with a recorded run)."""
  _write(tmp_path)
  replay = _config()
  replay.cluster.replay = str(tmp_path / trace.FILE)
  replay.run.total_steps = 3
  other = replay.copy_and_resolve_references()
  other.optimizer.learning_rate = replay.optimizer.learning_rate / 2
  rate = replay.optimizer.learning_rate
  recorded = rf"recorded with config.optimizer.learning_rate={rate}, this run has {rate / 2}"
  longer = replay.copy_and_resolve_references()
  longer.run.total_steps = 4
  threads = replay.copy_and_resolve_references()
  threads.runtime = "threads"
  sync = replay.copy_and_resolve_references()
  sync.algorithm = "sync_easgd"
  for config, pattern in [
    (other, recorded),
    (longer, r"holds 3 ticks; set run.total_steps=3"),
    (threads, r"^config.cluster.replay=.* a parameter-server rule's trace replays under"),
    (sync, r"sync_easgd has none"),
  ]:
    with pytest.raises(ConfigError, match=pattern) as error:
      trainer.check(config)  # the fields, then the runtime's own checks (the replay's too)
    assert "\n" not in str(error.value)


def test_a_step_that_gave_no_values_is_marked_in_its_tick_and_checked(tmp_path):
  """runtime=ray traces a step whose process died as it computed it ("unvalued");
  the replay's tick marks it, so that the logged means leave it out as the run's did."""
  writer = trace.Writer(str(tmp_path), _config(), None)
  for event in EVENTS[:4]:
    writer.add(event)
  writer.unvalued(1, 1)  # worker 1's exchange step 1 (EVENTS[3]) gave no values
  writer.add(trace.Event(1, 2, "join", False, 2, read=2, time=0.28))
  writer.add(EVENTS[4])
  writer.end(7, 3)
  writer.close()
  recorded = trace.read(str(tmp_path / trace.FILE))
  assert recorded.unvalued == [(1, 1)]
  ticks = trace.pack(recorded.events, 2, recorded.unvalued)
  assert [tick.unvalued for tick in ticks] == [[], [1], []]
  # A mark must name a step computed after its request (an exchange or a read).
  for step in ((0, 7), (0, 0)):  # no such step; a plain local step (computed before)
    with pytest.raises(ConfigError, match=f"local step {step[1]} gave no values, and has no"):
      trace.pack(recorded.events, 2, [step])
  bodies = _bodies((tmp_path / trace.FILE).read_text().splitlines(keepends=True))
  for bad in ('"step": -1', '"step": 1.5', '"worker": 2'):
    field = bad.split(":")[0]
    body = re.sub(rf"{field}: [^,}}]+", bad, bodies[5], count=1)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(_chained([*bodies[:5], body, *bodies[6:]])))
    _refused(path, "line 6: not an unvalued step of one of its 2 workers")
  twice = _chained([*bodies[:6], bodies[5], *bodies[6:-1], bodies[-1].replace("7", "8", 1)])
  (tmp_path / "twice.jsonl").write_text("".join(twice))
  _refused(tmp_path / "twice.jsonl", "line 7: an unvalued step given twice")


def test_a_reset_at_a_cut_packs_into_the_cuts_tick_and_only_a_reset_may_say_so(tmp_path):
  """runtime=ray's join or leave of a process lost at a cut ("cut": true) is the last
  operation of the cut's own tick, after the worker's own step there; any other
  join or leave goes to the tick after the worker's last event."""
  cut = trace.Event(1, 2, "join", False, 1, read=2, time=0.28, cut=True)
  lines = _write(tmp_path, [*EVENTS[:4], cut, EVENTS[4]], ticks=3)
  assert '"cut": true' in lines[5] and all('"cut"' not in line for line in lines[:5])
  recorded = trace.read(str(tmp_path / trace.FILE))
  ticks = trace.pack(recorded.events, 2, recorded.unvalued)
  # Tick 1: both workers' exchanges, then worker 1's reset.
  assert [(int(op), worker) for op, worker in ticks[1].ops] == [
    (int(trace.OPS["exchange"]), 0),
    (int(trace.OPS["exchange"]), 1),
    (int(trace.OPS["join"]), 1),
  ]
  # Not at a cut, the same join falls in the tick after worker 1's exchange.
  plain = trace.Event(1, 2, "join", False, 1, read=2, time=0.28)
  with pytest.raises(ConfigError, match="packs into tick 2, it was recorded in tick 1"):
    trace.pack([*EVENTS[:4], plain], 2)
  # A reset at a cut before the worker's own last event cannot be packed.
  early = trace.Event(1, 2, "join", False, 0, read=2, time=0.28, cut=True)
  with pytest.raises(ConfigError, match=r"event 4 \(worker 1\) cannot be packed: .* before"):
    trace.pack([*EVENTS[:4], early], 2)
  bodies = _bodies(lines)
  for name, body, pattern in [
    ("false", bodies[5].replace('"cut": true', '"cut": false'), r"type: cut\)"),
    ("number", bodies[5].replace('"cut": true', '"cut": 1'), r"type: cut\)"),
    ("local", bodies[5].replace('"op": "join"', '"op": "local"'), "not an event"),
  ]:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(_chained([*bodies[:5], body, *bodies[6:]])))
    _refused(path, f"line 6: .*{pattern}")


def test_a_replay_is_read_and_checked_once_and_each_asker_gets_its_own_ticks(tmp_path, monkeypatch):
  """The runtime's check and the replay's clock both ask for the ticks: the file is read
  once, unless it changed in between, and the clock's writes stay its own."""
  _write(tmp_path)
  replay = _config()
  replay.cluster.replay = str(tmp_path / trace.FILE)
  replay.run.total_steps = 3
  reads = []
  read = trace.read
  monkeypatch.setattr(trace, "read", lambda path: reads.append(path) or read(path))
  first = trace.check_replay(replay)
  time = first[0].time
  first[0].time = -1.0
  second = trace.check_replay(replay)
  assert len(reads) == 1
  assert second[0].time == time
  _write(tmp_path, events=EVENTS[:4], ticks=2)  # rewritten: now two ticks
  with pytest.raises(ConfigError, match=r"holds 2 ticks; set run.total_steps=2"):
    trace.check_replay(replay)
  assert len(reads) == 2


def test_a_rounds_trace_is_checked_line_by_line_and_against_its_rule(tmp_path):
  """A synchronous rule's trace (runtime=threads and ray: rounds, and a worker gone for
  good) is read back; a round that is not one, a worker gone and then in a round, late
  workers under drop and rounds at other ticks than the rule's are refused in one line."""
  config = _config()
  config.algorithm, config.run.total_steps = "sync_easgd", 8  # rounds end ticks 3 and 7
  config.cluster.replay = str(tmp_path / trace.FILE)
  writer = trace.Writer(str(tmp_path), config, None)
  writer.round(3, [True, False], [False, False], [0.0, 0.5], 0.1)
  writer.gone(1, 4)
  writer.round(7, [True, False], [False, False], [0.0, None], 0.0)
  writer.end(3, 8)
  writer.close()
  replayed = trace.check_rounds_replay(config, [3, 7])
  assert replayed.rounds == {3: ([True, False], [False, False]), 7: ([True, False], [False, False])}
  assert replayed.gone == {1: 4}
  with pytest.raises(ConfigError, match="its rounds end other ticks than sync_easgd's"):
    trace.check_rounds_replay(config, [3])
  other = config.copy_and_resolve_references()
  other.run.log_every = 7  # its cuts elsewhere
  with pytest.raises(ConfigError, match=r"recorded with its cuts at run.log_every=\d+"):
    trace.check_rounds_replay(other, [3, 7])

  bodies = _bodies((tmp_path / trace.FILE).read_text().splitlines(keepends=True))
  cases = [
    (
      "both",
      1,
      bodies[1].replace('"late": [false, false]', '"late": [true, false]'),
      "line 2: not a round",
    ),
    (
      "nobody",
      1,
      bodies[1].replace('"members": [true, false]', '"members": [false, false]'),
      "line 2: not a round",
    ),
    ("arrival", 1, bodies[1].replace("[0.0, 0.5]", "[null, 0.5]"), "line 2: not a round"),
    ("order", 3, bodies[3].replace('"tick": 7', '"tick": 3'), "line 4: not a round"),
    ("gone", 2, bodies[2].replace('"worker": 1', '"worker": 2'), "line 3: not a worker"),
    (
      "back",
      3,
      bodies[3].replace("[true, false]", "[true, true]").replace("null", "0.0"),
      "worker 1, gone at tick 4, is in a round after",
    ),
    (
      "late",
      3,
      bodies[3].replace('"late": [false, false]', '"late": [false, true]').replace("null", "0.0"),
      "worker 1, gone|has late workers",
    ),
  ]
  for name, number, body, pattern in cases:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(_chained([*bodies[:number], body, *bodies[number + 1 :]])))
    config.cluster.replay = str(path)
    with pytest.raises(ConfigError, match=pattern) as error:
      trace.check_rounds_replay(config, [3, 7])
    assert "\n" not in str(error.value)
