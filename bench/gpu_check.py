"""Every GPU measurement of the project in one command, for one GPU and a few minutes.

    python bench/gpu_check.py [--report gpu_check.md] [--minutes 9] [--wheels DIR]

Runs, each as a process of its own with its share of the time, on the first GPU:
  tier         the GPU tier of the tests (pytest -m gpu, tests/test_gpu.py);
  resnet50     bench/gpu.py's ResNet-50 row: bfloat16, batch 256;
  small        bench/gpu.py's ResNet-20 and LeNet-5 rows (float32, batch 512 and
               1,024) with sync_easgd of 4 workers on the one GPU beside the plain step;
  determinism  bench/gpu_determinism.py: two train.py runs with and two without
               XLA:GPU's deterministic ops, leaf by leaf;
  ray          bench/ray_replay.py on 4 worker processes sharing the GPU and the
               replay of their trace, leaf by leaf (needs ray: skipped without it);
and writes one report (Markdown): the device, the versions of the packages the
project pins beside its pins, and for each part its command, exit status,
seconds and the end of its output. It prints one line a part as it goes.

--wheels DIR: wheels to install first (pip install --no-index --no-deps into a
folder of the report's, put on the parts' PYTHONPATH), for a GPU machine
without the package index that has jax and its CUDA plugin but not the
project's other pins. The report names every pinned package the parts could
not import, or imported at another version. On a machine with JAX 0.11.2, its
CUDA plugin, flax, optax, orbax-checkpoint, numpy, absl-py, matplotlib,
scikit-learn and tensorboard, these wheels make the pins whole (sizes for
Python 3.12, x86_64): ml-collections 75 KB, tensorboardX 86 KB, mlxtend 1.3 MB,
tensorflow-datasets 5.2 MB with its array-record 3.8 MB, grain 0.6 MB,
importlib_resources 37 KB and, at the pinned versions, flax 0.5 MB, optax 0.4 MB,
orbax-checkpoint 1.4 MB, numpy 15 MB; ray's is 77 MB (the ray part only).

Without a GPU, or with a bad argument, it refuses in one line (exit 2) and
writes nothing. The parts' own figures and their meaning: bench/README.md,
"On one GPU"; docs/runtimes.md, "On GPU workers".
"""

import datetime
import os
import re
import subprocess
import sys
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
    check=True,
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


def install(wheels: str, target: str) -> None:
  """The wheels of `wheels` into `target`, none of their dependencies, no index."""
  files = sorted(os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl"))
  if not files:
    fail(f"--wheels={wheels!r} holds no .whl file")
  command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
  command += ["--no-compile", "--upgrade", "--target", target, *files]
  subprocess.run(command, check=True)


def run_part(name: str, seconds: float, environment: dict[str, str]) -> dict:
  """One part as a process of its own, stopped after `seconds`."""
  arguments, _ = COMMANDS[name]
  command = [sys.executable, *arguments]
  started = time.perf_counter()
  try:
    done = subprocess.run(
      command,
      cwd=REPO,
      env=environment,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      timeout=seconds,
      check=False,
    )
    status, output = done.returncode, done.stdout
  except subprocess.TimeoutExpired as stopped:
    status = f"stopped after {seconds:.0f} s"
    output = stopped.stdout if isinstance(stopped.stdout, str) else (stopped.stdout or b"").decode()
  return {
    "command": " ".join(["python", *arguments]),
    "status": status,
    "seconds": time.perf_counter() - started,
    "output": output,
  }


def skipped_status(result: dict):
  """A skipped part's status (it fails nothing), else None."""
  status = result["status"]
  return status if isinstance(status, str) and status.startswith("skipped") else None


def report(path: str, kind: str, found: dict, results: dict) -> None:
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
  parser.add_argument("--report", type=output_file("--report"), default="gpu_check.md")
  parser.add_argument("--minutes", type=number(1), default=9.0, help="the whole check's time")
  parser.add_argument("--wheels", type=existing_directory("--wheels"), default=None)
  parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
  args = parser.parse_args()
  parts = [part for part in args.parts.split(",") if part]
  unknown = [part for part in parts if part not in PARTS]
  if unknown or not parts:
    parser.error(f"--parts={args.parts!r} is invalid: valid: {', '.join(PARTS)}")

  environment = dict(os.environ, PYTHONUNBUFFERED="1")
  # The parts import easgd from this checkout, installed or not.
  path = [REPO, environment.get("PYTHONPATH", "")]
  if args.wheels:
    target = os.path.join(os.path.dirname(os.path.abspath(args.report)), "gpu_check_site")
    path.insert(0, target)
  environment["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
  platform, kind = first_device(environment)
  if platform == "no":
    fail(f"bench/gpu_check.py measures a GPU; JAX did not start here: {kind}")
  if platform != "gpu":
    fail(
      f"bench/gpu_check.py measures a GPU; JAX finds only {platform} devices here "
      '(install the CUDA build: pip install -e ".[cuda13]", README)'
    )
  if args.wheels:
    install(args.wheels, target)
  found = versions(environment)
  results = {}
  budget = args.minutes * 60
  share = sum(COMMANDS[part][1] for part in parts)
  for part in parts:
    need = NEEDS.get(part)
    if need and not found.get(need):
      skipped = f"skipped: {need} is not installed"
      results[part] = {"command": "", "status": skipped, "seconds": 0.0, "output": ""}
    else:
      results[part] = run_part(part, budget * COMMANDS[part][1] / share, environment)
    print(f"{part}: {results[part]['status']} ({results[part]['seconds']:.0f} s)", flush=True)
    report(args.report, kind, found, results)
  print(f"report: {args.report}")
  if any(result["status"] not in (0, skipped_status(result)) for result in results.values()):
    sys.exit(1)


if __name__ == "__main__":
  main()
