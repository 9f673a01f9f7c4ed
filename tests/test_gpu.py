"""The GPU path (device: gpu, NCCL), on a machine with CUDA GPUs.

Skipped where torch sees none (CI, and every machine this project was
developed on so far: no GPU was lent to it); run it on a GPU node with
``./ddlc test tests/test_gpu.py``.
"""

import json
import subprocess

import pandas as pd
import pytest

from conftest import tiny_design
from ddlcompare.plan import design
from ddlcompare.run import runner


def test_gpu_frameworks_are_planned_here(tmp_path):
    """A machine with GPUs plans torch-dp and hybrid cells without refusal."""
    from conftest import ddlc, write_design

    doc = tiny_design(["torch-dp", "torch-ddp"], procs=(1,), device="gpu")
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert "GPU(s) and this machine has" not in out.stderr, out.stderr


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        gpu_count() == 0, reason="torch sees no CUDA GPU here (device: gpu needs one)"
    ),
]


def train_ok(tmp_path, doc):
    """Train one tiny run: it finished well and its loss went down."""
    row = design.parse(doc, "gpu.yaml").runs()[0]
    runner.execute(row, tmp_path)
    folder = tmp_path / row.path
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    return folder, epochs


@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_one_process_per_gpu_trains_with_nccl(tmp_path, framework):
    from ddlcompare.plan import envs

    if framework == "horovod-torch" and not envs.has_module("torch", "horovod.torch"):
        pytest.skip("Horovod is not built in the torch environment (envs/setup.sh builds it)")
    procs = min(gpu_count(), 2)
    folder, _ = train_ok(tmp_path, tiny_design([framework], procs=(procs,), device="gpu"))
    steps = pd.read_csv(folder / "steps.rank0.tsv", sep="\t")
    assert (steps["h2d_ns"] > 0).all()  # the batch is copied to the device each step
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(procs)]
    assert len({r["params_digest"] for r in ranks}) == 1


def test_data_parallel_over_the_local_gpus(tmp_path):
    """torch-dp: one process, DataParallel over min(GPUs, 2) GPUs; each
    replica takes what DDP's rank would, so the first epoch is DDP's."""
    procs = min(gpu_count(), 2)
    folder, epochs = train_ok(
        tmp_path / "dp", tiny_design(["torch-dp"], procs=(procs,), device="gpu")
    )
    steps = pd.read_csv(folder / "steps.rank0.tsv", sep="\t")
    assert (steps["h2d_ns"] > 0).all() and not (folder / "rank1.json").exists()
    assert json.loads((folder / "metrics.json").read_text())["world_size"] == procs
    _, ddp = train_ok(tmp_path / "ddp", tiny_design(["torch-ddp"], procs=(procs,), device="gpu"))
    assert epochs["train_loss"][0] == pytest.approx(ddp["train_loss"][0], rel=1e-3)


def gpu_activities(trace) -> pd.DataFrame:
    """The rows of a PyTorch profiler trace that ran on a GPU stream."""
    from traces import readers
    from traces.rules import PhaseRules

    table, _ = readers.read(trace, PhaseRules(), "gpu")
    df = table.to_pandas()
    return df[df["location"].str.contains("stream")]


def test_hybrid_gpu_and_cpu_ranks_in_one_job(tmp_path):
    """device: hybrid, 1 GPU process and 1 CPU process (gloo): shares from
    calibration, each device kind's share and idle time in balance.json, and
    the update of one process with the global batch."""
    doc = tiny_design(["torch-ddp"], procs=(2,), device="hybrid", hybrid_gpus=1)
    doc["fixed"]["torch_profiler"] = True
    folder, epochs = train_ok(tmp_path / "hybrid", doc)
    # the GPU rank's profiler trace holds its kernels, each in its launch's step
    gpu_rows = [gpu_activities(folder / "torch_profiler" / f"rank{r}.json") for r in (0, 1)]
    assert sorted(len(rows) > 0 for rows in gpu_rows) == [False, True]
    kernels = max(gpu_rows, key=len)
    assert kernels.loc[kernels["phase"] == "backward", "step"].notna().all()
    split = json.loads((folder / "balance.json").read_text())
    kinds = {k["device"]: k for k in split["by_device"]}
    assert set(kinds) == {"gpu", "cpu"}
    assert kinds["gpu"]["share"] + kinds["cpu"]["share"] == pytest.approx(1.0)
    assert all(k["idle_s"] >= 0 for k in kinds.values())
    alone = tiny_design(["torch-ddp"], procs=(1,))
    alone["factors"]["batch_size"] = [64]
    _, reference = train_ok(tmp_path / "alone", alone)
    # GPU and CPU kernels round differently: close, not bit-equal
    assert epochs["train_loss"][0] == pytest.approx(reference["train_loss"][0], rel=1e-2)


def tensorflow_gpu_count() -> int:
    from ddlcompare.plan import envs

    python = envs.python_for("tensorflow")
    if not python.exists():
        return 0
    probe = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    return int(done.stdout.split()[-1]) if done.returncode == 0 else 0


def test_mirrored_strategy_over_the_local_gpus(tmp_path):
    """tf-mirrored on GPUs (NCCL all-reduce); needs a GPU build of TensorFlow
    (envs/tensorflow.txt installs tensorflow-cpu: see docs/devices.md)."""
    gpus = tensorflow_gpu_count()
    if gpus == 0:
        pytest.skip("the TensorFlow environment sees no GPU (a tensorflow-cpu build)")
    folder, _ = train_ok(
        tmp_path, tiny_design(["tf-mirrored"], procs=(min(gpus, 2),), device="gpu")
    )
    replicas = json.loads((folder / "rank0.json").read_text())["replica_params_digests"]
    assert len(set(replicas)) == 1
