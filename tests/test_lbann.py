"""Real LBANN (the executable envs/build-lbann.sh builds, driven by its
installed Python front end) trains the shared CNN with 2 processes through
the runner; its output parser reads what that run printed; the same-model
gate checks the real lbann.Model. Skipped where LBANN is not built: 'bash
envs/build-lbann.sh' builds it (hours on 2 cores)."""

import json
import math
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_learned, generated_cifar, needs_environment, tiny_design, trained
from ddlcompare.plan import envs
from ddlcompare.run import model_gate
from frameworks import lbann_family as lbann
from traces import readers
from traces.rules import PhaseRules

pytestmark = needs_environment(
    "lbann", "lbann", built=(envs.env_dir("lbann") / "bin" / "lbann").exists()
)


@pytest.fixture(scope="module")
def two_ranks():
    """2 processes, 2 epochs of 12 steps of Fashion-MNIST."""
    with tempfile.TemporaryDirectory() as tmp:
        yield trained(tiny_design(["lbann"], timeout_s=600), Path(tmp))


@pytest.mark.slow
def test_two_processes_train(two_ranks):
    folder = two_ranks
    assert_learned(folder)
    batches = pd.read_csv(folder / "lbann_batch_times.tsv", sep="\t")
    assert set(batches["mode"]) >= {"train"} and (batches["mean_s"] > 0).all()
    record = json.loads((folder / "rank0.json").read_text())
    assert record["world"] == 2
    assert record["lbann"].startswith("0.10")  # read from LBANN's own banner
    built = json.loads((envs.env_dir("lbann") / "versions.json").read_text())
    assert record["lbann_build_lbann_commit"] == built["lbann_commit"]  # the build's record
    assert len(record["lbann_build_hydrogen_commit"]) == 40
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["images_per_s"] > 0


@pytest.mark.slow
def test_timeline_gives_every_rank_its_steps_and_phases(two_ranks):
    """Per-step phases from LBANN's own timeline callback: every step of
    both ranks, phases within the step, and step times that agree with what
    LBANN's timer itself printed for the same epoch."""
    parsed = lbann.parse_output((two_ranks / "lbann" / "out.log").read_text())
    for rank in (0, 1):
        steps = pd.read_csv(two_ranks / f"steps.rank{rank}.tsv", sep="\t")
        assert steps["step"].tolist() == list(range(24))  # 2 epochs of 12
        assert steps["epoch"].tolist() == [1] * 12 + [2] * 12
        wall = steps["end_ns"] - steps["start_ns"]
        timed = steps[[f"{p}_ns" for p in ("data_load", "forward", "backward", "optimizer")]]
        assert (timed["forward_ns"] > 0).all() and (timed["backward_ns"] > 0).all()
        assert (timed.sum(axis=1) <= wall + 1000).all()  # the rounding of LBANN's times
        assert (steps["grad_comm_ns"] == 0).all()  # LBANN has none apart
        # epoch 2 has no warm-up step, so LBANN's timer timed all of it
        mean_s = wall[steps["epoch"] == 2].mean() / 1e9
        assert mean_s == pytest.approx(parsed[1]["train_batch_mean_s"], rel=0.05)
    spans = pd.read_csv(two_ranks / "intervals.rank0.tsv", sep="\t")
    first = pd.read_csv(two_ranks / "steps.rank0.tsv", sep="\t")["start_ns"].min()
    init = spans[spans["phase"] == "init"].iloc[0]
    assert init["start_ns"] < init["end_ns"] <= first  # LBANN's start-up is init
    assert spans[spans["phase"] == "eval"]["epoch"].tolist() == [1, 2]
    record = json.loads((two_ranks / "rank0.json").read_text())
    assert record["lbann_timeline"] == "per-step phases"
    # tracer: otf2 (the default): the same archive as every framework's
    table, problems = readers.read(two_ranks / "trace" / "traces.otf2", PhaseRules(), "r")
    table = table.to_pandas()
    assert problems == [] and sorted(table["rank"].unique()) == [0, 1]
    assert (table[table["phase"] == "step"].groupby("rank").size() == 24).all()


@pytest.fixture(scope="module")
def cifar_run():
    """2 processes on CIFAR-10 in its official format (generated: no download
    here), through LBANN's cifar10 reader, which reads fixed-size files."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = generated_cifar(Path(tmp) / "cifar-10-batches-py")
        doc = tiny_design(
            ["lbann"], dataset="cifar10", data_dir=str(folder), test_images=500, timeout_s=600
        )
        yield trained(doc, Path(tmp) / "results")


@pytest.mark.slow
def test_two_processes_train_on_cifar10_files(cifar_run):
    done = json.loads((cifar_run / "done.json").read_text())
    assert done["status"] == "ok", (cifar_run / "train.log").read_text()[-3000:]
    epochs = pd.read_csv(cifar_run / "epochs.tsv", sep="\t")
    assert len(epochs) == 2 and (epochs["images_per_s"] > 0).all()
    assert json.loads((cifar_run / "metrics.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_cifar10_loss_is_finite(cifar_run):
    """Random images with random labels make a step at this learning rate
    diverge, in PyTorch too; the loss must stay a number all the same
    (LBANN's CrossEntropy layer of Softmax reached -log(0) = inf there)."""
    epochs = pd.read_csv(cifar_run / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].map(math.isfinite).all(), epochs
    # cifar10 is scored once, after the last epoch (reader_roles)
    assert math.isfinite(epochs["test_loss"].iloc[-1]), epochs


@pytest.mark.slow
def test_parser_reads_real_lbann_output(two_ranks):
    """The lines LBANN printed in this very run, not ones written from its
    source: every epoch, its loss, accuracy, run time and timer statistics."""
    output = (two_ranks / "lbann" / "out.log").read_text()
    parsed = lbann.parse_output(output)
    assert [e["epoch"] for e in parsed] == [1, 2]
    for entry in parsed:
        assert entry["train_loss"] > 0 and 0 <= entry["train_accuracy"] <= 1
        assert entry["train_run_time_s"] > 0 and entry["train_batch_mean_s"] > 0
        assert 0 <= entry["test_accuracy"] <= 1
    assert not lbann.lbann_version(output).startswith("unknown")


@pytest.mark.slow
def test_same_model_gate_on_the_installed_lbann_model():
    (answer,) = model_gate.ask("lbann", "cnn", ("fashion-mnist",), cache=False).values()
    assert "lbann.Model" in answer["checked_on"], answer
    assert (
        model_gate.compare(model_gate.reference_rows("cnn", "fashion-mnist"), answer["rows"]) == []
    )


def test_each_rank_is_recorded_on_the_host_lbann_says_it_ran_on(tmp_path):
    """--print_affinity's lines (omp_diagnostics.cpp, with and without
    OpenMP threads) give each rank's host; each rank gets its record."""
    from frameworks import lbann_family as lbann

    output = (
        "\n  vm-n0 Task   0/2 Thread   0/1 running on cpu 0\n"
        "  vm-n1 Task   1/2 Thread   0/1 running on cpu 1\n"
        "  vm-n1 Task   1/2 running on cpus 0,1\n"
    )
    hosts = lbann.rank_hosts(output)
    assert hosts == {0: "vm-n0", 1: "vm-n1"}
    driver = {
        "rank": 0,
        "hostname": "driver-host",
        "pid": 7,
        "knobs": {},
        "cpu": {"vector": "avx2"},
    }
    lbann.write_rank_records(tmp_path, driver, hosts, procs_per_node=1)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # neither rank ran on the driver's host: the driver's CPU is not theirs
    assert [(r["rank"], r["hostname"], r["pid"], r["cpu"]) for r in records] == [
        (0, "vm-n0", None, None),
        (1, "vm-n1", None, None),
    ]
    assert records[1]["driver_hostname"] == "driver-host"
