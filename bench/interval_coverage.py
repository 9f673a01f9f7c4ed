"""Coverage of the harness's 95 % intervals on synthetic data with a known truth.

1. Adaptive replication (``replications: auto``): each cell runs
   ``min_replications`` times, then as many more as Stein's two-stage rule
   (analysis/replication.py's ``needed``) asks at that first stage's
   spread, up to ``max_replications``; the report then gives the cell's
   mean throughput with Stein's positive 95 % interval
   (analysis/stats.py's ``positive_interval`` with the first stage). The
   share of cells whose interval holds the true mean is its coverage.
2. The what-if's predicted step (analysis/whatif.py's ``predictions``: the
   model refitted to bootstrap resamples of the runs, its standard error
   times Student's t): runs drawn from a known model with noise, the share
   of predictions whose interval holds the model's noise-free step, at the
   measured configurations and the unrun ones it extrapolates to
   (held-out widening left out: none is measured on synthetic data).
3. ``./ddlc improve``'s "contention removed" (analysis/improve.py's
   ``_contention``): one-process and two-process cells of known mean step,
   3 or 4 runs each; the share of predicted gains whose interval holds
   the true gain, 1 - alone / together.

Computation only: no timing, so it may run beside other work.

    python bench/interval_coverage.py [--cells 2000] [--whatif 100] [--contention 2000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import critical_path as cp  # noqa: E402
from analysis import improve, replication, stats, whatif  # noqa: E402

TRUE_MEAN = 1000.0  # images/s


def adaptive_cell(cv: float, heavy: bool, least: int, most: int, target: float, rng) -> tuple:
    """One cell's replications under the stopping rule: (covered, runs)."""

    def draw(k: int) -> list[float]:
        if heavy:  # log-normal, mean TRUE_MEAN
            sigma = np.sqrt(np.log(1 + cv**2))
            return list(TRUE_MEAN * np.exp(rng.normal(-(sigma**2) / 2, sigma, k)))
        return list(rng.normal(TRUE_MEAN, cv * TRUE_MEAN, k))

    first = draw(least)
    values = first + draw(replication.needed(first, target, most) - least)
    _, low, high, _ = stats.positive_interval(pd.Series(values), first_stage=pd.Series(first))
    return low <= TRUE_MEAN <= high, len(values)


def adaptive(cells: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for least, most in ((3, 4), (3, 10)):
        for cv in (0.02, 0.05, 0.10):
            for heavy in (False, True):
                got = [adaptive_cell(cv, heavy, least, most, 0.05, rng) for _ in range(cells)]
                covered = np.mean([c for c, _ in got])
                runs = np.mean([n for _, n in got])
                shape = "log-normal" if heavy else "normal"
                print(
                    f"adaptive replication, min {least} max {most}, target 5 %, {shape} "
                    f"runs of {cv:.0%} variation: coverage {covered:.1%} of {cells} cells "
                    f"(mean {runs:.1f} runs a cell)"
                )


TRUTH = whatif.Model(
    phases={p: (0.001, 0.0004) for p in whatif.WINDOW_PHASES},
    untimed=0.002,
    skew=0.05,
    alpha=0.0005,
    beta=2e-9,
)
NBYTES = 1.7e6


def synthetic_runs(noise: float, runs: int, rng) -> pd.DataFrame:
    """Runs at 1, 2 and 4 processes and batches 32 and 64, ``runs`` each,
    every measured part the truth's with relative noise."""
    rows = []
    for p in (1, 2, 4):
        for batch in (32, 64):
            for _ in range(runs):
                row = {"world_size": p, "batch_size": batch, "net_rate_mbit": np.nan}
                for phase, (u, v) in TRUTH.phases.items():
                    row[phase] = (u + v * batch) * (1 + rng.normal(0, noise))
                row[cp.UNTIMED] = TRUTH.untimed * (1 + rng.normal(0, noise))
                compute = TRUTH.compute(batch)
                row["skew_s"] = (
                    TRUTH.skew * compute * whatif.expected_max(p) * (1 + rng.normal(0, noise))
                )
                ring = 2 * (p - 1) / p * NBYTES
                comm = 2 * (p - 1) * TRUTH.alpha + ring * TRUTH.beta if p > 1 else 0.0
                row["comm_s"] = comm * (1 + rng.normal(0, noise))
                row["comm_bytes_per_step"] = NBYTES
                parts = [*TRUTH.phases, cp.UNTIMED, "skew_s", "comm_s"]
                row["step_s"] = sum(row[part] for part in parts)
                rows.append(row)
    return pd.DataFrame(rows).assign(framework="synthetic")


def whatif_coverage(trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for noise in (0.05, 0.10):
        hits = {"measured": [], "not run": []}
        for _ in range(trials):
            rows = whatif.predictions(synthetic_runs(noise, 3, rng))
            truth = TRUTH.step(
                rows["world_size"].to_numpy(float),
                rows["batch_size"].to_numpy(float),
                rows["comm_bytes_per_step"].to_numpy(float),
                rows["net_rate_mbit"].to_numpy(float),
            )
            inside = (rows["low_ms"] <= truth * 1e3) & (truth * 1e3 <= rows["high_ms"])
            for kind in hits:
                hits[kind] += list(inside[rows["kind"] == kind])
        for kind, found in hits.items():
            print(
                f"what-if prediction, {noise:.0%} noise on every measured part, 3 runs a "
                f"configuration, {kind}: coverage {np.mean(found):.1%} of {len(found)} "
                f"intervals ({trials} data sets)"
            )


ALONE_S, TOGETHER_S = 0.100, 0.160  # mean step of one process and of two
TRUE_GAIN = 1 - ALONE_S / TOGETHER_S


def contention_cells(trials: int, runs: int, cv: float, heavy: bool, rng) -> pd.DataFrame:
    """``trials`` independent pairs of cells (one process, two processes) of
    ``runs`` runs each, told apart by their batch size, as the runs table
    holds them."""
    rows = []
    for trial in range(trials):
        batch = 64 + trial
        for world, mean in ((1, ALONE_S), (2, TOGETHER_S)):
            if heavy:  # log-normal, mean ``mean``
                sigma = np.sqrt(np.log(1 + cv**2))
                steps = mean * np.exp(rng.normal(-(sigma**2) / 2, sigma, runs))
            else:
                steps = rng.normal(mean, cv * mean, runs)
            for rep, step in enumerate(steps, 1):
                rows.append(
                    {
                        "run_id": f"t{trial}w{world}r{rep}",
                        "status": "ok",
                        "framework": "torch-ddp",
                        "nodes": 1,
                        "procs_per_node": world,
                        "world_size": world,
                        "batch_size": batch,
                        "setting": f"batch_size {batch}",
                        "rep": rep,
                        "images_per_s": world * batch / step,
                    }
                )
    return pd.DataFrame(rows)


def contention_coverage(trials: int, seed: int, cases=None) -> dict[tuple, float]:
    """Per case (runs a cell, variation, log-normal or not): the share of
    ``trials`` contention-removed intervals that hold the true gain."""
    rng = np.random.default_rng(seed)
    found = {}
    for runs, cv, heavy in cases or [
        (r, cv, h) for r in (3, 4) for cv in (0.05, 0.10) for h in (False, True)
    ]:
        rows = pd.DataFrame(improve._contention(contention_cells(trials, runs, cv, heavy, rng)))
        found[runs, cv, heavy] = float(
            ((rows["low"] <= TRUE_GAIN) & (TRUE_GAIN <= rows["high"])).mean()
        )
    return found


def contention(trials: int, seed: int) -> None:
    for (runs, cv, heavy), covered in contention_coverage(trials, seed).items():
        shape = "log-normal" if heavy else "normal"
        print(
            f"contention removed, {runs} runs a cell, {shape} steps of {cv:.0%} variation: "
            f"coverage {covered:.1%} of {trials} intervals"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--whatif", type=int, default=100, help="synthetic data sets")
    parser.add_argument("--contention", type=int, default=2000, help="cell pairs a case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    adaptive(args.cells, args.seed)
    whatif_coverage(args.whatif, args.seed)
    contention(args.contention, args.seed)


if __name__ == "__main__":
    main()
