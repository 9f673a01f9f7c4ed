"""Each adapter really trains 2 processes: the loss goes down and every rank
ends with the same weights."""

import json
import os

import pandas as pd
import pytest

from conftest import tiny_design
from ddlcompare.plan import design
from ddlcompare.run import runner


def run_tiny(tmp_path, framework, **fixed):
    row = design.parse(tiny_design([framework], **fixed), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    return folder, json.loads((folder / "done.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "framework,controller",
    [("torch-ddp", "gloo"), ("horovod-torch", "gloo"), ("horovod-torch", "mpi")],
)
def test_two_processes_train_and_agree(tmp_path, request, framework, controller):
    if (framework, controller) == ("torch-ddp", "gloo"):  # tiny_design()'s own run
        results, plan = request.getfixturevalue("tiny_trained")
        folder = results / plan.runs()[0].path
        done = json.loads((folder / "done.json").read_text())
    else:
        folder, done = run_tiny(tmp_path, framework, horovod_controller=controller)
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    # Throughput is measured in every epoch once the warm-up steps are over.
    assert list(epochs["measured_images"]) == [(12 - 2) * 32 * 2, 12 * 32 * 2]
    assert (epochs["images_per_s"] > 0).all()
    assert epochs["test_accuracy"].iloc[-1] > 0.5
    # The run clock (time to accuracy) runs on from epoch to epoch.
    assert epochs["elapsed_s"].is_monotonic_increasing
    assert (epochs["elapsed_s"] >= epochs["wall_s"].cumsum() - 0.05).all()
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
    assert {r["world"] for r in ranks} == {2}
    steps = pd.read_csv(folder / "steps.rank1.tsv", sep="\t")
    assert len(steps) == 2 * 12 and (steps["forward_ns"] > 0).all()
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "ok" and record["hosts"] == [{"name": "localhost", "slots": 2}]
    assert record["harness_commit"] and record["ranks"][0]["torch"].startswith("2.")
    # Where it held: each rank's cores and compute threads, read back by the
    # rank itself, and the run's conditions from them.
    seen = [set(r["cpus"]) for r in record["ranks"]]  # mpirun may bind each to a core
    assert all(cpus and cpus <= os.sched_getaffinity(0) for cpus in seen), seen
    assert [r["compute_threads"] for r in record["ranks"]] == [1, 1]  # the default threads
    conditions = record["conditions"]
    assert conditions["ranks_per_node"] == [2] and conditions["own_cores"] is False
    assert conditions["runnable_per_core"] == round(2 / len(set.union(*seen)), 3)
    assert conditions["network"]["emulated"] is False
    assert conditions["cpu"] == record["ranks"][0]["cpu"] and conditions["cpu"]["vector"]
    # The suite's runs hold the machine shared (tests/conftest.py), and say so.
    assert record["machine_shared"] is True and conditions["machine_shared"] is True


@pytest.mark.slow
def test_frameworks_agree_on_the_same_run():
    """Same seed, data, model and learning-rate rule: DDP and Horovod
    compute the same first-epoch loss (to float tolerance)."""
    import tempfile
    from pathlib import Path

    losses = {}
    for framework in ("torch-ddp", "horovod-torch"):
        with tempfile.TemporaryDirectory() as tmp:
            folder, done = run_tiny(Path(tmp), framework)
            assert done["status"] == "ok"
            losses[framework] = pd.read_csv(folder / "epochs.tsv", sep="\t")["train_loss"][0]
    assert losses["torch-ddp"] == pytest.approx(losses["horovod-torch"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_gpu_run_without_a_gpu_fails_with_its_reason(tmp_path, framework):
    """No GPU here: a device: gpu run is a failed run saying what is missing
    (the GPU path itself needs a GPU machine; none was lent to this project)."""
    row = design.parse(tiny_design([framework], device="gpu"), "tiny.yaml").runs()[0]
    runner.execute(row, tmp_path)  # a failed run is recorded, not raised
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed" and "no CUDA device" in done["reason"], done
    assert "Traceback" not in done["reason"]


def test_phases_close_after_the_device_synchronises():
    """On a GPU each phase ends with a device synchronisation, so that its
    queued kernels are charged to it."""
    import time

    from runfiles.phases import PHASES
    from frameworks.recorder import PhaseRecorder

    phases = PhaseRecorder()
    phases.synchronize = lambda: time.sleep(0.02)  # stands for kernels still running
    phases.begin_step(1, 0)
    with phases("forward"):
        pass
    phases.end_step()
    forward = phases.steps[0][4 + PHASES.index("forward")]
    assert forward >= 20_000_000
