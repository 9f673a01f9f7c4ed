"""The shared architecture specifications, framework-neutral: the CNN and
ResNet-34 (``MODELS``, by the design's ``model`` level).

The builders (PyTorch: torch_family.py and torch_graph.py; Keras:
keras_models.py; LBANN: lbann_family.py) read these specifications and nothing
else, so that every framework trains the same network: same layers, shapes,
initialisers, loss, optimizer and learning-rate rule; the same-model gate
(model_gate.py) checks each builder against ``layer_shapes``.
"""

from __future__ import annotations

import math
from typing import Any

from runfiles.run_config import RunConfig

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

# ResNet-34 (He et al. 2016, basic blocks [3, 4, 6, 3]) adapted to 28x28 and
# 32x32 inputs the CIFAR way: a 3x3 stride-1 stem and no max-pool, so the four
# stages see 28/14/7/4 (32/16/8/4) pixels. Expanded into named nodes by
# ``graph``; every builder walks those nodes, so all frameworks build the
# same graph, layer for layer.
RESNET34 = {
    "name": "resnet34",
    "stem": {"filters": 64, "kernel": 3, "stride": 1},
    # Stride 2 at the first block of stages 2-4; where a block changes the
    # shape, its shortcut is a 1x1 stride-2 conv + BN (projection).
    "stages": [
        {"filters": 64, "blocks": 3},
        {"filters": 128, "blocks": 4},
        {"filters": 256, "blocks": 6},
        {"filters": 512, "blocks": 3},
    ],
    # Convs have no bias (BN follows each) and pad kernel // 2 on EVERY side
    # (symmetric: 28 -> 14 -> 7 -> 4 at stride 2). TensorFlow's 'same' pads
    # stride-2 convs asymmetrically (bottom/right only), so Keras pads
    # explicitly.
    "conv": {"bias": False},
    # new running statistic = (1 - momentum) * old + momentum * batch:
    # PyTorch's momentum; Keras' momentum and LBANN's decay are 1 - momentum.
    # Plain BN: each process normalises with its own mini-batch's statistics
    # (no SyncBatchNorm) and keeps its own running statistics, except where
    # a framework copies rank 0's (DDP's broadcast_buffers, on by default).
    "batchnorm": {"epsilon": 1e-5, "momentum": 0.1},
    # He uniform (fan in) for convs, Glorot uniform for the output layer,
    # zero biases; BN gamma 1, beta 0, running mean 0, running variance 1.
    "init": {
        "conv": "he_uniform",
        "dense": "glorot_uniform",
        "bias": "zeros",
        "bn_gamma": "ones",
        "bn_beta": "zeros",
    },
    "loss": "softmax_cross_entropy",
    "optimizer": {"type": "sgd", "momentum": "from design (momentum)"},
    "lr_rule": "learning_rate * scale(global_batch / lr_base_batch), scale from lr_scaling",
}

# A specification is plain data (JSON-like), read by key.
MODELS: dict[str, dict[str, Any]] = {"cnn": CNN, "resnet34": RESNET34}


def is_sequential(spec: dict) -> bool:
    """A plain stack of layers (the CNN) rather than a graph of named nodes."""
    return "layers" in spec


def graph(spec: dict) -> list[dict]:
    """A residual spec as its nodes, in an order where inputs come first.
    Each node: name, type (conv2d, batchnorm, relu, add, global_avgpool,
    dense), inputs (node names; 'input' is the image) and its settings."""
    nodes: list[dict] = []
    init, bn = spec["init"], spec["batchnorm"]

    def node(name, kind, inputs, **settings):
        nodes.append({"name": name, "type": kind, "inputs": list(inputs), **settings})
        return name

    def conv_bn(name, x, filters, kernel, stride):
        x = node(
            f"{name}_conv",
            "conv2d",
            [x],
            filters=filters,
            kernel=kernel,
            stride=stride,
            padding=kernel // 2,
            bias=spec["conv"]["bias"],
            init=init["conv"],
        )
        return node(f"{name}_bn", "batchnorm", [x], **bn)

    stem = spec["stem"]
    x = conv_bn("stem", "input", stem["filters"], stem["kernel"], stem["stride"])
    x = node("stem_relu", "relu", [x])
    channels = stem["filters"]
    for s, stage in enumerate(spec["stages"], start=1):
        for b in range(1, stage["blocks"] + 1):
            name, filters = f"stage{s}_block{b}", stage["filters"]
            stride = 2 if s > 1 and b == 1 else 1
            y = conv_bn(f"{name}_1", x, filters, 3, stride)
            y = node(f"{name}_1_relu", "relu", [y])
            y = conv_bn(f"{name}_2", y, filters, 3, 1)
            if stride != 1 or channels != filters:
                x = conv_bn(f"{name}_shortcut", x, filters, 1, stride)
            x = node(f"{name}_add", "add", [y, x])
            x = node(f"{name}_relu", "relu", [x])
            channels = filters
    x = node("pool", "global_avgpool", [x])
    node("logits", "dense", [x], units="classes", init=init["dense"], bias_init=init["bias"])
    return nodes


def scaled_learning_rate(config: RunConfig, global_batch: int) -> float:
    """The learning-rate rule shared by every framework."""
    ratio = global_batch / config["lr_base_batch"]
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[config["lr_scaling"]]
    return config["learning_rate"] * scale


def layer_shapes(spec: dict, input_shape: tuple[int, int, int], classes: int) -> list[dict]:
    """Output shape and parameter count of each layer, from the spec alone.

    ``input_shape`` is (channels, height, width). This is the reference the
    builders are checked against (the same-model gate). ``params`` counts
    trainable parameters; ``running_stats`` the BN running means and
    variances (torch buffers, Keras non-trainable weights).
    """
    if not is_sequential(spec):
        return graph_shapes(graph(spec), input_shape, classes)
    c, h, w = input_shape
    flat: int | None = None  # the features after the flatten layer
    rows = []
    for layer in spec["layers"]:
        kind = layer["type"]
        params = 0
        shape: tuple[int, ...]
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
            if flat is None:
                raise ValueError(f"model {spec['name']!r}: a dense layer before the flatten")
            params = flat * units + units
            flat = units
            shape = (units,)
        else:
            raise ValueError(f"unknown layer type {kind!r} in model {spec['name']!r}")
        rows.append({"type": kind, "shape": shape, "params": params, "running_stats": 0})
    return rows


def graph_shapes(nodes: list[dict], input_shape: tuple[int, int, int], classes: int) -> list[dict]:
    """``layer_shapes`` of a graph of nodes (``graph``), one row per node."""
    shapes: dict[str, tuple[int, ...]] = {"input": tuple(input_shape)}
    rows = []
    for n in nodes:
        first = shapes[n["inputs"][0]]
        params = running = 0
        shape: tuple[int, ...]
        if n["type"] == "conv2d":
            c, h, w = first
            k, pad, stride = n["kernel"], n["padding"], n["stride"]
            side = lambda size: (size + 2 * pad - k) // stride + 1  # noqa: E731, B023 (used at once)
            shape = (n["filters"], side(h), side(w))
            params = n["filters"] * c * k * k + n["filters"] * n["bias"]
        elif n["type"] == "batchnorm":
            shape, params, running = first, 2 * first[0], 2 * first[0]
        elif n["type"] == "relu":
            shape = first
        elif n["type"] == "add":
            if any(shapes[i] != first for i in n["inputs"]):
                raise ValueError(
                    f"node {n['name']!r} adds tensors of shapes {[shapes[i] for i in n['inputs']]}"
                )
            shape = first
        elif n["type"] == "global_avgpool":
            shape = (first[0],)
        elif n["type"] == "dense":
            units = classes if n["units"] == "classes" else n["units"]
            shape, params = (units,), math.prod(first) * units + units
        else:
            raise ValueError(f"unknown node type {n['type']!r} ({n['name']!r})")
        shapes[n["name"]] = shape
        rows.append(
            {
                "name": n["name"],
                "type": n["type"],
                "shape": shape,
                "params": params,
                "running_stats": running,
            }
        )
    return rows
