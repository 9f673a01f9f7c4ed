"""Gradient compression against network speed: the mean step time (slowest
rank) and the bytes each rank hands to collectives per step, for each codec,
on two emulated nodes whose links are limited to 1 Gbit/s and 100 Mbit/s or
left alone (bench/compression_network.yaml, through the real workflow; needs
root for the network namespaces).

Baseline: `compression: none` at the same rate, in the same run; the figure
is each codec's step-time speedup over it.

    .venv/bin/python bench/compression_network.py [--results results]
Last line: key=value pairs, one speedup per framework, rate and codec.
"""

import argparse
import subprocess
from pathlib import Path

import pandas as pd

from front import cli

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default=str(REPO / "results"))
    args = parser.parse_args()
    subprocess.run(
        cli.workflow_argv("bench/compression_network.yaml", args.results), cwd=REPO, check=True
    )
    runs = pd.read_parquet(
        next(Path(args.results, "compression-network").glob("cfg~*/tables/runs.parquet"))
    )
    runs = runs[runs["status"] == "ok"].assign(
        rate=lambda r: r["net_rate_mbit"].map(
            lambda v: "unlimited" if pd.isna(v) else f"{int(v)}mbit"
        )
    )
    base = runs[runs["compression"] == "none"].set_index(["framework", "rate"])
    pairs = []
    for row in runs.sort_values(["framework", "rate", "compression"]).itertuples():
        none = base.loc[(row.framework, row.rate)]
        speedup = none["step_mean_s_slowest_rank"] / row.step_mean_s_slowest_rank
        line = (
            f"{row.framework} at {row.rate}, {row.compression}: "
            f"{row.step_mean_s_slowest_rank * 1e3:.1f} ms/step "
            f"(none: {none['step_mean_s_slowest_rank'] * 1e3:.1f}), "
            f"{row.comm_bytes_per_step / 1e6:.3f} MB/step handed over"
        )
        if pd.notna(row.net_tx_bytes_per_step):  # only emulated links are counted
            line += f", {row.net_tx_bytes_per_step / 1e6:.3f} MB/step sent by all nodes"
        print(line, flush=True)
        if row.compression != "none":
            key = f"{row.framework.replace('-', '_')}_{row.rate}_{row.compression}"
            pairs.append(f"{key.replace('+', '_')}_speedup={speedup:.2f}")
    print(" ".join(pairs))


if __name__ == "__main__":
    main()
