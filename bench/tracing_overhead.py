"""What tracing costs a whole run: step time with ``tracer: otf2`` and
``tracer: scorep`` against ``tracer: none``, same configuration (2
processes, the CNN, batch 64), per framework. Goals: otf2 < 1 %, scorep <= 5 %.

Many short rounds; in each, every tracer runs once, in an order shuffled
per round (seeded), so that drift in the machine hits every tracer alike.
Each round gives a paired ratio per tracer, its run's step over the ``none``
run's of the same round (median step and fast step, the 10th percentile:
what is left when other jobs preempt some steps; the slower rank's). The
figure is the median of those ratios with its 95 % interval from the sign
test (distribution-free: the order statistics of the ratios; at least 6
rounds). Where the interval holds both sides of the goal, the bench says
"cannot be shown at this noise" and claims neither. ``--control`` adds a
second ``none`` run per round (``none2``): its interval is the noise floor.

Where the time goes inside a run, part by part: bench/otf2_parts.py (ours)
and bench/scorep_parts.py (Score-P).

    .venv/bin/python bench/tracing_overhead.py [--rounds 12] [--steps 60] [--seed 1]
        [--framework torch-ddp --framework horovod-torch ...] [--tracers none,otf2,scorep]
        [--control] [--budget-s 540]
Score-P is left out (and said so) where it is not installed (envs/build-scorep.sh).
Last line: key=value pairs (figures, baselines, intervals, verdicts).
"""

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.plan import design, envs  # noqa: E402
from ddlcompare.run import runner, tracers  # noqa: E402
from frameworks import registry  # noqa: E402
from measuring import figures_line, holding_the_machine, load  # noqa: E402

STATS = {"median": 0.5, "fast": 0.1}  # step-time quantiles of a run
GOALS = {"otf2": 0.01, "scorep": 0.05, "none2": 0.01}
CONTROL = "none2"  # a second tracer-none run per round: the noise floor
CONFIDENCE = 0.95


def traced_run(tracer: str, framework: str, steps: int, warmup: int, root: Path):
    """One run under ``root``: its folder and its median and fast step
    (seconds, the slower rank's, warm-up left out). Another job's burst that
    preempts a step moves the mean of a run by several percent, the median
    less; the fast steps are those the other jobs left alone, and a tracer's
    cost is in every step."""
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
    runner.execute(row, root)
    folder = Path(root, row.path)
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
    return folder, {stat: max(s.quantile(q) for s in ranks) for stat, q in STATS.items()}


def step_times(tracer: str, framework: str, steps: int, warmup: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        real = "none" if tracer == CONTROL else tracer
        return traced_run(real, framework, steps, warmup, Path(tmp))[1]


def sign_interval(values: list[float], confidence: float = CONFIDENCE):
    """The median's distribution-free interval: (x_(k), x_(n+1-k)) for the
    largest k whose coverage 1 - 2 P(Bin(n, 1/2) < k) is still >= confidence.
    None when n is too small for any (n < 6 at 95 %)."""
    ordered, n = sorted(values), len(values)
    below, k = 0.0, 0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(Bin(n, 1/2) <= k)
        if 1 - 2 * below < confidence:
            break
        k += 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


def verdict(interval, goal: float) -> str:
    if interval is None:
        return "too few rounds for an interval"
    low, high = interval
    if high < goal:
        return "below the goal"
    if low > goal:
        return "above the goal"
    return "cannot be shown at this noise"


def scorep_ready(framework: str) -> bool:
    env = registry.FRAMEWORKS[framework].env
    return tracers.scorep_bin() is not None and envs.has_module(env, "scorep")


def measure(framework: str, wanted: list[str], args, rng: random.Random) -> dict:
    times = {t: {stat: [] for stat in STATS} for t in wanted}
    started, rounds = time.monotonic(), 0
    for r in range(args.rounds):
        spent = time.monotonic() - started
        if args.budget_s and r and spent / r * (r + 1) > args.budget_s:
            print(f"{framework}: stopped after {r} rounds ({spent:.0f} s of --budget-s)")
            break
        rounds += 1
        order = wanted[:]
        rng.shuffle(order)
        for tracer in order:
            for stat, value in step_times(tracer, framework, args.steps, args.warmup).items():
                times[tracer][stat].append(value)
        print(
            f"{framework} round {r + 1} (median / fast step): "
            + ", ".join(
                f"{t} {times[t]['median'][-1] * 1e3:.2f} / {times[t]['fast'][-1] * 1e3:.2f} ms"
                for t in order
            )
            + f"; {load()}",
            flush=True,
        )
    key = framework.replace("-", "_")
    figures = {f"rounds_{key}": rounds}
    for stat in STATS:
        base = times["none"][stat]
        figures[f"step_s_{key}_none_{stat}"] = statistics.median(base)
        for tracer in wanted:
            if tracer == "none":
                continue
            ratios = [t / b - 1 for t, b in zip(times[tracer][stat], base)]
            middle, interval = statistics.median(ratios), sign_interval(ratios)
            said = verdict(interval, GOALS[tracer])
            name = f"{key}_{tracer}_{stat}"
            figures[f"step_s_{name}"] = statistics.median(times[tracer][stat])
            figures[f"overhead_{name}"] = middle
            if interval is not None:
                figures[f"overhead_{name}_low"], figures[f"overhead_{name}_high"] = interval
            figures[f"verdict_{name}"] = said.replace(" ", "_")
            shown = "" if interval is None else f" [{interval[0]:+.2%}, {interval[1]:+.2%}]"
            print(
                f"{framework} {tracer} over none ({stat} step, {rounds} paired rounds): "
                f"{middle:+.2%}{shown} against a goal of {GOALS[tracer]:.0%}: {said}; {load()}",
                flush=True,
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--framework", action="append", default=None)
    parser.add_argument("--tracers", default="none,otf2,scorep")
    parser.add_argument("--control", action="store_true", help="a second none run per round")
    parser.add_argument(
        "--budget-s", type=float, default=0, help="start no round that would end past this"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1 (6 or more for an interval)")
    rng = random.Random(args.seed)
    figures: dict = {"steps": args.steps, "seed": args.seed}
    for framework in args.framework or ["torch-ddp"]:
        wanted = args.tracers.split(",")
        if "none" not in wanted:
            sys.exit("--tracers must hold none: it is every ratio's baseline")
        if "scorep" in wanted and not scorep_ready(framework):
            print(
                f"{framework}: scorep left out: Score-P or its bindings are not installed "
                "(envs/build-scorep.sh)"
            )
            wanted.remove("scorep")
        figures.update(measure(framework, wanted + [CONTROL] * args.control, args, rng))
    figures.update({f"goal_overhead_{t}": g for t, g in GOALS.items() if t != CONTROL})
    print(figures_line(figures))


if __name__ == "__main__":
    with holding_the_machine("tracing overhead"):
        main()
