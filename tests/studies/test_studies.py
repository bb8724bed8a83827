"""The studies' scripts: what they may delete, and the settings they describe."""

import argparse
import pathlib

import numpy as np
import pytest

import runs
from easgd import arguments, assembly
from easgd.config import validation
from easgd.sim import timing
from easgd.studies import asynchrony, faults, harness, heterogeneous, processes, scaling

REPO = pathlib.Path(runs.REPO)


def test_the_faults_study_refuses_a_directory_it_did_not_make(tmp_path, capsys):
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "precious").write_text("a user's run")
  with pytest.raises(SystemExit) as exit_info:
    faults.fresh_workdir(str(tmp_path / "runs"))
  assert exit_info.value.code == 2
  assert "not made by this study" in capsys.readouterr().err
  assert (tmp_path / "runs" / "precious").read_text() == "a user's run"
  (tmp_path / "file").write_text("x")
  with pytest.raises(SystemExit):
    faults.fresh_workdir(str(tmp_path / "file"))
  assert (tmp_path / "file").read_text() == "x"


def test_the_faults_study_clears_only_what_it_made(tmp_path):
  workdir = tmp_path / "faults"
  faults.fresh_workdir(str(workdir))  # new: made, and marked
  (workdir / "trial").mkdir()
  faults.fresh_workdir(str(workdir))  # its own: cleared
  assert sorted(p.name for p in workdir.iterdir()) == [faults.MARKER]
  empty = tmp_path / "empty"
  empty.mkdir()
  faults.fresh_workdir(str(empty))
  assert (empty / faults.MARKER).is_file()


def test_the_faults_study_refuses_to_overwrite_a_table_it_did_not_write(
  tmp_path, capsys, monkeypatch
):
  out = tmp_path / "faults_table.md"
  out.write_text("a user's table\n")
  doc = tmp_path / "faults.md"
  doc.write_text(f"{faults.BEGIN}\n{faults.END}\n")
  argv = ["faults.py", f"--workdir={tmp_path / 'runs'}", f"--out={out}", f"--doc={doc}"]
  monkeypatch.setattr("sys.argv", argv)
  with pytest.raises(SystemExit) as exit_info:
    faults.main()
  assert exit_info.value.code == 2
  assert "was not written by this tool" in capsys.readouterr().err
  assert out.read_text() == "a user's table\n" and not (tmp_path / "runs").exists()


def test_the_heterogeneous_cluster_is_what_its_study_says():
  config = heterogeneous.config_for("async_local_sgd-DN-DyLU", 600, 0, {})
  cluster = timing.Cluster.from_config(config.cluster)
  slowdown = cluster.mean_step_times(8) / cluster.compute_time
  # Worker 6 twice and worker 7 four times as slow as worker 0, the others between.
  np.testing.assert_allclose(slowdown[[0, 6, 7]], [1.0, 2.0, 4.0])
  assert all(1 < s < 2 for s in slowdown[1:6])
  # DyLU sizes each worker's local steps to its speed: H = 4 for the fastest, 1 for the slowest.
  rule = assembly.rule(config)
  assert rule.periods(cluster) == (4, 3, 3, 2, 2, 2, 2, 1)


@pytest.mark.parametrize("run", sorted(heterogeneous.RUNS))
def test_each_heterogeneous_run_is_a_valid_config(run):
  validation.validate(heterogeneous.config_for(run, 600, 0, {}))


def test_the_processes_study_slows_worker_2_twice_and_worker_3_four_times():
  values = processes.overrides("async_easgd", 4, 0, 600, stragglers=True)
  cluster = timing.Cluster.from_config(processes.config_of(values).cluster)
  np.testing.assert_allclose(cluster.mean_step_times(4) / cluster.compute_time, [1, 1, 2, 4])


@pytest.mark.parametrize(
  "rule,workers",
  [(rule, 4) for rule in (*processes.ASYNC_RULES, "sync_easgd")]
  + [("downpour", workers) for workers in processes.DOWNPOUR_WORKERS],
)
def test_each_processes_run_is_a_valid_config(rule, workers):
  values = processes.overrides(rule, workers, 0, 600, stragglers=rule != "downpour")
  validation.validate(processes.config_of(values))


@pytest.mark.e2e
def test_a_study_with_parallel_runs_writes_the_table_of_the_study_run_in_series(tmp_path):
  """Each run in a Tune trial of its own (--parallel) reaches the bits of the runs trained
  one after another in the study's process: the same table."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  tables = []
  for name, extra in (("series", []), ("parallel", ["--parallel=2"])):
    command = [
      sys.executable,
      "studies/heterogeneous.py",
      f"--workdir={tmp_path / name}",
      f"--docs={tmp_path / (name + '_docs')}",
      "--total_steps=5",
      "--seeds=1",
      "--runs=async_easgd",
      "--set=model='mlp'",
      *extra,
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "heterogeneous: 1/1 async_easgd, seed 0" in done.stdout
    table = (tmp_path / (name + "_docs") / "heterogeneous_table.md").read_text().splitlines()
    tables.append([line for line in table if not line.startswith("Made by")])
  assert tables[0] == tables[1] and sum(line.startswith("| ") for line in tables[0]) == 2


@pytest.mark.parametrize("text", ["2,4", "1,3", "1,4,2", "1,1", "", "x"])
def test_the_scaling_study_takes_increasing_worker_counts_from_1_that_divide_its_batch(text):
  with pytest.raises(argparse.ArgumentTypeError, match="increasing worker counts from 1 that"):
    scaling.worker_counts(text)


def test_a_part_of_a_study_is_some_of_its_values_in_their_order():
  parse = arguments.some_of(processes.N_SYNCS)
  assert parse("16,1") == (1, 16)
  for text in ("2", "1,x", ""):
    with pytest.raises(argparse.ArgumentTypeError, match="choose some of 1,4,16"):
      parse(text)


@pytest.mark.parametrize(
  "study,argv,said",
  [
    (processes, ["--downpour_workers=2,4"], "--downpour_workers needs 1"),
    (processes, ["--n_syncs=1"], "--n_syncs needs one above 1"),
    (faults, ["--only=SIGKILL;a meteor"], "'a meteor' is in no fault's name"),
    (faults, ["--only=SIGKILL;"], "--only: '' is in no fault's name"),
    (faults, ["--only=SIGKILL"], "give --out a table of its own, not"),
  ],
)
def test_a_part_that_cannot_run_is_refused_in_one_line(
  tmp_path, capsys, monkeypatch, study, argv, said
):
  monkeypatch.setattr("sys.argv", ["study.py", f"--workdir={tmp_path / 'runs'}", *argv])
  with pytest.raises(SystemExit) as exit_info:
    study.main()
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and said in err, err
  assert not (tmp_path / "runs").exists()


def test_the_asynchrony_table_marks_a_rule_with_no_evaluation_within_the_common_time(tmp_path):
  row = {
    "rule": "async_easgd",
    "reached": 0,
    "seeds": 1,
    "time_to_target": None,
    "steps_to_target": None,
    "accuracy_at_common_time": None,  # its first evaluation came after the common time
    "final_accuracy": 0.5,
    "final_time": 0.4,
    "final_steps": 25,
    "megabytes_per_worker": 1.0,
    "staleness": None,
  }
  path = tmp_path / "table.md"
  asynchrony.write_table([row], path, "python studies/asynchrony.py", 0.3, 25, {})
  assert "| async_easgd | " in path.read_text()
  assert "| - | 0.500 | 0.40 | 25 | 1.0 |  |" in path.read_text()


def test_rows_put_into_a_table_replace_their_namesakes_and_keep_the_others(tmp_path):
  """--add_to_table: a run's row in place of the row of the same name, a new one after the
  others, the budgets read from the header, one note per command however often it runs."""
  path = tmp_path / "table.md"
  path.write_text(
    "# A study\n\nMade by `python studies/outer.py`: ...\n\n"
    "| run | exchange | acc. at 6.02 sim s | acc. at 27.0 MB |\n|---|---|---|---|\n"
    "| a | float32 | 0.1 | 0.2 |\n| b | int8 | 0.3 | 0.4 |\n"
  )
  head, rows, tail = harness.table_parts(str(path))
  assert harness.budgets_of(head) == [6.02, 27.0] and len(rows) == 2 and tail == []
  new = {("b", "int8"): "| b | int8 | 0.5 | 0.6 |", ("c", "int2+EF"): "| c | int2+EF | 0.7 | 0.8 |"}
  for _ in range(2):
    harness.add_rows(str(path), new, "python studies/outer.py --add_to_table", "as before.")
  head, rows, tail = harness.table_parts(str(path))
  assert rows == ["| a | float32 | 0.1 | 0.2 |", new["b", "int8"], new["c", "int2+EF"]]
  assert [line for line in tail if line] == [
    f"Rows put in by `python studies/outer.py --add_to_table` on {harness.today()}: "
    "b int8, c int2+EF; as before."
  ]
