"""The what-if model's held-out error on real runs, beside a naive baseline
from the same runs.

    .venv/bin/python bench/whatif_heldout.py [--design bench/whatif_scale.yaml]
                                             [--results results] [--no-run]

Runs the design through the real workflow (bench/whatif_scale.yaml: 1, 2
and 3 processes; bench/whatif_network.yaml: two emulated nodes at three
link rates, needs root), then fits analysis.whatif's model without the
largest process count (or at one link rate) and predicts the runs left
out. Baseline: the naive prediction that the step does not change (the
measured step at the largest scale fitted on, or at the rate fitted at).
Beside each: how much the compute the model holds fixed moved between the
runs fitted on and the runs predicted (analysis.whatif's compute_drift).
Last line: key=value pairs, one model error, one naive error and one
drift per check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis import critical_path, whatif  # noqa: E402
from front import cli  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", default="bench/whatif_scale.yaml")
    parser.add_argument("--results", default=str(REPO / "results"))
    parser.add_argument("--no-run", action="store_true", help="only analyse the tables")
    args = parser.parse_args()
    if not args.no_run:
        subprocess.run(cli.workflow_argv(args.design, args.results), cwd=REPO, check=True)
    import yaml

    name = yaml.safe_load(Path(REPO, args.design).read_text())["name"]
    tables = next(Path(args.results, name).glob("cfg~*/tables"))
    runs = pd.read_parquet(tables / "runs.parquet")
    phases = critical_path.phase_table(tables)
    found = whatif.analyse(runs, phases, tables)
    pairs = []
    for c in found["checks"].to_dict("records"):
        base = c["naive_error"]
        print(
            f"{c['framework']}: {c['check']}: predicted {c['predicted_ms']:.1f} ms/step, "
            f"measured {c['measured_ms']:.1f}: error {c['relative_error']:+.1%} "
            f"(naive, step unchanged: {base:+.1%}; compute held fixed moved "
            f"{c['compute_drift']:+.1%})",
            flush=True,
        )
        key = (
            (c["framework"] + "_" + c["check"])
            .replace(" ", "_")
            .replace(",", "")
            .replace("-", "_")
            .replace("/", "")
        )
        pairs.append(
            f"{key}_error={c['relative_error']:.3f} {key}_naive={base:.3f} "
            f"{key}_drift={c['compute_drift']:.3f}"
        )
    for p in found["parameters"].to_dict("records"):
        print(
            f"{p['framework']}: alpha {p['alpha_us']:.1f} us, beta {p['beta_ns_per_byte']:.3f} "
            f"ns/byte, skew {p['skew_s']:.3f}; {p['notes']}"
        )
    errors = found["checks"]["relative_error"].abs() if len(found["checks"]) else pd.Series()
    print(" ".join(pairs) + f" mean_abs_error={np.mean(errors) if len(errors) else np.nan:.3f}")


if __name__ == "__main__":
    main()
