"""The same-model gate: PyTorch, Keras and LBANN builders make the network
of the shared specification."""
import pytest

from ddlcompare import envs
from frameworks import data, model_gate, models

TF_BUILT = envs.has_module("tensorflow", "tensorflow")


@pytest.mark.skipif(not TF_BUILT, reason=f"the TensorFlow environment is not built "
                    f"({envs.env_dir('tensorflow')}); 'bash envs/setup.sh' builds it")
def test_gate_passes_for_every_builder_and_dataset():
    result = model_gate.gate()
    assert result["status"] == "pass", result
    for dataset, entry in result["datasets"].items():
        info = data.DATASETS[dataset]
        total = sum(r["params"] for r in models.layer_shapes(models.CNN, info.shape, info.classes))
        assert set(entry["builders"]) == {"pytorch", "keras", "lbann"}
        for builder in entry["builders"].values():
            assert builder["status"] == "pass" and builder["total_params"] == total
    assert result["datasets"]["fashion-mnist"]["total_params"] == 421642


def test_gate_catches_a_different_model():
    reference = model_gate.reference_rows("cnn", "fashion-mnist")
    wider = [dict(r) for r in reference]
    wider[0] = {"type": "conv2d", "shape": (16, 28, 28), "params": 160}
    problems = model_gate.compare(reference, wider)
    assert problems[0].startswith("layer 0: expected ('conv2d', (32, 28, 28), 320)")
    assert "421482 parameters built, 421642 in the spec" in problems
    assert model_gate.compare(reference, reference[:-1])  # a missing layer


def test_gate_without_an_environment_is_incomplete_not_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLC_VENV_TENSORFLOW", str(tmp_path))
    monkeypatch.setattr(model_gate, "BUILDERS", {"keras": "tensorflow", "lbann": "lbann"})
    result = model_gate.gate(datasets=("fashion-mnist",))
    keras = result["datasets"]["fashion-mnist"]["builders"]["keras"]
    assert result["status"] == "incomplete" and keras["status"] == "not checked"
    assert "envs/setup.sh" in keras["reason"]
