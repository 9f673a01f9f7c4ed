"""ResNet-34 in the shared spec: its shapes and counts, the PyTorch, Keras
and LBANN builders against it, the same function in PyTorch and Keras, and
a real (tiny) training run."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import REPO, needs_environment, tiny_design
from ddlcompare.plan import design
from ddlcompare.plan import envs
from ddlcompare.run import runner
from frameworks import data, model_gate, models
from frameworks import lbann_family as lbann_builder
from frameworks.torch_family import build_model

DATASETS = ["fashion-mnist", "cifar10"]


def totals(rows):
    return sum(r["params"] for r in rows), sum(r["running_stats"] for r in rows)


def test_spec_counts_and_stage_shapes():
    # 21,282,122: the usual count of the CIFAR-10 ResNet-34; one input
    # channel instead of three takes 2 x 64 x 3 x 3 = 1152 off the stem.
    cifar = models.layer_shapes(models.RESNET34, (3, 32, 32), 10)
    fashion = models.layer_shapes(models.RESNET34, (1, 28, 28), 10)
    assert totals(cifar) == (21_282_122, 17_024)  # BN: 2 x (64 + 3 x 2 x 64 + ...)
    assert totals(fashion) == (21_282_122 - 1152, 17_024)
    for rows, sides in ((cifar, (32, 16, 8, 4)), (fashion, (28, 14, 7, 4))):
        by_name = {r["name"]: r for r in rows}
        for stage, (side, filters) in enumerate(zip(sides, (64, 128, 256, 512)), start=1):
            assert by_name[f"stage{stage}_block1_add"]["shape"] == (filters, side, side)
        assert by_name["pool"]["shape"] == (512,) and by_name["logits"]["shape"] == (10,)
    conv = [r for r in cifar if r["type"] == "conv2d"]
    assert len(conv) == 1 + 2 * (3 + 4 + 6 + 3) + 3  # stem, two per block, 3 projections
    assert sum(r["type"] == "batchnorm" for r in cifar) == len(conv)


def test_only_shape_changing_blocks_have_projection_shortcuts():
    nodes = {n["name"]: n for n in models.graph(models.RESNET34)}
    shortcuts = sorted(n for n in nodes if n.endswith("_shortcut_conv"))
    assert shortcuts == [f"stage{s}_block1_shortcut_conv" for s in (2, 3, 4)]
    assert nodes["stage2_block1_shortcut_conv"]["kernel"] == 1
    assert nodes["stage2_block1_shortcut_conv"]["stride"] == 2
    assert nodes["stage1_block1_add"]["inputs"] == ["stage1_block1_2_bn", "stem_relu"]
    assert nodes["stage2_block1_add"]["inputs"] == [
        "stage2_block1_2_bn",
        "stage2_block1_shortcut_bn",
    ]
    assert not any(n.get("bias") for n in nodes.values() if n["type"] == "conv2d")


@pytest.mark.parametrize("dataset", DATASETS)
def test_torch_builder_matches_spec(dataset):
    info = data.DATASETS[dataset]
    reference = model_gate.reference_rows("resnet34", dataset)
    rows, _ = model_gate.builder_rows("pytorch", "resnet34", dataset)
    assert model_gate.compare(reference, rows) == []
    model = build_model(models.RESNET34, info)
    assert sum(p.numel() for p in model.parameters()) == totals(reference)[0]
    bn = torch.nn.BatchNorm2d
    assert all(m.eps == 1e-5 and m.momentum == 0.1 for m in model.modules() if isinstance(m, bn))
    assert tuple(model(torch.zeros(2, *info.shape)).shape) == (2, info.classes)


@pytest.mark.parametrize("dataset", DATASETS)
def test_lbann_graph_matches_spec(dataset):
    info = data.DATASETS[dataset]
    rows, checked_on = model_gate.builder_rows("lbann", "resnet34", dataset)
    assert model_gate.compare(model_gate.reference_rows("resnet34", dataset), rows) == []
    graph = {n["name"]: n for n in lbann_builder.layer_graph(models.RESNET34, info)}
    assert graph["stage2_block1_add"] == {
        "name": "stage2_block1_add",
        "layer": "Sum",
        "parents": ["stage2_block1_2_bn", "stage2_block1_shortcut_bn"],
    }
    bn = graph["stem_bn"]
    assert (bn["decay"], bn["epsilon"], bn["statistics_group_size"]) == (0.9, 1e-5, 1)
    assert bn["no_bessel_correction"]  # divides by n, as PyTorch and Keras do
    assert bn["weights"] == ["ones", "zeros"] and not graph["stem_conv"]["has_bias"]
    assert graph["pool"]["layer"] == "ChannelwiseMean"


def test_gate_catches_a_missing_shortcut_and_running_statistics():
    reference = model_gate.reference_rows("resnet34", "cifar10")
    no_shortcut = [r for r in reference if not r["name"].startswith("stage3_block1_shortcut")]
    problems = model_gate.compare(reference, no_shortcut)
    assert (
        "layer stage3_block1_shortcut_conv: expected ('conv2d', (256, 8, 8), 32768, 0), "
        "built nothing" in problems
    )
    no_stats = [{**r, "running_stats": 0} for r in reference]
    assert "0 BN running statistics built, 17024 in the spec" in model_gate.compare(
        reference, no_stats
    )


# Runs in the TensorFlow environment: the Keras model with the PyTorch
# model's weights, in evaluation and in training mode.
KERAS_SIDE = """
import sys
import numpy as np
from frameworks import data, keras_models, models
folder = sys.argv[1]
weights, x = np.load(folder + "/weights.npz"), np.load(folder + "/x.npy")
model = keras_models.build(models.RESNET34, data.FASHION_MNIST, seed=0)
for layer in model.layers:
    if layer.weights:
        layer.set_weights([weights[f"{layer.name}/{i}"] for i in range(len(layer.weights))])
np.save(folder + "/eval.npy", model(x, training=False).numpy())
np.save(folder + "/train.npy", model(x, training=True).numpy())
np.save(folder + "/moving_var.npy", model.get_layer("stage4_block3_2_bn").moving_variance.numpy())
"""


def keras_weights(model) -> dict:
    """A GraphNet's weights in Keras' layouts (HWIO kernels, (in, out) dense)."""
    out = {}
    for name, module in model.layers.items():
        if isinstance(module, torch.nn.Conv2d):
            arrays = [module.weight.permute(2, 3, 1, 0)]
        elif isinstance(module, torch.nn.BatchNorm2d):
            arrays = [module.weight, module.bias, module.running_mean, module.running_var]
        elif isinstance(module, torch.nn.Linear):
            arrays = [module.weight.T, module.bias]
        else:
            continue
        out.update({f"{name}/{i}": a.detach().numpy().copy() for i, a in enumerate(arrays)})
    return out


@needs_environment("tensorflow", "tensorflow")
def test_torch_and_keras_compute_the_same_function(tmp_path):
    """Same weights in, same logits out: same connections, same padding
    (symmetric at stride 2), same BN epsilon, momentum and statistics."""
    torch.manual_seed(0)
    model = build_model(models.RESNET34, data.FASHION_MNIST)
    with torch.no_grad():  # BN away from its initial identity, so that it counts
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    x = torch.randn(4, 1, 28, 28)
    np.savez(tmp_path / "weights.npz", **keras_weights(model))
    np.save(tmp_path / "x.npy", x.permute(0, 2, 3, 1).numpy())
    with torch.no_grad():
        logits_eval = model.eval()(x).numpy()
        logits_train = model.train()(x).numpy()
    moving_var = model.layers["stage4_block3_2_bn"].running_var.numpy()
    done = subprocess.run(
        [str(envs.python_for("tensorflow")), "-c", KERAS_SIDE, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "eval.npy"), logits_eval, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.load(tmp_path / "train.npy"), logits_train, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.load(tmp_path / "moving_var.npy"), moving_var, rtol=1e-5)


@pytest.mark.slow
def test_resnet34_trains_in_a_real_run(tmp_path):
    doc = tiny_design(
        ["torch-ddp"],
        procs=(1,),
        model="resnet34",
        epochs=1,
        max_steps=3,
        train_images=200,
        test_images=64,
        warmup_steps=1,
    )
    doc["factors"]["batch_size"] = [16]
    row = design.parse(doc, "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    config = json.loads((folder / "config.json").read_text())
    assert config["model"] == "resnet34"
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert len(epochs) == 1 and np.isfinite(epochs["train_loss"][0])
    assert epochs["measured_images"][0] == (3 - 1) * 16
    metrics = json.loads((folder / "metrics.json").read_text())
    assert 0 <= metrics["final_test_accuracy"] <= 1


def test_model_is_a_factor_like_any_other():
    doc = tiny_design(["torch-ddp"], procs=(1,))
    doc["factors"]["model"] = ["cnn", "resnet34"]
    runs = design.parse(doc, "tiny.yaml").runs()
    assert sorted(r.config["model"] for r in runs) == ["cnn", "resnet34"]
    assert all("model" in r.factors for r in runs)


def test_the_builder_module_imports_without_torch():
    # The registry imports every module of frameworks/, TensorFlow's env included.
    check = (
        "import sys, frameworks.torch_graph, frameworks.registry; assert 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
