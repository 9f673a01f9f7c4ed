"""How the planner scales: a 10,000-run design.

- expanding it (validation + full factorial + paths): goal <= 1 s; baseline:
  a bare itertools.product over the same levels;
- `snakemake -n` on it: goal <= 30 s; baseline: `snakemake -n` of a
  Snakefile with the same number of do-nothing jobs (Snakemake's own cost).

    .venv/bin/python bench/plan_scale.py
Last line: key=value pairs (figure, baseline, ratio) for both.
"""

import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.plan import design  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402

DOC = {
    "name": "scale",
    "factors": {
        "framework": ["torch-ddp", "horovod-torch"],
        "procs_per_node": [1, 2, 3, 4, 5],
        "batch_size": [16, 32, 48, 64, 96, 128, 192, 256, 384, 512],
        "learning_rate": [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5],
    },
    "replications": 10,
}
BARE_SNAKEFILE = """
N = int(config["count"])
rule all:
    input: expand("out/{i}.done", i=range(N))
rule one:
    output: "out/{i}.done"
    shell: "touch {output}"
"""


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    expand_s, runs = timed(lambda: design.parse(DOC, "scale").runs())
    levels = list(DOC["factors"].values()) + [range(DOC["replications"])]
    product_s, cells = timed(lambda: list(itertools.product(*levels)))
    assert len(runs) == len(cells) == 10_000
    snakemake = str(Path(sys.executable).parent / "snakemake")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "design.yaml").write_text(yaml.safe_dump(DOC))
        Path(tmp, "Bare.smk").write_text(BARE_SNAKEFILE)
        dry = [snakemake, "-n", "--quiet", "all", "-d", tmp]
        plan_s, out = timed(
            lambda: subprocess.run(
                dry + ["-s", str(REPO / "Snakefile"), "--config", f"design={tmp}/design.yaml"],
                capture_output=True,
                text=True,
            )
        )
        if out.returncode != 0:
            sys.exit(out.stderr[-2000:])
        bare_s, _ = timed(
            lambda: subprocess.run(
                dry + ["-s", f"{tmp}/Bare.smk", "--config", "count=10000"],
                capture_output=True,
                check=True,
            )
        )
    print(
        f"expand: {expand_s:.3f} s for {len(runs)} runs (bare product {product_s:.4f} s); "
        f"snakemake -n: {plan_s:.1f} s (bare Snakefile {bare_s:.1f} s); {load()}"
    )
    print(
        f"expand_s={expand_s:.3f} expand_baseline_s={product_s:.4f} "
        f"expand_ratio={expand_s / product_s:.0f} expand_goal_s=1 "
        f"dryrun_s={plan_s:.1f} dryrun_baseline_s={bare_s:.1f} "
        f"dryrun_ratio={plan_s / bare_s:.2f} dryrun_goal_s=30 {load_fields()}"
    )


if __name__ == "__main__":
    with holding_the_machine("plan scale"):
        main()
