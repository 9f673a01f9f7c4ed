"""How close the fusion rule (frameworks/knobs.py, fusion_rule_kib) lands to
the best point of the measured grid of bench/fusion_grid.yaml.

For each framework and scale (2 processes on one node; 2 emulated nodes at
1 Gbit/s) it takes the median step time of each threshold over the
replications (each run's median step, steps.rank0.tsv, warm-up left out),
the best threshold, and the threshold the rule gives: the rule's step time
over the best's. It reads the run folders the grid wrote; beside each cell,
the highest load average and share of the CPU taken by other processes
that its runs' measured steps saw (run.json's machine_load). Last line:
key=value.

    python bench/fusion_rule.py RESULTS_ROOT...   (the grids' results folders)

Several grids' folders pool their runs point by point (the same design's
points, e.g. bench/fusion_grid_2nodes.yaml's beside bench/fusion_grid.yaml's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from frameworks import knobs  # noqa: E402

# The shared CNN's gradients in the order backward makes them (last layer
# first; tests/data/knobs/cnn-gradient-bytes.json holds them by name).
BACKWARD_ORDER = [40, 5120, 512, 1605632, 256, 73728, 128, 1152]
CNN_GRADIENT_BYTES = sum(BACKWARD_ORDER)


def grouping(framework: str, kib: int) -> list[int]:
    """The messages a threshold makes of the CNN's gradients: DDP and
    Tarantella close a bucket once it holds the threshold; Horovod fuses
    while the response stays within it (tensors ready in one cycle)."""
    limit = kib * knobs.KIB
    if framework != "horovod-torch":
        return knobs.packs(BACKWARD_ORDER, limit)
    found, group = [], 0
    for size in BACKWARD_ORDER:
        if group and group + size > limit:
            found.append(group)
            group = 0
        group += size
    return found + [group]


def median_step_ms(folder: Path, warmup: int) -> float | None:
    table = folder / "steps.rank0.tsv"
    if not table.exists():
        return None
    lines = table.read_text().splitlines()
    header = lines[0].split("\t")
    start, end = header.index("start_ns"), header.index("end_ns")
    steps = [line.split("\t") for line in lines[1:]][warmup:]
    return statistics.median((int(s[end]) - int(s[start])) / 1e6 for s in steps)


def cells(roots: list[Path]) -> tuple[dict, dict]:
    """Per (framework, nodes, procs): each threshold's runs' median steps,
    and the highest load average and foreign CPU share the runs saw."""
    found: dict = {}
    loads: dict = {}
    for record_path in (path for root in roots for path in root.glob("**/run.json")):
        record = json.loads(record_path.read_text())
        if record.get("status") != "ok":
            continue
        config = record["config"]
        step = median_step_ms(record_path.parent, config["warmup_steps"])
        if step is None:
            continue
        key = (config["framework"], config["nodes"], config["procs_per_node"])
        found.setdefault(key, {}).setdefault(config["fusion_threshold_kib"], []).append(step)
        load = record.get("machine_load") or {}
        seen = loads.setdefault(key, [0.0, 0.0])
        seen[0] = max(seen[0], load.get("load_avg_1m_max") or 0.0)
        seen[1] = max(seen[1], load.get("foreign_cpu_share") or 0.0)
    return found, loads


def _against(rule: list[float], best: list[float]) -> str:
    """The rule's step over the best's as a ratio of geometric means, with
    its 95 % interval and Welch's p on log steps: whether the grid can tell
    them apart at all ('' where the rule's point is the best)."""
    if rule is best or len(rule) < 2 or len(best) < 2:
        return ""
    a, b = np.log(rule), np.log(best)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    diff, half = a.mean() - b.mean(), stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    p = stats.ttest_ind(a, b, equal_var=False).pvalue
    low, high = (100 * (np.exp(x) - 1) for x in (diff - half, diff + half))
    return (
        f" (geometric means {100 * (np.exp(diff) - 1):+.1f} % [{low:+.1f}, {high:+.1f}], p {p:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("roots", type=Path, nargs="+")
    args = parser.parse_args()
    worst = 0.0
    found, loads = cells(args.roots)
    for (framework, nodes, procs), by_kib in sorted(found.items()):
        seen = loads[framework, nodes, procs]
        load = f"(runs' load average <= {seen[0]:.2f}, others' CPU share <= {seen[1]:.1%})"
        # thresholds that make the same messages are one point: their runs pool
        classes: dict = {}
        for kib, steps in by_kib.items():
            kibs, pooled = classes.setdefault(tuple(grouping(framework, kib)), ([], []))
            kibs.append(kib)
            pooled.extend(steps)
        medians = {key: statistics.median(steps) for key, (_, steps) in classes.items()}
        best = min(medians, key=medians.get)
        rule = knobs.fusion_rule_kib(CNN_GRADIENT_BYTES, framework, nodes, procs)
        row = "; ".join(
            f"{'/'.join(map(str, sorted(classes[key][0])))} KiB ({len(key)} messages): "
            f"{medians[key]:.1f} ms (n={len(classes[key][1])})"
            for key in sorted(medians, key=len)
        )
        ruled = tuple(grouping(framework, rule))
        if ruled not in medians:
            print(f"{framework} {nodes}x{procs}: {row}; the rule's {rule} KiB not measured {load}")
            continue
        ratio = medians[ruled] / medians[best]
        worst = max(worst, ratio)
        print(
            f"{framework} {nodes} node(s) x {procs}: {row}; rule {rule} KiB: "
            f"{100 * (ratio - 1):+.1f} % over the best{_against(classes[ruled][1], classes[best][1])} "
            f"{load}"
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load_average_now={load.replace(' ', ',')} rule_worst_excess_pct={100 * (worst - 1):.1f}"
    )


if __name__ == "__main__":
    main()
