"""The package's shape: layers, cycles, module sizes, an installable package, one set of pins."""

import ast
import pathlib
import re
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# Where each installed package lives in the repository.
PACKAGE_DIRS = {"easgd": REPO / "easgd", "easgd.models": REPO / "models"}
PACKAGE_DIRS["easgd.configs"] = REPO / "configs"
PACKAGE_DIRS["easgd.studies"] = REPO / "studies"
# The package's layers, from the bottom: a module imports its own layer or lower
# ones. The entry points and the packaged configs sit on top.
LAYERS = (
  (
    "easgd.errors",
    "easgd.declare",
    "easgd.arguments",
    "easgd.durations",
    "easgd.ray_connection",
    "easgd.ownership",
    "easgd.algorithm",
  ),
  ("easgd.models",),
  ("easgd.rules", "easgd.sim"),
  ("easgd.infra",),
  ("easgd.data",),
  ("easgd.steps", "easgd.evaluation", "easgd.pipeline", "easgd.assembly", "easgd.registry"),
  ("easgd.config",),
  ("easgd.train",),
  (
    "easgd.cli",
    "easgd.plan",
    "easgd.sweep",
    "easgd.executor",
    "easgd.jobs",
    "easgd.tuning",
    "easgd.launch",
    "easgd.configs",
  ),
  ("easgd.studies",),
)
# Spelled in pieces so that this file does not name them itself.
IMPORT_PATH = "sys." + "path"
# What may name it all the same: the tests' starter of programs, which puts a
# script's folder first on the path as `python SCRIPT` does.
STARTS_PROGRAMS = REPO / "tests" / "forked.py"
OUTSIDE = ("ALGORITHMS" + ".md", "../" + "shared")


def _modules() -> dict[str, pathlib.Path]:
  """Every module of the package, by dotted name."""
  found = {}
  for package, folder in PACKAGE_DIRS.items():
    for path in folder.rglob("*.py"):
      relative = path.relative_to(folder).with_suffix("")
      parts = [part for part in relative.parts if part != "__init__"]
      found[".".join([package, *parts])] = path
  return found


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
  """The package modules that `name` imports, at its top level or inside functions."""
  tree = ast.parse(path.read_text())
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base])
      # from package import module names the module; from module import name, the module.
      targets = [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        for alias in node.names
      ]
    else:
      continue
    found |= {target for target in targets if target in MODULES}
  return found - {name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _declarations(name: str) -> bool:
  """A part's declarations module (its `fields`): it imports nothing but the declaring
  mechanism, so it sits at the bottom wherever its part is, and the config layer
  may assemble it (a runtime's fields, declared beside the runtime)."""
  return name.endswith(".fields") and GRAPH[name] <= {"easgd.declare"}


def _layer(name: str) -> int:
  if _declarations(name):
    return 0
  for index, prefixes in enumerate(LAYERS):
    if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
      return index
  raise AssertionError(f"{name} is in no layer of LAYERS")


def test_every_module_is_in_a_layer():
  for name in MODULES:
    if name != "easgd":
      _layer(name)


def test_imports_run_down_the_layers():
  upward = {
    (name, imported)
    for name, imports in GRAPH.items()
    for imported in imports
    if "easgd" not in (name, imported) and _layer(imported) > _layer(name)
  }
  assert upward == set()


def test_the_imports_have_no_cycle():
  """Function-level imports included: a cycle hidden in a function is still one."""
  done, active = set(), []

  def visit(name):
    if name in active:
      cycle = active[active.index(name) :] + [name]
      pytest.fail("import cycle: " + " -> ".join(cycle))
    if name in done:
      return
    active.append(name)
    for imported in sorted(GRAPH[name]):
      # A package's __init__ importing its own submodules is not a cycle of layers.
      if not imported.startswith(name + "."):
        visit(imported)
    active.pop()
    done.add(name)

  for name in sorted(GRAPH):
    visit(name)


def test_tests_mirror_the_package_folders():
  """tests/ has a folder for each of the package's folders that has tests of its own."""
  folders = {
    path.parent.relative_to(REPO / "tests") for path in (REPO / "tests").rglob("test_*.py")
  }
  for folder in folders:
    if folder != pathlib.Path("."):
      assert (REPO / "easgd" / folder).is_dir() or (REPO / folder).is_dir(), folder


def test_nothing_edits_the_import_path_or_cites_files_outside_the_repository():
  for path in REPO.rglob("*"):
    if any(
      part in {".venv", ".git", "runs"} or part.startswith(".")
      for part in path.parts[len(REPO.parts) :]
    ):
      continue
    if path.suffix in {".py", ".md", ".toml"} and path.is_file():
      text = path.read_text()
      if path.suffix == ".py" and path != STARTS_PROGRAMS:
        assert IMPORT_PATH not in text, path
      assert not any(outside in text for outside in OUTSIDE), path


def _pins(lines) -> dict[str, str]:
  pins = {}
  for line in lines:
    pin = line.split("#")[0].strip()
    if pin:
      name, _, version = pin.partition("==")
      pins[re.sub(r"[-_.]+", "-", name).lower()] = version
  return pins


def test_the_package_declares_the_pins_of_requirements_txt():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  declared = _pins([*project["dependencies"], *project["optional-dependencies"]["dev"]])
  assert declared == _pins((REPO / "requirements.txt").read_text().splitlines())
  packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
  assert set(packages) == {name for name, path in MODULES.items() if path.name == "__init__.py"}


def test_the_accelerator_extras_bring_the_pinned_jax():
  """pip install -e ".[cuda12]" (README) installs the CUDA build of the same jax."""
  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  jax_pin = _pins((REPO / "requirements.txt").read_text().splitlines())["jax"]
  for extra in ("cuda12", "cuda13", "tpu"):
    assert extras[extra] == [f"jax[{extra}]=={jax_pin}"], extra


def test_models_and_configs_are_the_packages_own():
  import easgd.configs.default  # noqa: PLC0415
  import easgd.models  # noqa: PLC0415

  assert pathlib.Path(easgd.models.__file__).parent == REPO / "models"
  assert easgd.configs.default.get_config().algorithm == "sync_easgd"
