"""A graph spec (frameworks/models.py ``graph``: ResNet-34) as a PyTorch
module: one module per node, named as the node, run in the spec's order.

The Keras and LBANN builders walk the same nodes, so the three frameworks
build the same layers with the same connections. The registry imports every
module of frameworks/ in every environment, so torch is imported only when
a network is built (torch_family.build_model dispatches here).
"""

from __future__ import annotations

import functools

from frameworks import data, models


def graph_net(spec: dict, info: data.DatasetInfo):
    """The spec's network as a torch module, initialised as the spec says."""
    return _classes()["GraphNet"](spec, info)


@functools.cache
def _classes() -> dict:
    from torch import nn

    class GraphNet(nn.Module):
        """Runs the nodes in order; each node's output feeds the nodes naming it."""

        def __init__(self, spec: dict, info: data.DatasetInfo):
            super().__init__()
            self.nodes = models.graph(spec)
            shapes = {"input": info.shape}
            shapes.update(
                (row["name"], row["shape"])
                for row in models.graph_shapes(self.nodes, info.shape, info.classes)
            )
            self.layers = nn.ModuleDict(
                {
                    node["name"]: _module(node, shapes[node["inputs"][0]], shapes[node["name"]])
                    for node in self.nodes
                }
            )

        def forward(self, x):
            return self.outputs(x)[self.nodes[-1]["name"]]

        def outputs(self, x) -> dict:
            """Every node's output, by node name (the gate reads their shapes)."""
            values = {"input": x}
            for node in self.nodes:
                values[node["name"]] = self.layers[node["name"]](
                    *(values[name] for name in node["inputs"])
                )
            return values

    class Add(nn.Module):
        def forward(self, *inputs):
            return sum(inputs[1:], inputs[0])

    class GlobalAvgPool(nn.Module):
        """Mean over height and width: (N, C, H, W) -> (N, C)."""

        def forward(self, x):
            return x.mean((2, 3))

    return {"GraphNet": GraphNet, "Add": Add, "GlobalAvgPool": GlobalAvgPool}


def _module(node: dict, in_shape: tuple, out_shape: tuple):
    """The torch module of one node, initialised as the spec says."""
    from torch import nn

    kind = node["type"]
    if kind == "conv2d":
        conv = nn.Conv2d(
            in_shape[0],
            node["filters"],
            node["kernel"],
            stride=node["stride"],
            padding=node["padding"],
            bias=node["bias"],
        )
        _initialise(conv.weight, node["init"])
        return conv
    if kind == "batchnorm":  # gamma 1, beta 0, mean 0, var 1: torch's defaults
        return nn.BatchNorm2d(in_shape[0], eps=node["epsilon"], momentum=node["momentum"])
    if kind == "relu":
        return nn.ReLU()
    if kind == "add":
        return _classes()["Add"]()
    if kind == "global_avgpool":
        return _classes()["GlobalAvgPool"]()
    if kind == "dense":
        linear = nn.Linear(in_shape[0], out_shape[0])
        _initialise(linear.weight, node["init"])
        _initialise(linear.bias, node["bias_init"])
        return linear
    raise ValueError(f"the PyTorch builder has no node type {kind!r}")


def _initialise(tensor, name: str) -> None:
    from torch import nn

    if name == "he_uniform":  # bound sqrt(6 / fan_in), as Keras' HeUniform
        nn.init.kaiming_uniform_(tensor, nonlinearity="relu")
    elif name == "glorot_uniform":
        nn.init.xavier_uniform_(tensor)
    elif name == "zeros":
        nn.init.zeros_(tensor)
    else:
        raise ValueError(f"the PyTorch builder has no initialiser {name!r}")
