"""The shared architecture specification, framework-neutral.

Builders (PyTorch here, Keras and LBANN later) read these specifications and
nothing else, so that every framework trains the same network: same layers,
shapes, initialisers, loss, optimizer and learning-rate rule.
"""
from __future__ import annotations

import math

# Layers are applied in order. Conv padding is "same", so the two poolings
# take 28x28 to 7x7 and 32x32 to 8x8: one spec fits both data sets.
CNN = {
    "name": "cnn",
    "layers": [
        {"type": "conv2d", "filters": 32, "kernel": 3, "activation": "relu"},
        {"type": "maxpool2d", "size": 2},
        {"type": "conv2d", "filters": 64, "kernel": 3, "activation": "relu"},
        {"type": "maxpool2d", "size": 2},
        {"type": "flatten"},
        {"type": "dense", "units": 128, "activation": "relu"},
        {"type": "dense", "units": "classes"},
    ],
    # He (Kaiming) uniform for weights feeding a ReLU, Glorot uniform for
    # the output layer, zero biases: stated here so every builder matches.
    "init": {"relu": "he_uniform", "linear": "glorot_uniform", "bias": "zeros"},
    "loss": "softmax_cross_entropy",
    "optimizer": {"type": "sgd", "momentum": "from design (momentum)"},
    "lr_rule": "learning_rate * scale(global_batch / lr_base_batch), scale from lr_scaling",
}

MODELS = {"cnn": CNN}


def scaled_learning_rate(config: dict, global_batch: int) -> float:
    """The learning-rate rule shared by every framework."""
    ratio = global_batch / config["lr_base_batch"]
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[config["lr_scaling"]]
    return config["learning_rate"] * scale


def layer_shapes(spec: dict, input_shape: tuple[int, int, int], classes: int) -> list[dict]:
    """Output shape and parameter count of each layer, from the spec alone.

    ``input_shape`` is (channels, height, width). This is the reference the
    builders are checked against (the same-model gate).
    """
    c, h, w = input_shape
    flat = None
    rows = []
    for layer in spec["layers"]:
        kind = layer["type"]
        params = 0
        if kind == "conv2d":
            k = layer["kernel"]
            params = layer["filters"] * c * k * k + layer["filters"]
            c = layer["filters"]
            shape = (c, h, w)
        elif kind == "maxpool2d":
            h, w = h // layer["size"], w // layer["size"]
            shape = (c, h, w)
        elif kind == "flatten":
            flat = c * h * w
            shape = (flat,)
        elif kind == "dense":
            units = classes if layer["units"] == "classes" else layer["units"]
            params = flat * units + units
            flat = units
            shape = (units,)
        else:
            raise ValueError(f"unknown layer type {kind!r} in model {spec['name']!r}")
        rows.append({"type": kind, "shape": shape, "params": params})
    return rows
