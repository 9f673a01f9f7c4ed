"""LBANN's real Python front end builds our experiment, and LBANN's real
protobuf schema accepts it.

Where LBANN is not built (envs/build-lbann.sh takes hours), the front end
comes from an LBANN source tree (frameworks/lbann_source.py:
its .proto files compiled by protoc, as LBANN's CMake build does): the one in
DDLC_LBANN_SOURCE, or envs/build-lbann.sh's checkout, or an installed LBANN.
``lbann.run(..., setup_only=True)`` writes the experiment.prototext and the
launch script that LBANN's executable would be given; the prototext is
parsed with protobuf's text format into lbann_pb2.LbannPB, and checked
against the rules LBANN's C++ side enforces when it reads it."""

import json
import os
from pathlib import Path

import pytest

from ddlcompare.run import schedulers
from ddlcompare.plan.params import PARAMS
from frameworks import data, lbann_source, model_gate
from frameworks import lbann_family as lbann_builder

LBANN, ORIGIN = lbann_source.front_end()
pytestmark = pytest.mark.skipif(
    LBANN is None,
    reason=f"{ORIGIN}; build LBANN with envs/build-lbann.sh (its checkout is "
    f"found) or set {lbann_source.SOURCE_VARIABLE} to an LBANN source tree",
)


def config(**changes) -> dict:
    base = {name: param.default for name, param in PARAMS.items()}
    return {
        **base,
        "epochs": 2,
        "warmup_steps": 5,
        "batch_size": 32,
        "nodes": 1,
        "procs_per_node": 2,
        "run_id": "t1",
        "test_images": 1000,
        "seed": 7,
        **changes,
    }


def prototext(tmp_path: Path, cfg: dict, dataset: str):
    """The experiment of one run, as LBANN's front end writes it, parsed
    against LBANN's schema; and the launch script."""
    from google.protobuf import text_format

    info = data.DATASETS[dataset]
    world = cfg["nodes"] * cfg["procs_per_node"]
    parts = lbann_builder.experiment(LBANN, cfg, info, tmp_path / "data", steps=20, world=world)
    work = tmp_path / "work"
    where = {lbann_builder.RUN_ARGS: json.dumps(schedulers.get("local").lbann_run_args({}))}
    status = LBANN.run(
        *parts, work_dir=str(work), setup_only=True, **lbann_builder.launch_args(cfg, where)
    )
    assert status == 0
    message = LBANN.lbann_pb2.LbannPB()
    text_format.Parse((work / "experiment.prototext").read_text(), message)
    return message, (work / "batch.sh").read_text()


@pytest.mark.parametrize("dataset", ["fashion-mnist", "cifar10"])
def test_experiment_parses_against_lbann_schema(tmp_path, dataset):
    cfg = config()
    message, script = prototext(tmp_path, cfg, dataset)
    assert message.trainer.mini_batch_size == 64  # the global batch
    assert message.trainer.random_seed == cfg["seed"]
    readers = message.data_reader.reader
    roles = [r.role for r in readers]
    if dataset == "cifar10":  # readers/data_reader_cifar10.cpp: train and test only
        assert roles == ["train", "test"]
    else:
        assert roles == ["train", "validate", "test"]
    for reader in readers:  # data_reader.cpp, error_check_counts: exactly one is zero
        assert (reader.absolute_sample_count == 0) != (reader.fraction_of_data_to_use == 0)
    assert readers[0].absolute_sample_count == 20 * 64 and readers[0].shuffle
    assert readers[-1].absolute_sample_count == 1000 and not readers[-1].shuffle
    timers = [c.timer for c in message.model.callback if c.HasField("timer")]
    assert [t.skip_steps for t in timers] == [5]
    assert message.model.num_epochs == 2
    assert message.optimizer.sgd.momentum == pytest.approx(cfg["momentum"])
    kinds = [layer.WhichOneof("layer_type") for layer in message.model.layer]
    assert kinds.count("convolution") == 2 and kinds.count("fully_connected") == 2
    assert "mpiexec" in script and " -n 2 " in script and "--prototext=" in script


def test_resnet_batchnorm_divides_by_n_like_pytorch(tmp_path):
    message, _ = prototext(tmp_path, config(model="resnet34"), "cifar10")
    norms = [
        layer.batch_normalization
        for layer in message.model.layer
        if layer.HasField("batch_normalization")
    ]
    assert len(norms) == 36  # ResNet-34: the stem, 32 in the blocks, 3 shortcuts
    assert all(n.no_bessel_correction for n in norms)
    assert all(n.statistics_group_size == 1 for n in norms)


@pytest.mark.parametrize("model", ["cnn", "resnet34"])
def test_same_model_gate_checks_the_real_lbann_model(model):
    for dataset in data.DATASETS:
        rows, checked_on = model_gate.builder_rows("lbann", model, dataset)
        assert "lbann.Model" in checked_on
        assert model_gate.compare(model_gate.reference_rows(model, dataset), rows) == []


def test_source_front_end_leaves_the_environment_alone(monkeypatch):
    """Its config names a bare 'lbann' executable: left in os.environ, it
    would reach the processes of later runs, whose built LBANN front end
    would then no longer find its executable."""
    source = lbann_source.source_tree()
    if source is None:
        pytest.skip(f"no LBANN source tree ({lbann_source.SOURCE_VARIABLE})")
    monkeypatch.delenv(lbann_source.CONFIG_VARIABLE, raising=False)
    lbann_source.import_lbann(source)
    assert lbann_source.CONFIG_VARIABLE not in os.environ
