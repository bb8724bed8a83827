"""The studies' scripts: what they may delete."""

import importlib.util
import pathlib

import pytest

import runs

REPO = pathlib.Path(runs.REPO)


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, REPO / "studies" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


faults = _load("faults")


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
