"""Real Tarantella (GPI-2 over TCP, tnt.Model) trains the shared CNN with 2
processes through the runner, and the same-model gate checks the real
tnt.Model. Skipped where Tarantella is not built: 'bash
envs/build-tarantella.sh' builds it (about 10 minutes on 2 cores)."""

import json
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_learned, tiny_design, trained
from ddlcompare.plan import design
from ddlcompare.run import envs, runner
from ddlcompare.run import model_gate

BUILT = envs.has_module("tarantella", "tarantella")
pytestmark = pytest.mark.skipif(
    not BUILT,
    reason=f"Tarantella is not built ({envs.env_dir('tarantella')}); "
    "'bash envs/build-tarantella.sh' builds it, or set DDLC_VENV_TARANTELLA",
)


@pytest.fixture(scope="module")
def two_ranks():
    """2 processes, 2 epochs of 12 steps (2 fits: Tarantella wraps the
    callbacks anew at each)."""
    with tempfile.TemporaryDirectory() as tmp:
        # GPI-2 start-up and graph building take a minute on a loaded machine
        yield trained(tiny_design(["tarantella"], timeout_s=600), Path(tmp))


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
    assert len(steps) == 2 * 12 and (steps["other_ns"] > 0).all()  # whole steps only
    assert (steps["forward_ns"] == 0).all()
    record = json.loads((folder / "run.json").read_text())
    command = record["command"]
    at = command.index("-n")  # after flock LOCK and the run's folder to start in
    assert command[at : at + 3] == ["-n", "2", "--no-gpu"]
    assert record["ranks"][0]["tarantella"] == "0.8.0"


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
