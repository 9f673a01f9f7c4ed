"""The TensorFlow adapters really train 2 processes: the loss goes down,
every rank ends with the same weights, and the phases are timed one by one.
Skipped only when the TensorFlow environment (.venv-tf) is not built;
./ddlc test builds it."""

import json
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import needs_environment, tiny_design, trained
from ddlcompare.plan import design
from ddlcompare.plan import envs
from ddlcompare.run import runner

needs_tf = needs_environment("tensorflow", "horovod.tensorflow")
CASES = [("horovod-keras", "gloo"), ("horovod-keras", "mpi"), ("tf-mwms", "gloo")]
# One process mirroring over 2 logical CPU devices (no controller: one process).
MIRRORED = ("tf-mirrored", "gloo")


@pytest.fixture(scope="module")
def tiny_runs():
    """Each case trained once (2 processes, 2 epochs of 12 steps), shared by the tests."""
    with tempfile.TemporaryDirectory() as tmp:
        found = {}
        for framework, controller in CASES + [MIRRORED]:
            doc = tiny_design([framework], horovod_controller=controller)
            found[framework, controller] = trained(doc, Path(tmp))
        yield found


@needs_tf
@pytest.mark.slow
@pytest.mark.parametrize("framework,controller", CASES)
def test_two_processes_train_and_agree(tiny_runs, framework, controller):
    folder = tiny_runs[framework, controller]
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    assert epochs["test_accuracy"].iloc[-1] > 0.5
    assert (epochs["images_per_s"] > 0).all()  # every epoch is measured after warm-up
    # The run clock (time to accuracy) runs on from epoch to epoch.
    assert epochs["elapsed_s"].is_monotonic_increasing
    assert (epochs["elapsed_s"] >= epochs["wall_s"].cumsum() - 0.05).all()
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
    assert {r["world"] for r in ranks} == {2}
    assert ranks[0]["tensorflow"].startswith("2.") and ranks[0]["keras"].startswith("2.")
    assert ("horovod" in ranks[0]) == framework.startswith("horovod")
    steps = pd.read_csv(folder / "steps.rank1.tsv", sep="\t")
    assert len(steps) == 2 * 12
    for phase in ("data_load", "forward", "backward", "grad_comm", "optimizer"):
        assert (steps[f"{phase}_ns"] > 0).all(), phase
    # the shared CNN's float32 gradients, handed to the all-reduce each step
    assert (steps["comm_bytes"] == 421_642 * 4).all(), steps["comm_bytes"].unique()
    intervals = pd.read_csv(folder / "intervals.rank0.tsv", sep="\t")
    assert set(intervals["phase"]) == {"init", "eval"}
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "ok" and record["hosts"] == [{"name": "localhost", "slots": 2}]
    assert (folder / "energy_sources.rank0.json").exists()  # one sampler: local rank 0
    assert not (folder / "energy_sources.rank1.json").exists()
    assert json.loads((folder / "energy.json").read_text())["status"].startswith(
        ("measured: ", "not available: ")
    )


@needs_tf
@pytest.mark.slow
def test_horovod_and_mwms_compute_the_same_run(tiny_runs):
    """Same seed, data, model, learning-rate rule and gradient average:
    Horovod and MultiWorkerMirroredStrategy agree on the first epoch."""
    loss = {
        key: pd.read_csv(folder / "epochs.tsv", sep="\t")["train_loss"][0]
        for key, folder in tiny_runs.items()
    }
    assert loss["tf-mwms", "gloo"] == pytest.approx(loss["horovod-keras", "gloo"], rel=1e-4)
    assert loss["horovod-keras", "mpi"] == pytest.approx(loss["horovod-keras", "gloo"], rel=1e-4)


@needs_tf
@pytest.mark.slow
def test_mirrored_strategy_over_two_logical_cpus(tiny_runs):
    """tf-mirrored: one process, 2 replicas on logical CPU devices. It
    trains, both replicas end with the same weights, and its first epoch is
    Horovod's with 2 processes (same seed, images per replica, average)."""
    folder = tiny_runs[MIRRORED]
    assert json.loads((folder / "done.json").read_text())["status"] == "ok", (
        folder / "train.log"
    ).read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    assert epochs["test_accuracy"].iloc[-1] > 0.5
    assert epochs["measured_images"].tolist() == [(12 - 2) * 32 * 2, 12 * 32 * 2]
    horovod = pd.read_csv(tiny_runs["horovod-keras", "gloo"] / "epochs.tsv", sep="\t")
    assert epochs["train_loss"][0] == pytest.approx(horovod["train_loss"][0], rel=1e-4)
    record = json.loads((folder / "rank0.json").read_text())
    assert record["world"] == 1 and not (folder / "rank1.json").exists()
    replicas = record["replica_params_digests"]
    assert len(replicas) == 2 and replicas[0] == replicas[1] == record["params_digest"]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 64
    steps = pd.read_csv(folder / "steps.rank0.tsv", sep="\t")
    for phase in ("data_load", "forward", "backward", "grad_comm", "optimizer"):
        assert (steps[f"{phase}_ns"] > 0).all(), phase
    # the shared CNN's float32 gradients, handed to the all-reduce each step
    assert (steps["comm_bytes"] == 421_642 * 4).all(), steps["comm_bytes"].unique()


def in_tensorflow(code: str, timeout: int) -> subprocess.CompletedProcess:
    """Python ``code`` run in the TensorFlow environment, from the checkout."""
    return subprocess.run(
        [str(envs.python_for("tensorflow")), "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent,
    )


@needs_tf
def test_keras_model_is_initialised_as_the_spec_says():
    """He-uniform (ReLU layers) and Glorot-uniform (output) bounds, zero
    biases, 'same' padding, in the TensorFlow environment itself."""
    probe = """
import math
from frameworks import data, keras_models, models
m = keras_models.build(models.CNN, data.FASHION_MNIST, seed=1)
for layer in m.layers:
    if not layer.weights:
        continue
    kernel, bias = (w.numpy() for w in layer.weights)
    fan_in = math.prod(kernel.shape[:-1])
    fan_out = kernel.shape[-1] * math.prod(kernel.shape[:-2])
    relu = layer.get_config()["activation"] == "relu"
    limit = math.sqrt(6 / fan_in) if relu else math.sqrt(6 / (fan_in + fan_out))
    assert abs(kernel).max() <= limit and abs(kernel).max() > 0.9 * limit, layer.name
    assert not bias.any(), layer.name
    assert layer.get_config().get("padding", "same") == "same", layer.name
print("ok", m.count_params())
"""
    done = in_tensorflow(probe, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", "421642"]


@needs_tf
def test_a_rank_counts_the_inter_op_threads_that_compute_beside_each_other():
    """At ``threads: 1`` TensorFlow runs each kernel on one of the two
    inter-op threads the harness keeps, two at once: the rank's record says
    2 compute threads, not its one intra-op thread (two such threads took
    1.2 cores together in Tarantella's step: docs/improvements.md)."""
    probe = """
from frameworks import common, tf_family
tf_family.configure_tensorflow({"threads": 1})
print(common.where_it_ran()["compute_threads"])
"""
    done = in_tensorflow(probe, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2"]


@needs_tf
def test_one_inter_op_thread_takes_effect_and_leaves_one_compute_thread():
    """inter_op_threads: 1 sets TensorFlow's inter-op pool to one, the
    family's read-back finds it there, and the rank counts 1 compute thread
    (a core free beside it on 2 cores); a pool other than the one asked
    fails the run, naming the knob."""
    probe = """
from frameworks import common, tf_family
config = {"framework": "tarantella", "threads": 1, "inter_op_threads": 1}
tf_family.configure_tensorflow(config)
adapter = tf_family.TFAdapter()
adapter.config = config
print(adapter.knobs_in_effect()["inter_op_threads"], common.where_it_ran()["compute_threads"])
adapter.config = {**config, "inter_op_threads": 3}
try:
    adapter.knobs_in_effect()
except common.RunError as e:
    print(e)
"""
    done = in_tensorflow(probe, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    read_back, refused = done.stdout.strip().splitlines()
    assert read_back.split() == ["1", "1"]
    assert "inter_op_threads: asked 3, TensorFlow's threading settings says 1" in refused


@needs_tf
@pytest.mark.slow
def test_fit_loop_of_frameworks_that_own_the_step(tmp_path):
    """The loop Tarantella runs (tf_family.train_fit), with Keras' own fit
    in place of tnt.Model's (one process): its tables, 'other' for whole
    steps, and training that works."""
    probe = f"""
import json
import numpy as np
from pathlib import Path
from ddlcompare.plan.params import PARAMS
from frameworks import tf_family
from frameworks.common import Dist

class KerasFit(tf_family.TFAdapter):
    uses_fit = True
    def init(self, config):
        return Dist(rank=0, world=1, local_rank=0)
    def wrap_for_fit(self, model, optimizer, loss, metrics):
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        return model
    def allreduce(self, values, op):
        return values

config = {{name: p.default for name, p in PARAMS.items()}}
config.update(framework="tarantella", seed=42, epochs=2, max_steps=20, train_images=4000,
              test_images=1000, warmup_steps=2, batch_size=32)
tf_family.train(KerasFit(), config, Path({str(tmp_path)!r}))
"""
    done = in_tensorflow(probe, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = pd.read_csv(tmp_path / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    assert epochs["test_accuracy"].iloc[-1] > 0.5
    assert epochs["measured_images"].tolist() == [18 * 32, 20 * 32]
    steps = pd.read_csv(tmp_path / "steps.rank0.tsv", sep="\t")
    assert len(steps) == 40 and (steps["other_ns"] > 0).all()
    assert (steps[["forward_ns", "backward_ns", "grad_comm_ns"]] == 0).all().all()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 1 and metrics["steps_per_epoch"] == 20


@needs_tf
@pytest.mark.slow
def test_calibrated_shares_in_the_tensorflow_loop(tmp_path, monkeypatch):
    """The same mechanism as the PyTorch loop's (frameworks/balance.py):
    horovod-keras with rank 1 slowed on purpose gives it the smaller share
    and trains as one process with the whole global batch of 64."""
    from frameworks import balance

    monkeypatch.setenv(balance.SLOW_RANKS_ENV, "1:0.004")
    split = design.parse(
        tiny_design(["horovod-keras"], batch_split="calibrated"), "tiny.yaml"
    ).runs()[0]
    assert runner.execute(split, tmp_path) == 0
    monkeypatch.delenv(balance.SLOW_RANKS_ENV)
    alone = tiny_design(["horovod-keras"], procs=(1,))
    alone["factors"]["batch_size"] = [64]
    reference = design.parse(alone, "tiny.yaml").runs()[0]
    assert runner.execute(reference, tmp_path) == 0
    epochs = [
        pd.read_csv(tmp_path / row.path / "epochs.tsv", sep="\t") for row in (split, reference)
    ]
    # the same updates up to float rounding, which training amplifies (test_devices)
    assert epochs[0]["train_loss"][0] == pytest.approx(epochs[1]["train_loss"][0], rel=1e-3)
    assert epochs[0]["train_loss"].tolist() == pytest.approx(
        epochs[1]["train_loss"].tolist(), rel=1e-2
    )
    ranks = json.loads((tmp_path / split.path / balance.BALANCE).read_text())["ranks"]
    assert ranks[1]["images_per_step"] < ranks[0]["images_per_step"]
    assert ranks[0]["images_per_step"] + ranks[1]["images_per_step"] == 64
