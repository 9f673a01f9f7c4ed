"""The shared architecture specification (frameworks/models.py) as a Keras
model, for every TensorFlow adapter.

Same layers, shapes, parameter count and initialisers as the PyTorch
builder: He-uniform weights for layers feeding a ReLU, Glorot-uniform for the
output layer, zero biases, 'same' padding. Keras works in NHWC, the data
arrays are NCHW: ``images`` transposes in the data path, and the flatten
order differs from PyTorch's (a permutation of the first dense layer's
inputs, so the same function class and parameter count).
"""

from __future__ import annotations

import numpy as np

from frameworks import data, models
from runfiles.run_config import RunConfig


def initialiser(name: str, seed: int):
    """A Keras initialiser of the spec's vocabulary, with its own seed: the
    same weights on every rank and under every strategy, whatever ops ran
    before (unseeded Keras initialisers depend on TensorFlow's op counter)."""
    import tensorflow as tf

    kinds = {
        "he_uniform": tf.keras.initializers.HeUniform,
        "glorot_uniform": tf.keras.initializers.GlorotUniform,
    }
    if name == "zeros":
        return tf.keras.initializers.Zeros()
    if name not in kinds:
        raise ValueError(f"the Keras builder has no initialiser {name!r}")
    return kinds[name](seed=seed)


def build(spec: dict, info: data.DatasetInfo, seed: int):
    """The shared specification as a tf.keras.Sequential (a functional
    tf.keras.Model for a graph spec such as ResNet-34), initialised as it says."""
    import tensorflow as tf

    if not models.is_sequential(spec):
        return build_graph(spec, info, seed)
    c, h, w = info.shape
    init = spec["init"]
    layers: list = [tf.keras.Input(shape=(h, w, c))]
    for index, (layer, row) in enumerate(
        zip(spec["layers"], models.layer_shapes(spec, info.shape, info.classes))
    ):
        kind = layer["type"]
        activation = layer.get("activation")
        kernel = initialiser(
            init["relu"] if activation == "relu" else init["linear"], seed * 1000 + index
        )
        bias = initialiser(init["bias"], 0)
        if kind == "conv2d":
            layers.append(
                tf.keras.layers.Conv2D(
                    layer["filters"],
                    layer["kernel"],
                    padding="same",
                    activation=activation,
                    kernel_initializer=kernel,
                    bias_initializer=bias,
                )
            )
        elif kind == "maxpool2d":
            layers.append(tf.keras.layers.MaxPool2D(layer["size"]))
        elif kind == "flatten":
            layers.append(tf.keras.layers.Flatten())
        elif kind == "dense":
            layers.append(
                tf.keras.layers.Dense(
                    row["shape"][0],
                    activation=activation,
                    kernel_initializer=kernel,
                    bias_initializer=bias,
                )
            )
        else:
            raise ValueError(f"unknown layer type {kind!r} in model {spec['name']!r}")
    return tf.keras.Sequential(layers, name=spec["name"])


def build_graph(spec: dict, info: data.DatasetInfo, seed: int):
    """A graph spec (models.graph) as a functional Keras model: one layer per
    node, named as the node, so the layers are the PyTorch builder's."""
    import tensorflow as tf

    c, h, w = info.shape
    inputs = tf.keras.Input(shape=(h, w, c))
    values = {"input": inputs}
    nodes = models.graph(spec)
    for index, node in enumerate(nodes):
        values[node["name"]] = _graph_layer(
            tf, node, [values[n] for n in node["inputs"]], seed * 1000 + index, info.classes
        )
    return tf.keras.Model(inputs, values[nodes[-1]["name"]], name=spec["name"])


def _graph_layer(tf, node: dict, inputs: list, seed: int, classes: int):
    """Apply one node's Keras layer to its inputs."""
    layers, kind, name = tf.keras.layers, node["type"], node["name"]
    x = inputs[0]
    if kind == "conv2d":
        k, pad, stride = node["kernel"], node["padding"], node["stride"]
        padding = "valid"
        if stride == 1 and 2 * pad == k - 1:
            padding = "same"  # symmetric at stride 1: the spec's padding
        elif pad:  # 'same' would pad stride-2 convs on the bottom/right only
            x = layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
        return layers.Conv2D(
            node["filters"],
            k,
            strides=stride,
            padding=padding,
            use_bias=node["bias"],
            name=name,
            kernel_initializer=initialiser(node["init"], seed),
        )(x)
    if kind == "batchnorm":
        return layers.BatchNormalization(
            momentum=1 - node["momentum"], epsilon=node["epsilon"], name=name
        )(x)  # gamma 1, beta 0: Keras' defaults
    if kind == "relu":
        return layers.ReLU(name=name)(x)
    if kind == "add":
        return layers.Add(name=name)(inputs)
    if kind == "global_avgpool":
        return layers.GlobalAveragePooling2D(name=name)(x)
    if kind == "dense":
        units = classes if node["units"] == "classes" else node["units"]
        return layers.Dense(
            units,
            name=name,
            kernel_initializer=initialiser(node["init"], seed),
            bias_initializer=initialiser(node["bias_init"], 0),
        )(x)
    raise ValueError(f"the Keras builder has no node type {kind!r}")


def per_example_loss(spec: dict, reduction: str = "none"):
    """The spec's loss (softmax cross-entropy on logits). Per example by
    default: distribution strategies refuse Keras' implicit batch mean in
    custom loops, so the loops take the mean themselves."""
    import tensorflow as tf

    if spec["loss"] != "softmax_cross_entropy":
        raise ValueError(f"the Keras builder has no loss {spec['loss']!r}")
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)


def optimizer(config: RunConfig, lr: float):
    """SGD with momentum, the spec's optimizer (lr from models.scaled_learning_rate)."""
    import tensorflow as tf

    return tf.keras.optimizers.SGD(learning_rate=lr, momentum=config["momentum"])


def images(x_u8: np.ndarray, info: data.DatasetInfo) -> np.ndarray:
    """NCHW uint8 -> normalised NHWC float32, as the PyTorch loop normalises."""
    mean = np.asarray(info.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(info.std, dtype=np.float32).reshape(1, -1, 1, 1)
    x = (x_u8.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def layer_rows(model) -> list[dict]:
    """Each Keras layer's type, output shape in the spec's (C, H, W) order and
    parameter count: what the same-model gate compares with the spec."""
    kinds = {
        "Conv2D": "conv2d",
        "MaxPooling2D": "maxpool2d",
        "Flatten": "flatten",
        "Dense": "dense",
        "BatchNormalization": "batchnorm",
        "ReLU": "relu",
        "Add": "add",
        "GlobalAveragePooling2D": "global_avgpool",
    }
    rows = []
    for layer in model.layers:
        shape = tuple(layer.output_shape[1:])
        if len(shape) == 3:  # NHWC -> CHW
            shape = (shape[2], shape[0], shape[1])
        # BN's moving mean and variance are Keras' non-trainable weights
        count = lambda weights: sum(int(np.prod(w.shape)) for w in weights)  # noqa: E731
        rows.append(
            {
                "name": layer.name,
                "type": kinds.get(type(layer).__name__, type(layer).__name__),
                "shape": shape,
                "params": count(layer.trainable_weights),
                "running_stats": count(layer.non_trainable_weights),
            }
        )
    return rows
