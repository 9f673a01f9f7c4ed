"""Hangs at a collective's set-up, plain GaspiCxx against ours
(envs/patches/tarantella), counted over many set-ups per build.

Both hangs seen in Tarantella runs stopped with each rank's main thread in
CollectiveLowLevel::waitForSetup, waiting for its peer's buffer description
(GaspiCxx's passive messages), the patched progress thread asleep beside it
(docs/improvements.md, "Hangs"). Here GaspiCxx's own C++ collectives do that
alone, without TensorFlow (bench/gaspi_collectives.cpp, ``setups``): on 2
ranks, a fresh ring all-reduce set up, run once through the progress
thread, checked and torn down, again and again, with one all-reduce kept
registered throughout as Tarantella's gradient all-reducers are. A set-up or
collective that does not complete within ``--silence-s`` is a hang: the
launch is stopped there and counted, and the next launch goes on.

Launches of ``--per-launch`` set-ups alternate between the builds in an
order shuffled per round (seeded) until each build has ``--setups``. Per
build: set-ups, hangs, failures; the difference of the hang rates per
set-up (patched minus plain) with its 95 % interval (Newcombe's hybrid
score, statsmodels); its upper end is the bound the goal asks for (at most
0.5 %; with no hang in 1,000 set-ups a build it is 0.38 %). The patched
build runs at its default pause unless ``--pause``. ``--budget-s`` starts
no round past that time (the counts and bound are then of fewer set-ups).

    python bench/gaspi_setup_hangs.py [--setups 1000] [--per-launch 250]
        [--silence-s 30] [--pause US] [--seed 1] [--budget-s S]
Needs both Tarantella builds (bash envs/build-tarantella.sh [patched]) and g++.
Last line: key=value pairs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gaspi_ranks import BUILDS, Unavailable, launch  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402

GOAL = 0.005  # the bound on the difference per set-up


@dataclass
class Tally:
    setups: int = 0  # attempted: completed, plus one per hang or failure
    hangs: int = 0
    failures: int = 0
    seconds: list[float] = field(default_factory=list)  # launch time per set-up
    where: list[str] = field(default_factory=list)  # what each hang or failure said


def one_launch(build: str, count: int, args, tally: Tally) -> None:
    pause = args.pause if build == "patched" else None
    done = launch(build, ["setups", str(count)], args.silence_s, pause)
    completed = sum(1 for line in done.lines if line.startswith("setup "))
    tally.setups += completed
    if completed:
        tally.seconds.append(done.seconds / completed)
    if done.hung:
        tally.hangs += 1
        tally.setups += 1
        tally.where.append(f"hang at set-up {completed + 1} of a launch")
    elif done.returncode != 0 or completed < count:
        tally.failures += 1
        tally.setups += 1
        tally.where.append(
            f"exit {done.returncode} after {completed}: {done.stderr.strip()[-200:]}"
        )


def measure(args) -> dict[str, Tally]:
    rng, tallies, round_ = random.Random(args.seed), {b: Tally() for b in BUILDS}, 0
    started = time.monotonic()
    while any(t.setups < args.setups for t in tallies.values()):
        if args.budget_s and time.monotonic() - started > args.budget_s:
            print(f"stopped: past --budget-s {args.budget_s:.0f} s, before {args.setups} a build")
            break
        round_ += 1
        order = [b for b in BUILDS if tallies[b].setups < args.setups]
        rng.shuffle(order)
        for build in order:
            count = min(args.per_launch, args.setups - tallies[build].setups)
            one_launch(build, count, args, tallies[build])
        done = ", ".join(f"{b} {t.setups} ({t.hangs} hung)" for b, t in tallies.items())
        print(f"round {round_}: {done}; {load()}", flush=True)
    return tallies


def rate_words(tally: Tally) -> str:
    low, high = proportion_confint(tally.hangs, tally.setups, method="wilson")
    per = statistics.median(tally.seconds) if tally.seconds else float("nan")
    return (
        f"{tally.hangs} hangs, {tally.failures} failures in {tally.setups} set-ups: "
        f"{tally.hangs / tally.setups:.3%} [{low:.3%}, {high:.3%}]; "
        f"{per * 1000:.0f} ms a set-up (launch time, median over launches)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", type=int, default=1000, help="set-ups per build")
    parser.add_argument("--per-launch", type=int, default=250)
    parser.add_argument("--silence-s", type=float, default=30.0)
    parser.add_argument("--pause", type=int, default=None, help="the patched build's pause, us")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="start no round after this many seconds"
    )
    args = parser.parse_args()
    try:
        with holding_the_machine("GaspiCxx set-up hangs"):
            print(
                f"{args.setups} set-ups a build, 2 ranks, silence {args.silence_s:.0f} s; {load()}"
            )
            tallies = measure(args)
    except Unavailable as exc:
        print(f"gaspi_setup_hangs: {exc}", file=sys.stderr)
        return 2
    for build, tally in tallies.items():
        print(f"{build}: {rate_words(tally)}")
        for where in tally.where:
            print(f"  {where}")
    plain, patched = tallies["plain"], tallies["patched"]
    low, high = confint_proportions_2indep(
        patched.hangs, patched.setups, plain.hangs, plain.setups, method="newcomb"
    )
    verdict = "at most the goal" if high <= GOAL else "above the goal: more set-ups needed"
    print(
        f"difference per set-up (patched - plain): "
        f"{patched.hangs / patched.setups - plain.hangs / plain.setups:+.3%} "
        f"[{low:+.3%}, {high:+.3%}]; upper end {verdict} ({GOAL:.1%}); {load()}"
    )
    fields = [
        f"{b}_setups={t.setups} {b}_hangs={t.hangs} {b}_failures={t.failures}"
        for b, t in tallies.items()
    ]
    print(
        " ".join(
            [*fields, f"diff_low={low:.5f} diff_high={high:.5f}", f"goal={GOAL}", load_fields()]
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
