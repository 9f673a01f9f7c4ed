"""What tracing costs: step time with ``tracer: otf2`` and ``tracer: scorep``
against ``tracer: none``, same configuration (2 processes), per framework, in
alternating rounds (the order rotates each round) so that drift in the
machine hits every tracer alike; the median over rounds of each run's median
step and of its fast step (10th percentile, what is left when other jobs
preempt some steps). Goals: otf2 <= 1 %, scorep <= 5 %.

Before the runs, it times in this process what our own tracer adds to a step
(the recorder with and without the OTF2 sink) and what handing the trace over
at the end of the run costs per step (parts written, archive assembled): the
figures a run's noise cannot hide.

    .venv/bin/python bench/tracing_overhead.py [--rounds 5] [--steps 200]
        [--framework torch-ddp --framework horovod-torch ...] [--tracers none,otf2,scorep]
Score-P is left out (and said so) where it is not installed (envs/build-scorep.sh).
Last line: key=value pairs (figures, baselines, ratios).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare import design, envs, runner, tracers  # noqa: E402
from frameworks import registry  # noqa: E402
from traces.otf2_writer import Otf2Sink  # noqa: E402
from traces.phases import PhaseRecorder  # noqa: E402

STATS = {"median": 0.5, "fast": 0.1}  # step-time quantiles of a run
LOOP = ("data_load", "forward", "backward", "grad_comm", "optimizer")


def step_times(tracer: str, framework: str, steps: int, warmup: int) -> dict[str, float]:
    """The run's median step and its fast step (10th percentile), seconds,
    of its slower rank. Another job's burst that preempts a step moves the
    mean of a run by several percent, the median less; the fast steps are
    those the other jobs left alone, and a tracer's cost is in every step."""
    fixed = {
        "epochs": 1,
        "max_steps": steps,
        "warmup_steps": warmup,
        "tracer": tracer,
        "timeout_s": 900,
    }
    if framework.startswith("horovod"):
        fixed["horovod_controller"] = "mpi"
    doc = {
        "name": "bench",
        "factors": {"framework": [framework], "procs_per_node": [2], "batch_size": [64]},
        "fixed": fixed,
    }
    row = design.parse(doc, "bench").runs()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runner.execute(row, Path(tmp))
        folder = Path(tmp, row.path)
        done = (folder / "done.json").read_text()
        if '"ok"' not in done:
            sys.exit(
                f"{framework} with tracer {tracer} failed: {done}\n"
                + (folder / "train.log").read_text()[-2000:]
            )
        ranks = []
        for path in folder.glob("steps.rank*.tsv"):
            table = pd.read_csv(path, sep="\t")
            table = table[table["step"] >= warmup]
            ranks.append((table["end_ns"] - table["start_ns"]) / 1e9)
        # the slower rank sets the pace
        return {stat: max(s.quantile(q) for s in ranks) for stat, q in STATS.items()}


def recorder_cost(steps: int = 20000, buckets: int = 2) -> dict:
    """Seconds per step our recorder spends with no sink and with the OTF2
    sink (5 phases, ``buckets`` collectives), and the hand-over per step."""

    def loop(recorder):
        start = time.perf_counter()
        for step in range(steps):
            recorder.begin_step(1, step)
            for name in LOOP:
                with recorder(name):
                    if name == "backward":
                        for _ in range(buckets):
                            now = time.perf_counter_ns()
                            recorder.collective("allreduce", 4096, now, now + 1000)
            recorder.end_step()
        return (time.perf_counter() - start) / steps

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["none"] = min(loop(PhaseRecorder()) for _ in range(3))
        traced = []
        for _ in range(3):
            recorder = PhaseRecorder()
            recorder.attach([Otf2Sink(Path(tmp), 0, 1, "bench")])
            traced.append(loop(recorder))
        out["otf2"] = min(traced)
        start = time.perf_counter()
        recorder.write(Path(tmp), 0)  # this rank's part, then the archive (world 1)
        out["handover"] = (time.perf_counter() - start) / steps
    return out


def scorep_ready(framework: str) -> bool:
    env = registry.FRAMEWORKS[framework].env
    return tracers.scorep_bin() is not None and envs.has_module(env, "scorep")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--framework", action="append", default=None)
    parser.add_argument("--tracers", default="none,otf2,scorep")
    args = parser.parse_args()
    micro = recorder_cost()
    print(
        f"recorder: {micro['none'] * 1e6:.1f} us/step without a sink, "
        f"{micro['otf2'] * 1e6:.1f} us/step with the OTF2 sink; hand-over at the end "
        f"{micro['handover'] * 1e6:.1f} us per step recorded",
        flush=True,
    )
    figures = {
        "recorder_us_none": micro["none"] * 1e6,
        "recorder_us_otf2": micro["otf2"] * 1e6,
        "handover_us_per_step": micro["handover"] * 1e6,
    }
    for framework in (args.framework or ["torch-ddp"]) if args.rounds else []:
        wanted = args.tracers.split(",")
        if "scorep" in wanted and not scorep_ready(framework):
            print(
                f"{framework}: scorep left out: Score-P or its bindings are not installed "
                "(envs/build-scorep.sh)"
            )
            wanted.remove("scorep")
        times: dict[str, dict[str, list[float]]] = {stat: {t: [] for t in wanted} for stat in STATS}
        for r in range(args.rounds):
            order = wanted[r % len(wanted) :] + wanted[: r % len(wanted)]
            for tracer in order:
                for stat, value in step_times(tracer, framework, args.steps, args.warmup).items():
                    times[stat][tracer].append(value)
            print(
                f"{framework} round {r + 1} (median / fast step): "
                + ", ".join(
                    f"{t} {times['median'][t][-1] * 1e3:.2f} / {times['fast'][t][-1] * 1e3:.2f} ms"
                    for t in order
                ),
                flush=True,
            )
        for stat, of_tracer in times.items():
            base = statistics.median(of_tracer["none"])
            for tracer, values in of_tracer.items():
                median = statistics.median(values)
                key = f"{framework.replace('-', '_')}_{tracer}_{stat}"
                figures[f"step_s_{key}"] = median
                figures[f"spread_{key}"] = (max(values) - min(values)) / median
                if tracer != "none":
                    figures[f"overhead_{key}"] = median / base - 1
    figures.update(goal_overhead_otf2=0.01, goal_overhead_scorep=0.05)
    print(
        " ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    )


if __name__ == "__main__":
    main()
