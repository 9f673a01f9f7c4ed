"""Real Tarantella (GPI-2 over TCP, tnt.Model) trains the shared CNN with 2
processes through the runner, each step in phases read back from its own
graph, each gradient's all-reduce with its bytes, where the design asks for
them (fit_step_phases: true); without, its default, its whole steps reach
every table of the analysis, and the report says why it has no phases. The same-model
gate checks the real tnt.Model. Skipped where Tarantella is not built:
'bash envs/build-tarantella.sh' builds it (how long: envs/tarantella.md)."""

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, assert_learned, needs_environment, tiny_design, trained
from analysis import bottlenecks, collect, phase_recording, spread
from analysis import critical_path as cp
from analysis.section import plain
from ddlcompare.plan import design, envs
from ddlcompare.run import runner
from ddlcompare.run import model_gate
from ddlcompare.run.launch import LOCAL_SSH
from frameworks import data, models
from runfiles import names
from traces.convert import convert
from traces.rules import RULES_FILE, PhaseRules

pytestmark = needs_environment("tarantella", "tarantella")


@pytest.fixture(scope="module")
def two_ranks():
    """2 processes, 2 epochs of 12 steps (2 fits: Tarantella wraps the
    callbacks anew at each)."""
    with tempfile.TemporaryDirectory() as tmp:
        # GPI-2 start-up and graph building take a minute on a loaded machine
        yield trained(tiny_design(["tarantella"], timeout_s=600, fit_step_phases=True), Path(tmp))


LAST_GASPI_PROGRAM = Path("/tmp/.last_gaspi_prg")  # GPI-2's, machine-wide


def test_a_failed_gaspi_run_kills_no_other_program(tmp_path):
    """When its first rank fails, gaspi_run calls gaspi_cleanup, which killed
    by name the program in a machine-wide file: one any user can write and
    that the last gaspi_run started on the machine wrote. Here a second
    run's program is named there (as when another run starts while this one
    fails); it must live: gaspi_cleanup now takes the failing run's own
    program (envs/patches/tarantella/gaspi-cleanup.json)."""
    other = tmp_path / "tmpother1"  # named like Tarantella's own rank scripts
    shutil.copy("/bin/sleep", other)
    bystander = subprocess.Popen([str(other), "300"])
    failing = tmp_path / "failing"
    failing.write_text(f"#!/bin/sh\necho {other} > {LAST_GASPI_PROGRAM}\nexit 1\n")
    failing.chmod(0o755)
    machines = tmp_path / "machines"
    machines.write_text(socket.gethostname() + "\n")
    saved = LAST_GASPI_PROGRAM.read_bytes() if LAST_GASPI_PROGRAM.exists() else None
    gaspi_run = envs.env_dir("tarantella") / "bin" / "gaspi_run"
    try:
        run = subprocess.run(
            [str(gaspi_run), "-m", str(machines), "-n", "1", str(failing)],
            env={**os.environ, "PATH": f"{LOCAL_SSH}:{os.environ['PATH']}"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0, run.stdout + run.stderr
        assert bystander.poll() is None, "a failed GASPI run killed another run's program"
    finally:
        bystander.kill()
        bystander.wait()
        if saved is None:
            LAST_GASPI_PROGRAM.unlink(missing_ok=True)
        else:
            LAST_GASPI_PROGRAM.write_bytes(saved)


# Keras' way of reading a dataset (inside a tf.function), for as long as the
# autotuner's model thread needs to reach a 2.56 s sleep (it sleeps 10 ms,
# then twice as long after each optimization), then the iterator dropped, as
# fit drops it after an epoch.
DROP_ITERATOR = """
import time
import numpy as np, tensorflow as tf
from frameworks.adapters.tarantella import Adapter
dataset = tf.data.Dataset.from_tensor_slices(np.zeros((100000, 8), np.float32)).batch(8)
dataset = Adapter().fit_dataset(dataset)
next_batch = tf.function(lambda iterator: next(iterator))
iterator = iter(dataset)
start = time.perf_counter()
while time.perf_counter() - start < 2.8:
    next_batch(iterator)
    time.sleep(0.005)
start = time.perf_counter()
del iterator
print(time.perf_counter() - start)
"""


@pytest.mark.slow
def test_fit_drops_its_epoch_iterator_at_once():
    """TensorFlow 2.7 (Tarantella's) waits for the tf.data autotuner's sleep
    to end when an iterator is dropped: up to 22 s after an epoch's last
    step in the default design's runs. The epoch's dataset as fit gets it
    has the autotuner off: dropped in a few ms, not after the 2.5 s left of
    the sleep."""
    run = subprocess.run(
        [str(envs.python_for("tarantella")), "-c", DROP_ITERATOR],
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.split()[-1]) < 0.5, run.stdout


@pytest.mark.slow
def test_two_processes_train_and_agree(two_ranks):
    folder = two_ranks
    assert_learned(folder)
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"]  # one model, 2 replicas
    assert {r["world"] for r in ranks} == {2}
    assert ranks[0]["tarantella"] == "0.8.0"
    assert ranks[0]["tarantella_build_gpi2"] == "v1.5.1"
    assert ranks[0]["tensorflow"] == ranks[0]["tarantella_build_tensorflow"]
    steps = pd.read_csv(folder / "steps.rank1.tsv", sep="\t")
    assert len(steps) == 2 * 12
    record = json.loads((folder / "run.json").read_text())
    command = record["command"]
    at = command.index("-n")  # after flock LOCK and the run's folder to start in
    assert command[at : at + 3] == ["-n", "2", "--no-gpu"]
    assert record["ranks"][0]["tarantella"] == "0.8.0"


# The CNN's gradients: one float32 per trainable parameter
GRADIENT_BYTES = 4 * sum(
    row["params"]
    for row in models.layer_shapes(
        models.MODELS["cnn"], data.FASHION_MNIST.shape, data.FASHION_MNIST.classes
    )
)
TENSORS = 2 * sum(  # a kernel and a bias per conv2d and dense layer
    layer["type"] in ("conv2d", "dense") for layer in models.MODELS["cnn"]["layers"]
)


def assert_phases_and_all_reduces(folder: Path) -> None:
    """Each step in phases on both ranks, adding up to the step (the
    issue's goal: within 5 %), and each gradient's all-reduce in the trace
    with its start, end and bytes: the model's gradients every step."""
    for rank in (0, 1):
        steps = pd.read_csv(folder / names.steps(rank), sep="\t")
        timed = steps[[f"{p}_ns" for p in collect.ROW_PHASES]].sum(axis=1)
        share = timed / (steps["end_ns"] - steps["start_ns"])
        assert share.between(0.95, 1.0).all(), share.describe()
        assert (steps["comm_bytes"] == GRADIENT_BYTES).all()
        assert (steps[["forward_ns", "backward_ns", "grad_comm_ns"]] > 0).all().all()
    table = collect.phase_intervals(folder, "run")
    for rank in (0, 1):
        found = set(table.loc[(table["rank"] == rank) & (table["dur_ns"] > 0), "phase"])
        assert {"data_load", "forward", "backward", "grad_comm", "optimizer"} <= found
    traced, _, errors = convert([folder / names.OTF2_DIR], PhaseRules(RULES_FILE))
    assert errors == []
    traced = traced.to_pandas()
    reduces = traced[traced["collective"] == "allreduce"]
    per_step = reduces.groupby(["rank", "step"])["bytes"].agg(["sum", "count"])
    assert set(per_step.index.get_level_values("rank")) == {0, 1}
    assert len(per_step) == 2 * 2 * 12
    assert (per_step["sum"] == GRADIENT_BYTES).all() and (per_step["count"] == TENSORS).all()
    assert (reduces["end_ns"] >= reduces["start_ns"]).all()
    # each all-reduce lies within its step on its rank
    bounds = traced.loc[traced["phase"] == "step", ["rank", "step", "start_ns", "end_ns"]]
    at = reduces.merge(bounds, on=["rank", "step"], suffixes=("", "_step"))
    assert len(at) == len(reduces)
    assert (at["start_ns"] >= at["start_ns_step"]).all()
    assert (at["end_ns"] <= at["end_ns_step"]).all()


@pytest.mark.slow
def test_each_step_in_phases_with_every_all_reduce(two_ranks):
    assert "/fit_step_phases~true/" in two_ranks.as_posix()  # asked for: a level of its path
    assert_phases_and_all_reduces(two_ranks)


@pytest.mark.slow
def test_whole_steps_only_keep_their_time_in_every_table(tmp_path):
    """Without fit_step_phases (its default: false) whole steps are timed,
    as 'other': the step tables, the spread, the breakdown and the critical
    path keep them, and the report says why it has no phases."""
    doc = tiny_design(["tarantella"], timeout_s=600)
    plan = design.parse(doc, "tiny.yaml")
    assert runner.execute(plan.runs()[0], tmp_path) == 0
    folder = tmp_path / plan.runs()[0].path
    assert_learned(folder)
    steps = pd.read_csv(folder / names.steps(1), sep="\t")
    assert (steps["other_ns"] > 0).all() and (steps["forward_ns"] == 0).all()
    assert (steps["comm_bytes"].isna()).all()  # no buffers seen
    tables = collect.tables(plan, tmp_path)
    runs, table = tables["runs"], tables["step_phases"]
    measured = table[table["step"] >= 2]
    assert set(measured["phase"]) == {"other"}
    row = spread.table(runs, table).iloc[0]
    assert row["step_median_s"] > 0 and row["steps"] == 2 * (2 * 12 - 2)
    parts = bottlenecks.breakdown(table, runs, ["framework"]).set_index("phase")["mean"]
    # the mean of the same steps, from the ranks' own steps files (a mean
    # against the spread's median failed beside a loaded suite: 0.29 s
    # against 0.18 s, a few slow steps)
    ranks = pd.concat(pd.read_csv(folder / names.steps(r), sep="\t") for r in (0, 1))
    measured_s = ranks[ranks["step"] >= 2].eval("(end_ns - start_ns) / 1e9").mean()
    assert parts["other"] == pytest.approx(measured_s, rel=0.01)
    found = cp.analyse(table, runs)
    assert set(found.method.values()) == {"other"} and found.problems == {}
    (line,) = phase_recording.lines(runs, lacking="its ranks join at the whole step")
    assert plain(line).startswith("tarantella: its runs recorded whole steps only, no phases")


@pytest.mark.slow
def test_gpu_run_without_gpus_is_refused(tmp_path):
    """Tarantella itself would only warn and train on the CPU."""
    doc = tiny_design(["tarantella"], device="gpu", epochs=1)
    row = design.parse(doc, "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed"
    assert "device: gpu asks for 2 GPU(s) per node" in done["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("model,dataset", [("cnn", "fashion-mnist"), ("resnet34", "cifar10")])
def test_same_model_gate_on_the_real_tnt_model(model, dataset):
    """tnt.Model around the shared Keras model, built under Tarantella's
    launcher (one rank): layer shapes, parameters and BN statistics."""
    (answer,) = model_gate.ask("tarantella", model, (dataset,), cache=False).values()
    assert "tnt.Model" in answer["checked_on"], answer
    assert model_gate.compare(model_gate.reference_rows(model, dataset), answer["rows"]) == []


@pytest.mark.slow
def test_the_gate_starts_tarantella_outside_the_checkout(tmp_path, monkeypatch):
    """Tarantella's launcher writes its rank script (tmpXXXXXXXX) into its
    working folder and leaves it there when it is killed: the gate's builder
    runs in a scratch folder of its own, never in the checkout."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = set(REPO.glob("tmp*"))
    scripts: set[Path] = set()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(model_gate.ask, "tarantella", "cnn", ("fashion-mnist",), False)
        while not asked.done():
            scripts |= set(tmp_path.glob("ddlc-gate-*/tmp*")) | (set(REPO.glob("tmp*")) - before)
            time.sleep(0.05)
    (answer,) = asked.result().values()
    assert "tnt.Model" in answer.get("checked_on", ""), answer
    assert scripts and {p.parent.parent for p in scripts} == {tmp_path}, scripts
    assert not list(tmp_path.glob("ddlc-gate-*"))  # the scratch folder goes with the builder
