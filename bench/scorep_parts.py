"""Where ``tracer: scorep`` spends its time, part by part: each part timed in
a small process with and without Score-P, so that a run's noise does not
hide it (bench/tracing_overhead.py gives the whole).

- hook: what ``--noinstrumenter`` spares every run: a Python call under the
  bindings' default instrumenter (a profile hook on every call), against the
  same call without Score-P;
- regions: our phases as Score-P user regions (frameworks.tracing.ScorepRegions,
  what every adapter calls: 6 begin/end pairs a step) under
  ``python -m scorep --mpp=none --thread=pthread --noinstrumenter``, against
  the same loop calling an empty LiveRegions (baseline);
- mpi: Horovod all-reduces of the CNN's gradient (float32) between 2 ranks
  under ``--mpp=mpi`` (Score-P's MPI wrappers, and Horovod's background
  thread recorded as a location of its own), against the same without
  Score-P (baseline);
- flush: the time from a process's last event to its exit, with and without
  Score-P: Score-P writes its trace buffers when the process ends (and in
  between, as a "TRACE BUFFER FLUSH" region, when they fill up; counted).

    .venv/bin/python bench/scorep_parts.py [--pairs 200000] [--allreduces 300]
Last line: key=value pairs (each part and its baseline).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.run import tracers  # noqa: E402
from frameworks import models  # noqa: E402
from runfiles.phases import STEP, STEP_PHASES  # noqa: E402
from frameworks.recorder import LiveRegions  # noqa: E402
from measuring import figures_line, holding_the_machine, load  # noqa: E402

FLUSH_REGION = "TRACE BUFFER FLUSH"


class NoRegions(LiveRegions):
    def begin(self, name: str) -> None:
        pass

    def end(self, name: str) -> None:
        pass


def child_regions(pairs: int, scorep: bool) -> dict:
    """Begin/end pairs in the shape of a step: the step around its phases."""
    if scorep:
        from frameworks.tracing import ScorepRegions

        live = ScorepRegions()
    else:
        live = NoRegions()
    phases = STEP_PHASES[:5]
    steps = pairs // (len(phases) + 1)
    start = time.perf_counter()
    for _ in range(steps):
        live.begin(STEP)
        for name in phases:
            live.begin(name)
            live.end(name)
        live.end(STEP)
    elapsed = time.perf_counter() - start
    return {"pair_us": elapsed / (steps * (len(phases) + 1)) * 1e6, "last_event": time.time()}


def child_calls(calls: int) -> dict:
    """A plain Python call, many times: what a profile hook sees."""

    def small(x):
        return x + 1

    start = time.perf_counter()
    x = 0
    for _ in range(calls):
        x = small(x)
    return {"call_us": (time.perf_counter() - start) / calls * 1e6}


def child_allreduce(count: int, nbytes: int) -> dict:
    import horovod.torch as hvd
    import torch

    hvd.init()
    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    for _ in range(20):  # warm-up: Horovod's first cycles negotiate
        hvd.allreduce(tensor, op=hvd.Sum)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        hvd.allreduce(tensor, op=hvd.Sum)
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "rank": hvd.rank(),
        "median_us": times[len(times) // 2] * 1e6,
        "mean_us": sum(times) / len(times) * 1e6,
    }


def gradient_bytes() -> int:
    """The CNN's gradient on Fashion-MNIST (what a step all-reduces)."""
    return 4 * sum(row["params"] for row in models.layer_shapes(models.CNN, (1, 28, 28), 10))


def scorep_env(experiment: Path) -> dict:
    env = dict(os.environ)
    env.update(tracers.environment({"tracer": "scorep"}, experiment.parent))
    env["SCOREP_EXPERIMENT_DIRECTORY"] = str(experiment)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def under_scorep(mpp: str) -> list[str]:
    return [sys.executable, "-m", "scorep", f"--mpp={mpp}", "--thread=pthread", "--noinstrumenter"]


def run_child(argv: list[str], env: dict) -> tuple[list[dict], float]:
    """The child's JSON lines and the wall clock when it had exited."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    ended = time.time()
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    # each rank's object, wherever mpirun's tags and the other rank's output put it
    found = re.findall(r"\{[^{}]*\}", done.stdout)
    return [json.loads(text) for text in found], ended


def enters(anchor: Path, region: str) -> int:
    """How many times the trace enters ``region`` (otf2-print's count)."""
    done = subprocess.run(
        [str(tracers.scorep_bin() / "otf2-print"), str(anchor)],
        capture_output=True,
        text=True,
        check=True,
    )
    return len(re.findall(rf'^ENTER .*"{re.escape(region)}"', done.stdout, re.M))


def regions_part(pairs: int, tmp: Path) -> dict:
    me = [str(Path(__file__).resolve()), "child-regions", str(pairs)]
    env = scorep_env(tmp / "regions")
    [plain], plain_end = run_child([sys.executable, *me, "plain"], env)
    [traced], traced_end = run_child([*under_scorep("none"), *me, "scorep"], env)
    return {
        "region_pair_us_scorep": traced["pair_us"],
        "region_pair_us_baseline": plain["pair_us"],
        "exit_ms_scorep": (traced_end - traced["last_event"]) * 1e3,
        "exit_ms_baseline": (plain_end - plain["last_event"]) * 1e3,
        "events": 2 * pairs,
        "flushes_during_run": enters(tmp / "regions" / "traces.otf2", FLUSH_REGION),
    }


def hook_part(calls: int, tmp: Path) -> dict:
    """What --noinstrumenter saves: the bindings' default instrumenter hooks
    every Python call (the filter drops the events, not the hook)."""
    me = [str(Path(__file__).resolve()), "child-calls", str(calls)]
    env = scorep_env(tmp / "hook")
    [plain], _ = run_child([sys.executable, *me], env)
    hooked = [sys.executable, "-m", "scorep", "--mpp=none", "--thread=pthread", *me]
    [traced], _ = run_child(hooked, env)
    return {"python_call_us_hooked": traced["call_us"], "python_call_us_baseline": plain["call_us"]}


def mpi_part(count: int, tmp: Path) -> dict:
    nbytes = gradient_bytes()
    horovodrun = [str(Path(sys.executable).parent / "horovodrun"), "--mpi", "-np", "2"]
    horovodrun += ["-H", "localhost:2"]
    me = [str(Path(__file__).resolve()), "child-allreduce", str(count), str(nbytes)]
    env = scorep_env(tmp / "mpi")
    plain, _ = run_child([*horovodrun, sys.executable, *me], env)
    traced, _ = run_child([*horovodrun, *under_scorep("mpi"), *me], env)
    slowest = {
        name: max(r["median_us"] for r in rows) for name, rows in (("p", plain), ("t", traced))
    }
    return {
        # the wrappers were there: Score-P saw Horovod's all-reduces
        "mpi_allreduces_traced": enters(tmp / "mpi" / "traces.otf2", "MPI_Allreduce"),
        "allreduce_bytes": nbytes,
        "allreduce_us_scorep": slowest["t"],
        "allreduce_us_baseline": slowest["p"],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child-regions":
        print(json.dumps(child_regions(int(sys.argv[2]), sys.argv[3] == "scorep")))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "child-calls":
        print(json.dumps(child_calls(int(sys.argv[2]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "child-allreduce":
        print(json.dumps(child_allreduce(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200000)
    parser.add_argument("--allreduces", type=int, default=300)
    args = parser.parse_args()
    if tracers.scorep_bin() is None:
        sys.exit("Score-P is not installed: build it with envs/build-scorep.sh")
    with tempfile.TemporaryDirectory() as tmp:
        figures = regions_part(args.pairs, Path(tmp))
        print(
            f"regions: {figures['region_pair_us_scorep']:.2f} us per begin/end pair under "
            f"Score-P, {figures['region_pair_us_baseline']:.2f} us without; exit "
            f"{figures['exit_ms_scorep']:.0f} ms with Score-P ({figures['events']} events, "
            f"{figures['flushes_during_run']} flushes during the run), "
            f"{figures['exit_ms_baseline']:.0f} ms without; {load()}",
            flush=True,
        )
        figures.update(hook_part(args.pairs, Path(tmp)))
        print(
            f"profile hook (not used: --noinstrumenter): a Python call "
            f"{figures['python_call_us_hooked']:.2f} us under the bindings' default "
            f"instrumenter, {figures['python_call_us_baseline']:.2f} us without",
            flush=True,
        )
        if args.allreduces:
            figures.update(mpi_part(args.allreduces, Path(tmp)))
            print(
                f"mpi: all-reduce of {figures['allreduce_bytes']} bytes "
                f"{figures['allreduce_us_scorep']:.0f} us under Score-P, "
                f"{figures['allreduce_us_baseline']:.0f} us without (median, slower rank); "
                f"{figures['mpi_allreduces_traced']} MPI_Allreduce calls in Score-P's trace; {load()}",
                flush=True,
            )
    print(figures_line(figures))


if __name__ == "__main__":
    with holding_the_machine("Score-P's parts"):
        main()
