"""Every GPU measurement of the project in one command, for one GPU and a few minutes.

    python bench/gpu_check.py [--report runs/gpu_check.md] [--minutes 9] [--wheels DIR]

Runs, each as a process of its own with its share of --minutes (it is stopped,
with every process it started, when its share is spent), on the first GPU:
  tier         the GPU tier of the tests (pytest -m gpu, tests/test_gpu.py);
  resnet50     bench/gpu.py's ResNet-50 row: bfloat16, batch 256;
  small        bench/gpu.py's ResNet-20 and LeNet-5 rows (float32, batch 512 and
               1,024) with sync_easgd of 4 workers on the one GPU beside the plain step;
  determinism  bench/gpu_determinism.py: two train.py runs with and two without
               XLA:GPU's deterministic ops, leaf by leaf;
  ray          bench/ray_replay.py on 4 worker processes sharing the GPU and the
               replay of their trace, leaf by leaf (needs ray: skipped without it);
and writes one report (Markdown), rewritten after each part: the device, the
version of each package the project pins beside its pin, and for each part
its command, exit status, seconds and the end of its output. It prints one
line a part as it goes, and exits 1 if a part failed or was stopped.

--wheels DIR: wheels to install first (pip install --no-index --no-deps into a
new temporary folder, put on the parts' PYTHONPATH), for a GPU machine without
the package index that has jax 0.11.2 and its CUDA plugin but not all of the
project's pins. The pins such a machine may lack, by their wheels' sizes for
Python 3.12 on x86_64: ml-collections 75 KB, tensorboardX 86 KB, mlxtend
1.3 MB, tensorflow-datasets 5.2 MB, array-record 3.8 MB, grain 0.6 MB,
importlib_resources 37 KB, pytest and pytest-xdist (the tier), flax 0.5 MB,
optax 0.4 MB, orbax-checkpoint 1.4 MB, numpy 15 MB, and ray 77 MB (the ray
part only); each also needs the dependencies of its own that the machine
lacks (tensorflow-datasets: dm-tree, immutabledict, promise, simple-parsing,
tensorflow-metadata, termcolor, toml; ray: jsonschema). The report's table
names every pinned package that is missing or at another version.

Without a GPU, or with a bad argument, it refuses in one line (exit 2) and
writes nothing. The parts' own figures and their meaning: bench/README.md,
"On one GPU"; docs/runtimes.md, "On GPU workers".
"""

import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from easgd.arguments import ArgumentParser, existing_directory, fail, number, output_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("tier", "resnet50", "small", "determinism", "ray")
# Each part's command and its share of the time (they add up to 1).
COMMANDS = {
  "tier": (
    ["-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"],
    0.35,
  ),
  "resnet50": (
    [
      "bench/gpu.py",
      "--models=resnet50",
      "--dtypes=bfloat16",
      "--batches=resnet50=256",
      "--rounds=3",
      "--steps=5",
    ],
    0.15,
  ),
  "small": (
    [
      "bench/gpu.py",
      "--models=resnet20,lenet5",
      "--dtypes=float32",
      "--batches=resnet20=512,lenet5=1024",
      "--workers=4",
      "--rounds=3",
      "--steps=10",
    ],
    0.15,
  ),
  "determinism": (["bench/gpu_determinism.py", "--steps=40", "--workers=4"], 0.15),
  "ray": (
    [
      "bench/ray_replay.py",
      "--worker_gpus=0.25",
      "--workers=4",
      "--steps=20",
      "--every=5",
      "--kill_at=0",
      "--algorithm=async_easgd",
    ],
    0.2,
  ),
}
# What a part imports beyond what every part does (skipped, and said so, without it).
NEEDS = {"ray": "ray"}
TAIL = 40  # lines of a part's output in the report


def pins() -> dict[str, str]:
  """The project's pinned packages (requirements.txt): name -> version."""
  with open(os.path.join(REPO, "requirements.txt")) as file:
    found = (re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip()) for line in file)
    return {match.group(1): match.group(2) for match in found if match}


def versions(environment: dict[str, str]) -> dict[str, str | None]:
  """The installed version of each pinned package, as the parts' Python sees it."""
  names = list(pins())
  script = (
    "import sys\nfrom importlib import metadata\n"
    "for name in sys.argv[1:]:\n"
    "  try: print(name, metadata.version(name))\n"
    "  except metadata.PackageNotFoundError: print(name, '-')\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", script, *names],
    env=environment,
    capture_output=True,
    text=True,
    check=False,
  )
  if done.returncode:
    fail(
      f"could not read the installed versions: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    )
  found = dict(line.split(" ", 1) for line in done.stdout.splitlines())
  return {name: None if found.get(name, "-") == "-" else found[name] for name in names}


def first_device(environment: dict[str, str]) -> tuple[str, str]:
  """(platform, kind) of the first device JAX finds, or ("no", the error's last line).

  Asked in a process of its own: a JAX that started here would hold most of the
  GPU's memory while the parts run."""
  script = "import jax\nd = jax.devices()[0]\nprint(d.platform, d.device_kind, sep='\\t')\n"
  done = subprocess.run(
    [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=False
  )
  if done.returncode:
    return "no", (done.stderr.strip().splitlines() or ["?"])[-1]
  platform, _, kind = done.stdout.strip().partition("\t")
  return platform, kind


def wheel_files(wheels: str) -> list[str]:
  """The .whl files of the folder `wheels`; one line and exit 2 if it holds none."""
  files = sorted(os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl"))
  if not files:
    fail(f"--wheels={wheels!r} holds no .whl file: give the folder of the wheels to install")
  return files


def install(files: list[str], target: str) -> None:
  """The wheels `files` into `target`, none of their dependencies, no index."""
  command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
  command += ["--no-compile", "--upgrade", "--target", target, *files]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    fail(f"pip could not install --wheels: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def stop(part: subprocess.Popen) -> None:
  """Kills a part's process group: the part and every process it started."""
  try:
    os.killpg(part.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def run_part(name: str, seconds: float, environment: dict[str, str]) -> dict:
  """One part as a process of its own, stopped after `seconds`."""
  arguments, _ = COMMANDS[name]
  command = [sys.executable, *arguments]
  started = time.perf_counter()
  # A session of its own: a part stopped at its time takes the processes it started
  # (train.py runs, Ray's actors) with it, and the next part has the GPU to itself.
  part = subprocess.Popen(
    command,
    cwd=REPO,
    env=environment,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    start_new_session=True,
  )
  try:
    output, _ = part.communicate(timeout=seconds)
    status = part.returncode
  except subprocess.TimeoutExpired:
    stop(part)
    output, _ = part.communicate()
    status = f"stopped after {seconds:.0f} s"
  except BaseException:  # this script stopped (Ctrl-C, SIGTERM): the part with it
    stop(part)
    raise
  return {
    "command": " ".join(["python", *arguments]),
    "status": status,
    "seconds": time.perf_counter() - started,
    "output": output.decode(errors="replace"),
  }


def skipped_status(result: dict):
  """A skipped part's status (it fails nothing), else None."""
  status = result["status"]
  return status if isinstance(status, str) and status.startswith("skipped") else None


def report(path: str, kind: str, found: dict, results: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  pinned = pins()
  lines = [
    "# bench/gpu_check.py",
    "",
    f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {kind}, "
    f"Python {sys.version.split()[0]}",
    "",
    "| package | pinned | here |",
    "| --- | --- | --- |",
  ]
  for name, version in pinned.items():
    here = found[name] or "not installed"
    mark = "" if found[name] == version else " (differs)"
    lines.append(f"| {name} | {version} | {here}{mark} |")
  lines += ["", "| part | status | seconds |", "| --- | --- | --- |"]
  for name, result in results.items():
    lines.append(f"| {name} | {result['status']} | {result['seconds']:.0f} |")
  for name, result in results.items():
    tail = result["output"].rstrip().splitlines()[-TAIL:]
    lines += ["", f"## {name}", "", f"`{result['command']}`", "", "```", *tail, "```"]
  with open(path, "w") as file:
    file.write("\n".join(lines) + "\n")


def main():
  parser = ArgumentParser(prog="bench/gpu_check.py", description=__doc__.splitlines()[0])
  parser.add_argument("--report", type=output_file("--report"), default="runs/gpu_check.md")
  parser.add_argument("--minutes", type=number(1), default=9.0, help="the whole check's time")
  parser.add_argument("--wheels", type=existing_directory("--wheels"), default=None)
  parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
  args = parser.parse_args()
  parts = [part for part in args.parts.split(",") if part]
  unknown = [part for part in parts if part not in PARTS]
  if unknown or not parts:
    parser.error(f"--parts={args.parts!r} is invalid: valid: {', '.join(PARTS)}")

  files = wheel_files(args.wheels) if args.wheels else []

  # The first GPU, as the parts' figures say; the parts import easgd from this
  # checkout, installed or not (and the wheels, below, from a folder of this run's).
  environment = dict(os.environ, PYTHONUNBUFFERED="1")
  environment.setdefault("CUDA_VISIBLE_DEVICES", "0")
  environment["PYTHONPATH"] = os.pathsep.join(
    p for p in (REPO, environment.get("PYTHONPATH", "")) if p
  )
  platform, kind = first_device(environment)
  if platform == "no":
    fail(f"bench/gpu_check.py measures a GPU; JAX did not start here: {kind}")
  if platform != "gpu":
    fail(
      f"bench/gpu_check.py measures a GPU; JAX finds only {platform} devices here "
      '(install the CUDA build: pip install -e ".[cuda13]", README)'
    )
  # SIGTERM (a scheduler's limit) ends this script as Ctrl-C does: the running part too.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  with tempfile.TemporaryDirectory(prefix="gpu_check_site_") as site:
    if files:
      install(files, site)
      environment["PYTHONPATH"] = os.pathsep.join((site, environment["PYTHONPATH"]))
    results = run_parts(parts, args.minutes * 60, environment, args.report, kind)
  print(f"report: {args.report}")
  if any(result["status"] not in (0, skipped_status(result)) for result in results.values()):
    sys.exit(1)


def run_parts(parts, budget: float, environment, report_path: str, kind: str) -> dict:
  """Each part with its share of `budget` seconds; the report rewritten after each."""
  found = versions(environment)
  results = {}
  share = sum(COMMANDS[part][1] for part in parts)
  for part in parts:
    need = NEEDS.get(part)
    if need and not found.get(need):
      skipped = f"skipped: {need} is not installed"
      results[part] = {"command": "", "status": skipped, "seconds": 0.0, "output": ""}
    else:
      results[part] = run_part(part, budget * COMMANDS[part][1] / share, environment)
    print(f"{part}: {results[part]['status']} ({results[part]['seconds']:.0f} s)", flush=True)
    report(report_path, kind, found, results)
  return results


if __name__ == "__main__":
  main()
