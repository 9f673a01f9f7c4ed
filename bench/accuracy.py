"""The shared CNN's test accuracy after 5 epochs of Fashion-MNIST with 1
and 2 processes under each framework (bench/accuracy.yaml), through the
real workflow. Goal: >= 0.89 each; baseline: the 0.876-0.916 that the
Fashion-MNIST README reports for two-conv-plus-pooling CNNs.

    .venv/bin/python bench/accuracy.py [--results results]
Last line: key=value pairs, one accuracy per framework and process count.
"""

import argparse
import subprocess
from pathlib import Path

import pandas as pd
import yaml

from front import cli

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default=str(REPO / "results"))
    parser.add_argument(
        "--design",
        default="bench/accuracy.yaml",
        help="a design in bench/accuracy.yaml's form (e.g. fewer frameworks)",
    )
    args = parser.parse_args()
    subprocess.run(cli.workflow_argv(args.design, args.results), cwd=REPO, check=True)
    name = yaml.safe_load(Path(REPO, args.design).read_text())["name"]
    runs = pd.read_parquet(next(Path(args.results, name).glob("cfg~*/tables/runs.parquet")))
    pairs = []
    for row in runs.sort_values(["framework", "world_size"]).itertuples():
        key = f"{row.framework.replace('-', '_')}_np{row.world_size}"
        pairs.append(f"{key}_accuracy={row.final_test_accuracy:.4f}")
        print(
            f"{row.framework} x {row.world_size}: test accuracy {row.final_test_accuracy:.4f} "
            f"after {row.epochs} epochs, {row.images_per_s:.0f} images/s",
            flush=True,
        )
    worst = runs["final_test_accuracy"].min()
    print(
        " ".join(
            pairs
            + [
                f"worst={worst:.4f}",
                "goal=0.89",
                "baseline_low=0.876",
                "baseline_high=0.916",
                f"ratio_to_goal={worst / 0.89:.3f}",
            ]
        )
    )


if __name__ == "__main__":
    main()
