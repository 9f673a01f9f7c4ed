"""The GPU path (device: gpu, NCCL), on a machine with CUDA GPUs.

Skipped where torch sees none (CI, and every machine this project was
developed on so far: no GPU was lent to it); run it on a GPU node with
``./ddlc test tests/test_gpu.py``.
"""
import json

import pandas as pd
import pytest

from conftest import tiny_design
from ddlcompare import design, runner


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    gpu_count() == 0, reason="torch sees no CUDA GPU here (device: gpu needs one)")]


@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_one_process_per_gpu_trains_with_nccl(tmp_path, framework):
    procs = min(gpu_count(), 2)
    row = design.parse(tiny_design([framework], procs=(procs,), device="gpu"),
                       "gpu.yaml").runs()[0]
    runner.execute(row, tmp_path)
    folder = tmp_path / row.path
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    steps = pd.read_csv(folder / "steps.rank0.tsv", sep="\t")
    assert (steps["h2d_ns"] > 0).all()  # the batch is copied to the device each step
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(procs)]
    assert len({r["params_digest"] for r in ranks}) == 1
