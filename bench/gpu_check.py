"""The GPU checks, on a machine with a CUDA GPU, in one short call.

    python bench/gpu_check.py OUT
    python bench/gpu_check.py --small-traces OUT

Runs tests/test_gpu.py (device: gpu with NCCL, DataParallel, the hybrid
GPU + CPU job), then trains the shared CNN once on the GPU and once on the
CPU of the same machine (torch-ddp, 1 process, same batch and steps), the GPU
run traced by our OTF2 tracer and by the PyTorch profiler with CUDA
activities. Both run folders go to OUT/gpu-runs.tar.gz, to be converted and
read where the project is developed. The interpreter running this script is
the one the runs use (DDLC_VENV is set to it), so it must hold torch with
CUDA and the harness's requirements (envs/torch.txt).

The last line: key=value figures (median step time of each run, device name).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from measuring import holding_the_machine, load, load_fields

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("DDLC_VENV", sys.prefix)

STEPS = 40
BATCH = 64


def device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no CUDA GPU here")
    return torch.cuda.get_device_name(0)


def run_tests(out: Path) -> int:
    log = out / "test_gpu.log"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_gpu.py",
        "-v",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=-ra",
    ]
    with log.open("w") as sink:
        done = subprocess.run(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    print(log.read_text()[-6000:])
    return done.returncode


def train(root: Path, device: str, traced: bool, procs: int = 1, **fixed) -> Path:
    from ddlcompare.plan import design
    from ddlcompare.run import runner

    doc = {
        "name": f"gpu-check-{device}",
        "factors": {"framework": ["torch-ddp"], "procs_per_node": [procs], "batch_size": [BATCH]},
        "replications": 1,
        "fixed": {
            "device": device,
            "epochs": 2,
            "max_steps": STEPS,
            "warmup_steps": 5,
            "train_images": 20000,
            "timeout_s": 300,
            "tracer": "otf2" if traced else "none",
            "torch_profiler": traced,
            **fixed,
        },
    }
    row = design.parse(doc, f"{device}.yaml").runs()[0]
    runner.execute(row, root)
    return root / row.path


def median_step_ms(folder: Path) -> float:
    import pandas as pd

    done = json.loads((folder / "done.json").read_text())
    if done["status"] != "ok":
        print((folder / "train.log").read_text()[-3000:])
        return float("nan")
    steps = pd.read_csv(folder / "steps.rank0.tsv", sep="\t")
    return float((steps["end_ns"] - steps["start_ns"]).median()) / 1e6


def small_traces(out: Path) -> None:
    """Profiler traces small enough to keep as test data: 4 steps and a short
    evaluation, on the GPU alone and in a hybrid job (rank 0 on the GPU,
    rank 1 on the CPU), gzipped into OUT."""
    small = {"epochs": 1, "max_steps": 4, "warmup_steps": 1, "test_images": 256}
    for name, device, procs in (("gpu", "gpu", 1), ("hybrid", "hybrid", 2)):
        folder = train(out / "small", device, True, procs, **small)
        for trace in sorted((folder / "torch_profiler").glob("rank*.json")):
            target = out / f"kineto-{name}-{trace.stem}.json.gz"
            with gzip.open(target, "wb", compresslevel=9) as sink:
                sink.write(trace.read_bytes())
            print(f"{target.name}: {target.stat().st_size} bytes")


def main() -> None:
    if sys.argv[1:2] == ["--small-traces"]:
        small_traces(Path(sys.argv[2]))
        return
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    name = device_name()
    with holding_the_machine("GPU check"):
        print(f"device: {name}; {load()}", flush=True)
        failed = run_tests(out)
        root = out / "runs"
        gpu = train(root, "gpu", traced=True)
        print(f"GPU run: median step {median_step_ms(gpu):.2f} ms; {load()}", flush=True)
        cpu = train(root, "cpu", traced=False)
        print(f"CPU run: median step {median_step_ms(cpu):.2f} ms; {load()}", flush=True)
        fields = load_fields()
    with tarfile.open(out / "gpu-runs.tar.gz", "w:gz") as tar:
        tar.add(root, arcname="runs")
    print(
        f"device={name.replace(' ', '_')} tests_exit={failed} batch={BATCH} "
        f"gpu_step_ms={median_step_ms(gpu):.2f} cpu_step_ms={median_step_ms(cpu):.2f} {fields}"
    )


if __name__ == "__main__":
    main()
