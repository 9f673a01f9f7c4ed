"""Throughput of each adapter against a bare loop of the same framework.

Same model, data, batch, 2 processes, same launcher, tracing off (its cost is
bench/tracing_overhead.py's figure); the harness run and the bare loop alternate (harness, bare, harness, bare...) so that drift in the
machine hits both alike. Goal: harness >= 0.97 of the bare loop.

    .venv/bin/python bench/adapter_overhead.py [--rounds 3] [--steps 300]
Last line: key=value pairs per framework (figure, baseline, ratio).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.plan import design  # noqa: E402
from ddlcompare.run import launch, runner, schedulers  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402


def harness(framework: str, batch: int, steps: int, warmup: int) -> float:
    doc = {
        "name": "bench",
        "factors": {"framework": [framework], "procs_per_node": [2], "batch_size": [batch]},
        "fixed": {
            "epochs": 1,
            "max_steps": steps,
            "warmup_steps": warmup,
            "eval_every": 1,
            "timeout_s": 900,
            "tracer": "none",
        },
    }  # tracing's cost: bench/tracing_overhead.py
    row = design.parse(doc, "bench").runs()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runner.execute(row, Path(tmp))
        metrics = Path(tmp, row.path, "metrics.json")
        if not metrics.exists():
            sys.exit(Path(tmp, row.path, "train.log").read_text()[-2000:])
        return json.loads(metrics.read_text())["images_per_s"]


def bare(framework: str, batch: int, steps: int, warmup: int) -> float:
    info = {"torch-ddp": "torchrun", "horovod-torch": "horovodrun"}[framework]
    config = {"threads": 1, "horovod_controller": "gloo", "run_id": "bench", "framework": framework}
    python = launch.python(config)
    argv, env = launch.command(info, [schedulers.Host("localhost", 2)], config, Path("."), "local")
    script = [str(REPO / "bench" / "bare_loop.py"), framework, str(batch), str(steps), str(warmup)]
    if info == "torchrun":  # torchrun takes a script path instead of -m module
        argv = argv[: argv.index("-m", 3)] + script
    else:
        argv = argv[: argv.index(python)] + [python] + script
    out = subprocess.run(
        argv,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    line = [ln for ln in out.stdout.splitlines() if "images_per_s" in ln][-1]
    return json.loads(line[line.index("{") :])["images_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    pairs = []
    for framework in ("torch-ddp", "horovod-torch"):
        h, b = [], []
        for r in range(args.rounds):
            h.append(harness(framework, args.batch, args.steps, args.warmup))
            b.append(bare(framework, args.batch, args.steps, args.warmup))
            print(
                f"{framework} round {r + 1}: harness {h[-1]:.0f} img/s, bare {b[-1]:.0f} img/s; "
                f"{load()}",
                flush=True,
            )
        mh, mb = statistics.median(h), statistics.median(b)
        key = framework.replace("-", "_")
        pairs += [
            f"{key}_images_per_s={mh:.0f}",
            f"{key}_bare_images_per_s={mb:.0f}",
            f"{key}_ratio={mh / mb:.3f}",
        ]
    print(" ".join(pairs + ["goal_ratio=0.97", load_fields()]))


if __name__ == "__main__":
    with holding_the_machine("adapter overhead"):
        main()
