"""The same-model gate: PyTorch, Keras, LBANN and Tarantella builders make
the network of the shared specification."""

import pytest

from ddlcompare.plan import envs

from ddlcompare.run import model_gate
from frameworks import data, models, registry

TF_BUILT = envs.has_module("tensorflow", "tensorflow")
TNT_BUILT = envs.has_module("tarantella", "tarantella")


@pytest.mark.skipif(
    not TF_BUILT,
    reason=f"the TensorFlow environment is not built "
    f"({envs.env_dir('tensorflow')}); 'bash envs/setup.sh' builds it",
)
def test_gate_passes_for_every_model_builder_and_dataset():
    result = model_gate.gate_all(cache=False)  # every builder asked, none remembered
    # Tarantella's builder is checked where it is built (envs/build-tarantella.sh)
    assert result["status"] == ("pass" if TNT_BUILT else "incomplete"), result
    assert set(result["models"]) == {"cnn", "resnet34"}
    for name, model in result["models"].items():
        assert set(model["datasets"]) == {"fashion-mnist", "cifar10"}
        for dataset, entry in model["datasets"].items():
            info = data.DATASETS[dataset]
            rows = models.layer_shapes(models.MODELS[name], info.shape, info.classes)
            total = sum(r["params"] for r in rows)
            running = sum(r["running_stats"] for r in rows)
            assert set(entry["builders"]) == {"pytorch", "keras", "lbann", "tarantella"}
            for builder_name, builder in entry["builders"].items():
                if builder_name == "tarantella" and not TNT_BUILT:
                    assert "envs/build-tarantella.sh" in builder["reason"]
                    continue
                assert builder["status"] == "pass" and builder["total_params"] == total
                assert builder["total_running_stats"] == running
    assert result["models"]["cnn"]["datasets"]["fashion-mnist"]["total_params"] == 421642
    resnet = result["models"]["resnet34"]["datasets"]["cifar10"]
    assert (resnet["total_params"], resnet["total_running_stats"]) == (21_282_122, 17_024)


def test_gate_catches_a_different_model():
    reference = model_gate.reference_rows("cnn", "fashion-mnist")
    wider = [dict(r) for r in reference]
    wider[0] = {"type": "conv2d", "shape": (16, 28, 28), "params": 160}
    problems = model_gate.compare(reference, wider)
    assert problems[0].startswith("layer 0: expected ('conv2d', (32, 28, 28), 320, 0)")
    assert "421482 parameters built, 421642 in the spec" in problems
    assert model_gate.compare(reference, reference[:-1])  # a missing layer


def test_gate_without_an_environment_is_incomplete_not_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLC_VENV_TENSORFLOW", str(tmp_path))
    monkeypatch.setattr(model_gate, "BUILDERS", {"keras": "tensorflow", "lbann": "lbann"})
    result = model_gate.gate(datasets=("fashion-mnist",))
    keras = result["datasets"]["fashion-mnist"]["builders"]["keras"]
    assert result["status"] == "incomplete" and keras["status"] == "not checked"
    assert "envs/setup.sh" in keras["reason"]


def test_every_framework_is_gated_through_its_family_builder():
    """The single-process strategies wrap the model their family's builder
    makes: the gate's verdict on that builder is theirs."""
    assert {"torch-ddp", "horovod-torch", "torch-dp"} <= set(model_gate.frameworks_of("pytorch"))
    assert {"horovod-keras", "tf-mwms", "tf-mirrored"} <= set(model_gate.frameworks_of("keras"))
    named = [f for builder in model_gate.BUILDERS for f in model_gate.frameworks_of(builder)]
    assert sorted(named) == sorted(registry.FRAMEWORKS)


def test_answers_are_kept_for_the_same_code_and_environment(tmp_path, monkeypatch):
    """Each workflow gates every builder: a second ask with nothing changed
    is read back, not asked of TensorFlow again; another environment is
    another question; an answer that could not be had is not kept."""
    monkeypatch.setattr(model_gate, "CACHE", tmp_path / "cache")
    first = model_gate.ask("pytorch", "cnn", ("fashion-mnist",))
    (kept,) = (tmp_path / "cache").glob("*.json")
    assert kept.name == model_gate.answer_key("pytorch", "cnn", ("fashion-mnist",)) + ".json"
    assert model_gate.ask("pytorch", "cnn", ("fashion-mnist",)) == first
    assert model_gate.answer_key("pytorch", "cnn", ("cifar10",)) != kept.stem
    monkeypatch.setenv("DDLC_VENV", str(tmp_path / "elsewhere"))
    assert model_gate.answer_key("pytorch", "cnn", ("fashion-mnist",)) != kept.stem
    (answer,) = model_gate.ask("pytorch", "cnn", ("fashion-mnist",)).values()
    assert "error" in answer and len(list((tmp_path / "cache").glob("*.json"))) == 1


def test_the_answer_key_covers_what_a_builder_can_import(tmp_path):
    """The key hashes the training side and runfiles/, sub-folders
    included: an adapter moved into a folder, or a change to the run
    configuration's type, is another question."""
    for name in ("frameworks/models.py", "frameworks/adapters/x.py", "runfiles/names.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in model_gate.training_code_files(tmp_path)]
    assert found == ["frameworks/adapters/x.py", "frameworks/models.py", "runfiles/names.py"]
    real = model_gate.training_code_files()
    assert model_gate.REPO / "runfiles" / "run_config.py" in real
    assert model_gate.REPO / "frameworks" / "model_gate.py" in real


def test_a_builder_past_its_limit_is_stopped_with_every_process_it_started(tmp_path):
    """A builder that hangs is stopped with its whole tree and session: its
    child, its grandchild, and one left behind by a parent that exited (as
    gaspi_run leaves Tarantella's ranks), which no tree of children lists."""
    import os
    import time

    import psutil

    pids = tmp_path / "pids"
    script = (
        f"sleep 300 & echo $! >> {pids}; "  # a child
        f"sh -c 'sleep 300 & echo $! >> {pids}; wait' & "  # a grandchild
        f"(sleep 300 & echo $! >> {pids}); "  # left behind: its parent exited
        "wait"
    )
    started = time.monotonic()
    done = model_gate.run_builder(
        ["flock", str(tmp_path / "lock"), "sh", "-c", script], tmp_path, dict(os.environ), 3
    )
    assert done is None and time.monotonic() - started < 3 + 2 * 5 + 5
    found = [int(line) for line in pids.read_text().split()]
    assert len(found) == 3

    def gone(pid):
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert all(gone(pid) for pid in found), [p for p in found if not gone(p)]
    answered = model_gate.run_builder(["sh", "-c", "echo rows"], tmp_path, dict(os.environ), 30)
    assert answered is not None and answered.returncode == 0 and answered.stdout == "rows\n"
