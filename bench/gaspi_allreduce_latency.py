"""The latency of one all-reduce driven by GaspiCxx's progress thread, 4 B
to 4 MB, plain GaspiCxx against ours (envs/patches/tarantella: the
progress thread pauses between sweeps while a collective runs), on 2 ranks
of this machine over GPI-2's TCP device, through GaspiCxx's own C++
collective (bench/gaspi_collectives.cpp: a ring all-reduce of floats
registered with the runtime's progress engine, as GaspiCxx's Allreduce and
so Tarantella's all-reducers do).

Arms: the plain build, and the patched build at each pause
(DDLC_GASPI_SWEEP_PAUSE_US, read at run time; 50 us is its default, 0
upstream's spinning in the patched build). Rounds: in each, every arm runs
once, one launch of 2 ranks, in an order shuffled per round (seeded), so
drift hits every arm alike. A launch times every size ``--reps`` times
after ``--warmup``, both ranks starting together (a barrier), rank 0's
start to completion, in two ways: ``progress`` (the main thread only
watches: the progress thread alone drives the ring, as for an all-reduce
Tarantella starts during backward) and ``wait`` (the main thread calls
waitForCompletion at once and drives it too, Tarantella's
finish_allreduce). Per launch and size, the median of its repetitions.

Per arm, size and way: the median over rounds with its 95 % interval from
the sign test (bench/tracing_overhead.py's; at least 6 rounds), and each
patched arm's ratio to the plain build of the same round (its median and
interval). A figure taken beside other work (the load beside it says) is
not a clean one.

    python bench/gaspi_allreduce_latency.py [--rounds 6] [--reps 40] [--warmup 5]
        [--sizes 4,16,...,4194304] [--pauses 0,10,50,200] [--seed 1]
Needs both Tarantella builds (bash envs/build-tarantella.sh [patched]) and g++.
Last line: key=value pairs (lat_<way>_<bytes>_<arm>=median us,
ratio_<way>_<bytes>_<arm>=median ratio to plain).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gaspi_ranks import Unavailable, launch  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402
from tracing_overhead import sign_interval  # noqa: E402

SIZES = [4**k for k in range(1, 12)]  # 4 B ... 4 MiB
PAUSES = [0, 10, 50, 200]
WAYS = ("progress", "wait")
# A launch that prints nothing this long has hung (a 4 MB all-reduce takes
# milliseconds; a set-up, under a second even on a loaded machine).
SILENCE_S = 120


def arms(pauses: list[int]) -> list[tuple[str, str, int | None]]:
    """(name, build, pause) of each arm: the plain build, then the patched one per pause."""
    return [("plain", "plain", None)] + [(f"p{p}", "patched", p) for p in pauses]


def one_launch(build: str, pause: int | None, args) -> dict[tuple[str, int], float]:
    """(way, bytes) -> the launch's median latency in us; ("launch", 0) -> its seconds."""
    sizes = ",".join(str(size) for size in args.sizes)
    done = launch(build, ["latency", sizes, str(args.reps), str(args.warmup)], SILENCE_S, pause)
    if done.hung or done.returncode != 0:
        reason = "hung" if done.hung else f"exit {done.returncode}"
        raise Unavailable(f"{build} (pause {pause}) {reason}: {done.stderr.strip()[-300:]}")
    medians = {("launch", 0): done.seconds}
    for line in done.lines:
        fields = line.split()
        if len(fields) == 5 and fields[0] == "latency":
            medians[(fields[1], int(fields[2]))] = float(fields[3])
    return medians


def interval_words(values: list[float], unit: str, digits: int) -> str:
    interval = sign_interval(values)
    middle = f"{statistics.median(values):.{digits}f}{unit}"
    if interval is None:
        return f"{middle} (no interval from {len(values)} rounds; 6 give one)"
    return f"{middle} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def measure(args) -> dict:
    """arm -> (way, bytes) -> one median per round."""
    rng = random.Random(args.seed)
    figures: dict = defaultdict(lambda: defaultdict(list))
    for round_ in range(args.rounds):
        order = arms(args.pauses)
        rng.shuffle(order)
        for name, build, pause in order:
            for key, value in one_launch(build, pause, args).items():
                figures[name][key].append(value)
        seconds = sum(figures[name][("launch", 0)][-1] for name, _, _ in order)
        names = " ".join(name for name, _, _ in order)
        print(f"round {round_ + 1}/{args.rounds} ({names}): {seconds:.0f} s; {load()}")
    return figures


def report(figures: dict, args) -> list[str]:
    """The table, one line per way and size; the key=value fields."""
    fields = []
    for way in WAYS:
        print(f"\n{way}: median latency over rounds, us [95 %]; patched arms' ratio to plain")
        for size in args.sizes:
            plain = figures["plain"][(way, size)]
            words = [f"plain {interval_words(plain, '', 1)}"]
            fields.append(f"lat_{way}_{size}_plain={statistics.median(plain):.1f}")
            for name, _, _ in arms(args.pauses)[1:]:
                mine = figures[name][(way, size)]
                ratios = [m / p for m, p in zip(mine, plain)]
                words.append(
                    f"{name} {statistics.median(mine):.1f} x{interval_words(ratios, '', 2)}"
                )
                fields.append(f"lat_{way}_{size}_{name}={statistics.median(mine):.1f}")
                fields.append(f"ratio_{way}_{size}_{name}={statistics.median(ratios):.3f}")
            print(f"  {size:>8} B: " + "; ".join(words))
    print(f"({load()})")
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--reps", type=int, default=40, help="all-reduces timed per size and launch"
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES)
    parser.add_argument("--pauses", type=lambda s: [int(x) for x in s.split(",")], default=PAUSES)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        with holding_the_machine("GaspiCxx all-reduce latency"):
            print(f"{args.rounds} rounds x {len(arms(args.pauses))} arms, 2 ranks; {load()}")
            figures = measure(args)
    except Unavailable as exc:
        print(f"gaspi_allreduce_latency: {exc}", file=sys.stderr)
        return 2
    fields = report(figures, args)
    print(" ".join([*fields, f"rounds={args.rounds}", f"reps={args.reps}", load_fields()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
