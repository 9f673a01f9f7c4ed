"""False positives of ./ddlc improve's decision: an A/A audit.

Runs of one build split at random into "before" and "after" many times,
each split put through the same decision ``./ddlc improve``'s proof makes
(analysis/improve.py's ``proof``: Welch's test on log step time per scale,
Holm-adjusted over every comparison, a claim where the adjusted p is below
5 %). The build is the same on both sides, so every claim is a false
positive; the family-wise rate should be at most 5 %.

The runs are synthetic with a known null (no real run table of one build
with 10 or more runs a cell exists yet): each scale's step times drawn
from a log-normal (run-to-run variation 5 %), and, to be honest about a
busy machine, a second model with heavy tails (one run in five 30 % slower,
as foreign load makes them). Computation only: no timing, so it may run
beside other work.

    python bench/improve_false_positives.py [--splits 1000] [--runs 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import improve  # noqa: E402

TESTED = {  # one hypothesis, as ddlc improve writes it into the follow-up design
    "framework": "torch-ddp",
    "change": "compression fp16",
    "phase": "grad_comm",
    "factor": "compression",
    "before": "none",
    "after": "fp16",
    "predictions": [],
}
SCALES = (1, 2)  # processes: two comparisons, Holm-adjusted together


def one_build(runs: int, heavy_tails: bool, rng: np.random.Generator) -> pd.DataFrame:
    """``runs`` runs per scale of one build, step times from the null model."""
    rows = []
    for world in SCALES:
        step = 0.1 * world * np.exp(rng.normal(0, 0.05, runs))
        if heavy_tails:
            step *= np.where(rng.random(runs) < 0.2, 1.3, 1.0)
        for i, s in enumerate(step):
            rows.append(
                {
                    "run_id": f"w{world}r{i}",
                    "status": "ok",
                    "framework": "torch-ddp",
                    "nodes": 1,
                    "procs_per_node": world,
                    "world_size": world,
                    "batch_size": 64,
                    "rep": i + 1,
                    "images_per_s": world * 64 / s,
                    "final_test_accuracy": 0.9,
                }
            )
    return pd.DataFrame(rows)


def claims(runs: pd.DataFrame, rng: np.random.Generator) -> bool:
    """Whether the decision claims a change on one random A/A split."""
    labels = runs.groupby("world_size")["run_id"].transform(
        lambda ids: rng.permutation(np.arange(len(ids)) < len(ids) // 2)
    )
    split = runs.assign(compression=np.where(labels.astype(bool), "fp16", "none"))
    return bool(improve.proof(split, [TESTED])["significant"].any())


def rate(splits: int, runs: int, heavy_tails: bool, seed: int) -> float:
    """The share of splits in which the decision claimed anything: every
    split of a fresh draw of the build's runs (the null's sampling and the
    split's both vary)."""
    rng = np.random.default_rng(seed)
    found = sum(claims(one_build(runs, heavy_tails, rng), rng) for _ in range(splits))
    return found / splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=12, help="runs of the build per scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for heavy in (False, True):
        found = rate(args.splits, args.runs, heavy, args.seed)
        half = 1.96 * np.sqrt(found * (1 - found) / args.splits)
        model = "log-normal, 1 in 5 runs 30 % slower" if heavy else "log-normal, 5 % variation"
        print(
            f"A/A, {args.runs} runs a scale x {len(SCALES)} scales, {model}: claims in "
            f"{found:.1%} of {args.splits} random splits (95 % interval {max(found - half, 0):.1%} "
            f"to {found + half:.1%}; the decision's nominal family-wise rate is "
            f"{improve.ALPHA:.0%})"
        )


if __name__ == "__main__":
    main()
