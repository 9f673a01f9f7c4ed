"""How a run is traced by Score-P, decided once from its config: at plan time
(refused combinations, with their fix: ddlcompare/plan/traceable.py, and is
Score-P there), at launch (the worker's command and environment) and after
the run (did it leave the trace it was asked for?).

Two ways to put a rank under Score-P:

- ``mpi``: the launcher starts the ranks with MPI (Horovod with
  ``horovod_controller: mpi``). ``--mpp=mpi``: Score-P learns the ranks from
  MPI_Init and writes one experiment, ``<run>/scorep/``.
- ``per-rank``: the launcher starts the ranks without MPI (torchrun,
  tf-workers, Horovod with Gloo). Each rank runs under ``--mpp=none`` with its
  own experiment, ``<run>/scorep/rank<r>/``; the converter joins them into one
  multi-rank table (traces/convert.py). ``python -m ddlcompare.run.tracers RUN_DIR``
  is the per-rank starter: it reads the rank its launcher gave it, names the
  experiment folder, and becomes the worker under Score-P.

Every thread is a location of its own (``--thread=pthread``): Horovod calls
MPI from a background thread, and under ``--thread=none`` two threads writing
into one location corrupt the trace or abort the run ("Wrong timestamp order
... Please pin your threads").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from runfiles import names, variables
from runfiles import files
from runfiles.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
SCOREP_FILTER = REPO / "frameworks" / "scorep_filter"
WORKER_SCRIPT = REPO / "frameworks" / "worker.py"
SCOREP_VERSION = "8.4"  # what envs/build-scorep.sh builds
BUILD_HINT = "envs/build-scorep.sh (docs: envs/scorep.md)"
# Score-P's memory pool per process. Every thread (a location of its own)
# takes a 1 MiB trace chunk from it, and TensorFlow's thread pools and gRPC
# start dozens: a tf-mwms rank of 2 epochs aborted with Score-P's default
# (16000k, "No free memory page available"). The pool is one calloc, so the
# pages no thread writes cost no memory. A value in the environment wins.
TOTAL_MEMORY = "256M"


def mode(config: RunConfig) -> str:
    """``mpi`` or ``per-rank`` for a Score-P run (see the module's doc)."""
    from frameworks import registry

    launcher = registry.FRAMEWORKS[config["framework"]].launcher
    if launcher == "horovodrun" and config.get("horovod_controller") == "mpi":
        return "mpi"
    return "per-rank"


def scorep_bin() -> Path | None:
    """The folder holding ``scorep``: on PATH, else where envs/build-scorep.sh installs it."""
    found = shutil.which("scorep")
    if found:
        return Path(found).parent
    cache = variables.cache_root()
    built = cache / f"scorep-{SCOREP_VERSION}" / "bin"
    return built if (built / "scorep").exists() else None


def installed_version() -> str | None:
    """The Score-P version envs/build-scorep.sh recorded, else the one
    ``scorep --version`` says (a cluster's module); None without Score-P."""
    folder = scorep_bin()
    if folder is None:
        return None
    record = folder.parent / "ddlc-scorep.json"
    if record.exists():
        return files.read_json(record).get("scorep")
    try:
        said = subprocess.run(
            [str(folder / "scorep"), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return said[-1] if said else None


def problems(python_of, configs: list[dict]) -> list[str]:
    """Plan-time checks for the Score-P runs among ``configs``: is Score-P
    there, and are the bindings in each framework's environment?"""
    wanted = [c for c in configs if c.get("tracer") == "scorep"]
    if not wanted:
        return []
    if scorep_bin() is None:
        return [
            f"tracer: scorep: Score-P is not installed (no scorep on PATH); build it with "
            f"{BUILD_HINT}, or module load scorep on a cluster"
        ]
    found = []
    from ddlcompare.plan import envs
    from frameworks import registry

    for env in sorted({registry.FRAMEWORKS[c["framework"]].env for c in wanted}):
        if python_of(env).exists() and not envs.has_module(env, "scorep"):
            found.append(
                f"tracer: scorep: the Score-P Python bindings are not in the '{env}' "
                f"environment; run {BUILD_HINT.split()[0]} (it ends with pip install "
                "scorep in each environment)"
            )
    return found


def worker_argv(python: str, config: RunConfig, run_dir: Path) -> list[str]:
    """The worker's command for a Score-P run."""
    if mode(config) == "mpi":
        return scorep_argv(python, "mpi", run_dir)
    return [python, "-m", "ddlcompare.run.tracers", str(run_dir)]


def scorep_argv(python: str, mpp: str, run_dir: Path) -> list[str]:
    """The worker under Score-P's Python bindings. They run a script (not a
    module), so the worker goes by path and PYTHONPATH finds the packages.
    --noinstrumenter: no Python function is traced, only our phases (user
    regions) and what Score-P's MPI adapter sees."""
    return [
        python,
        "-m",
        "scorep",
        f"--mpp={mpp}",
        "--thread=pthread",
        "--noinstrumenter",
        str(WORKER_SCRIPT),
        str(run_dir),
    ]


def environment(config: RunConfig, run_dir: Path) -> dict[str, str]:
    """Score-P's settings for the run (empty for other tracers)."""
    if config.get("tracer") != "scorep":
        return {}
    env = {
        "SCOREP_ENABLE_TRACING": "true",
        "SCOREP_ENABLE_PROFILING": "false",
        "SCOREP_EXPERIMENT_DIRECTORY": str(run_dir / names.SCOREP_DIR),
        "SCOREP_OVERWRITE_EXPERIMENT_DIRECTORY": "true",
        "SCOREP_FILTERING_FILE": str(SCOREP_FILTER),
        "SCOREP_TOTAL_MEMORY": os.environ.get("SCOREP_TOTAL_MEMORY", TOTAL_MEMORY),
        "PYTHONPATH": str(REPO),
    }
    folder = scorep_bin()
    if folder is not None:  # the bindings call scorep-config when they start
        env["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return env


def expected_traces(config: RunConfig, run_dir: Path) -> list[Path]:
    """The trace anchors a run with this tracer must leave."""
    tracer = config.get("tracer", "none")
    if tracer == "otf2":  # LBANN's driver writes it from LBANN's timeline
        return [run_dir / names.OTF2_DIR / "traces.otf2"]
    if tracer != "scorep":
        return []
    if mode(config) == "mpi":
        return [run_dir / names.SCOREP_DIR / "traces.otf2"]
    world = config["nodes"] * config["procs_per_node"]
    return [run_dir / names.SCOREP_DIR / f"rank{r}" / "traces.otf2" for r in range(world)]


def missing_trace(config: RunConfig, run_dir: Path) -> str | None:
    """The reason a finished run counts as failed for want of its trace."""
    missing = [p for p in expected_traces(config, run_dir) if not p.exists()]
    if not missing:
        return None
    shown = missing[0].relative_to(run_dir)
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"tracer: {config['tracer']} was asked for, but the run left no {shown}{more}"


def rank_from_env(env: Mapping[str, str]) -> int:
    """This process's rank, as the launchers that do not start MPI give it."""
    for name in ("RANK", "HOROVOD_RANK"):  # torchrun; Horovod with Gloo
        if env.get(name, "").isdigit():
            return int(env[name])
    if "TF_CONFIG" in env:  # tf-workers (ddlcompare.run.spawn)
        return int(json.loads(env["TF_CONFIG"])["task"]["index"])
    raise SystemExit(
        "ddlcompare.run.tracers: no rank in the environment (RANK, HOROVOD_RANK or "
        "TF_CONFIG); start it through a launcher that sets one"
    )


def main(argv: list[str]) -> None:
    """Per-rank start: this rank's experiment folder, then the worker under Score-P."""
    if len(argv) != 1:
        raise SystemExit("usage: python -m ddlcompare.run.tracers RUN_DIR")
    run_dir = Path(argv[0])
    rank = rank_from_env(os.environ)
    experiment = run_dir / names.SCOREP_DIR / f"rank{rank}"
    experiment.parent.mkdir(parents=True, exist_ok=True)
    os.environ["SCOREP_EXPERIMENT_DIRECTORY"] = str(experiment)
    command = scorep_argv(sys.executable, "none", run_dir)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
