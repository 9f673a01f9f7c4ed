"""The shared CNN: spec shapes, the PyTorch builder, identical initial weights."""

import pytest
import torch

from frameworks import data, models
from frameworks.torch_family import build_model, params_digest


@pytest.mark.parametrize("name", ["fashion-mnist", "cifar10"])
def test_torch_builder_matches_spec(name):
    info = data.DATASETS[name]
    spec = models.CNN
    expected = models.layer_shapes(spec, info.shape, info.classes)
    model = build_model(spec, info)
    assert sum(p.numel() for p in model.parameters()) == sum(r["params"] for r in expected)
    out = model(torch.zeros(3, *info.shape))
    assert tuple(out.shape) == (3, info.classes)


def test_parameter_counts_by_hand():
    # conv 1->32 3x3: 320; conv 32->64 3x3: 18496; dense 3136->128: 401536; 128->10: 1290
    rows = models.layer_shapes(models.CNN, (1, 28, 28), 10)
    assert sum(r["params"] for r in rows) == 320 + 18496 + 401536 + 1290
    assert rows[4]["shape"] == (3136,)
    assert models.layer_shapes(models.CNN, (3, 32, 32), 10)[4]["shape"] == (4096,)


def test_same_seed_same_weights_other_seed_other_weights():
    info = data.FASHION_MNIST
    digests = []
    for seed in (42, 42, 7):
        torch.manual_seed(seed)
        digests.append(params_digest(build_model(models.CNN, info)))
    assert digests[0] == digests[1] != digests[2]


def test_learning_rate_rule():
    config = {"learning_rate": 0.1, "lr_base_batch": 64, "lr_scaling": "linear"}
    assert models.scaled_learning_rate(config, 256) == pytest.approx(0.4)
    assert models.scaled_learning_rate({**config, "lr_scaling": "sqrt"}, 256) == pytest.approx(0.2)
    assert models.scaled_learning_rate({**config, "lr_scaling": "none"}, 256) == pytest.approx(0.1)
