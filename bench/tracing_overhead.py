"""What tracing costs: mean step time with ``tracer: otf2`` against
``tracer: none``, same configuration (torch-ddp, 2 processes), alternated in
one run so that drift in the machine hits both alike. Goal: <= 3 %.

    .venv/bin/python bench/tracing_overhead.py [--rounds 3] [--steps 200]
Last line: key=value pairs (figure, baseline, ratio).
"""
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare import design, runner  # noqa: E402


def mean_step_s(tracer: str, framework: str, steps: int, warmup: int) -> float:
    doc = {"name": "bench", "factors": {"framework": [framework], "procs_per_node": [2],
                                        "batch_size": [64]},
           "fixed": {"epochs": 1, "max_steps": steps, "warmup_steps": warmup,
                     "tracer": tracer, "timeout_s": 900}}
    row = design.parse(doc, "bench").runs()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runner.execute(row, Path(tmp))
        folder = Path(tmp, row.path)
        if not (folder / "metrics.json").exists():
            sys.exit((folder / "train.log").read_text()[-2000:])
        if tracer == "otf2" and not (folder / "trace" / "traces.otf2").exists():
            sys.exit("tracer otf2 wrote no archive")
        steps_s = []
        for path in folder.glob("steps.rank*.tsv"):
            table = pd.read_csv(path, sep="\t")
            table = table[table["step"] >= warmup]
            steps_s.append(((table["end_ns"] - table["start_ns"]) / 1e9).mean())
        return max(steps_s)  # the slowest rank sets the pace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--framework", default="torch-ddp")
    args = parser.parse_args()
    traced, plain = [], []
    for r in range(args.rounds):
        traced.append(mean_step_s("otf2", args.framework, args.steps, args.warmup))
        plain.append(mean_step_s("none", args.framework, args.steps, args.warmup))
        print(f"round {r + 1}: otf2 {traced[-1] * 1e3:.2f} ms/step, "
              f"none {plain[-1] * 1e3:.2f} ms/step", flush=True)
    t, p = statistics.median(traced), statistics.median(plain)
    print(f"step_s_otf2={t:.5f} step_s_none={p:.5f} overhead={t / p - 1:.4f} goal_overhead=0.03")


if __name__ == "__main__":
    main()
