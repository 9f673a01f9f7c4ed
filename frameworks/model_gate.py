"""The same-model gate: every framework's builder makes the network of the
shared specification (frameworks/models.py): same weighted and pooling
layers, same output shapes, same parameter counts.

The PyTorch and Keras builders live in different environments, so each is
asked in its own interpreter (``python -m frameworks.model_gate rows
BUILDER MODEL DATASET...`` prints its rows as JSON); the harness asks them
all and judges (ddlcompare/run/model_gate.py). The LBANN builder is checked on
the layer graph it produces: read back from a built lbann.Model where LBANN
is importable, otherwise the graph it would hand to LBANN (the result says
which).
"""

from __future__ import annotations

import argparse
import json

from frameworks import data, models

BUILDERS = {"pytorch": "torch", "keras": "tensorflow", "lbann": "lbann", "tarantella": "tarantella"}
# Flatten is a layer in PyTorch and Keras, implicit in LBANN's FullyConnected:
# the parameter count of the first dense layer checks it. ReLUs carry no
# weights and change no shape.
COMPARED = ("conv2d", "maxpool2d", "dense", "batchnorm", "add", "global_avgpool")


def reference_rows(model: str, dataset: str) -> list[dict]:
    info = data.DATASETS[dataset]
    return models.layer_shapes(models.MODELS[model], info.shape, info.classes)


def builder_rows(builder: str, model: str, dataset: str) -> tuple[list[dict], str]:
    """(rows, what was checked) of one builder, in this interpreter."""
    spec, info = models.MODELS[model], data.DATASETS[dataset]
    if builder == "pytorch":
        return _torch_rows(spec, info), "torch.nn modules of frameworks.torch_family.build_model"
    if builder == "keras":
        from frameworks import keras_models

        return (
            keras_models.layer_rows(keras_models.build(spec, info, seed=0)),
            "Keras layers of frameworks.keras_models.build",
        )
    if builder == "tarantella":  # under Tarantella's launcher (GPI-2 is started)
        import tarantella as tnt
        from frameworks import keras_models

        return (
            keras_models.layer_rows(tnt.Model(keras_models.build(spec, info, seed=0))),
            "the layers of the tnt.Model (Tarantella) around the Keras model of "
            "frameworks.keras_models.build",
        )
    from frameworks import lbann_family as lbann_builder
    from frameworks import lbann_source

    lbann, origin = lbann_source.front_end()
    if lbann is None:
        return (
            lbann_builder.graph_rows(lbann_builder.layer_graph(spec, info), info.shape),
            "the layer graph frameworks.lbann_family.layer_graph hands to LBANN "
            f"(no lbann.Model was built: {origin})",
        )
    built = lbann_builder.build_model(lbann, spec, info, epochs=1)
    names = (
        frozenset()
        if models.is_sequential(spec)
        else frozenset(node["name"] for node in models.graph(spec))
    )
    return (
        lbann_builder.graph_rows(lbann_builder.graph_of_model(built, names), info.shape),
        "the layers of the lbann.Model that frameworks.lbann_family.build_model builds with "
        + origin,
    )


def _torch_rows(spec: dict, info: data.DatasetInfo) -> list[dict]:
    import torch
    from frameworks.torch_family import build_model

    if not models.is_sequential(spec):
        return _torch_graph_rows(build_model(spec, info), info)
    kinds = {"Conv2d": "conv2d", "MaxPool2d": "maxpool2d", "Flatten": "flatten", "Linear": "dense"}
    x = torch.zeros(1, *info.shape)
    rows = []
    with torch.no_grad():
        for module in build_model(spec, info):
            x = module(x)
            kind = kinds.get(type(module).__name__)
            if kind:
                rows.append(
                    {
                        "type": kind,
                        "shape": tuple(x.shape[1:]),
                        "params": sum(p.numel() for p in module.parameters()),
                    }
                )
    return rows


def _torch_graph_rows(model, info: data.DatasetInfo) -> list[dict]:
    """A GraphNet's rows: each node module's class, output shape, parameters
    and BN running statistics (torch's step counter num_batches_tracked is
    no statistic)."""
    import torch

    kinds = {
        "Conv2d": "conv2d",
        "BatchNorm2d": "batchnorm",
        "ReLU": "relu",
        "Add": "add",
        "GlobalAvgPool": "global_avgpool",
        "Linear": "dense",
    }
    with torch.no_grad():
        outputs = model.eval().outputs(torch.zeros(1, *info.shape))
    return [
        {
            "name": name,
            "type": kinds.get(type(module).__name__, type(module).__name__),
            "shape": tuple(outputs[name].shape[1:]),
            "params": sum(p.numel() for p in module.parameters()),
            "running_stats": sum(
                b.numel() for n, b in module.named_buffers() if n != "num_batches_tracked"
            ),
        }
        for name, module in model.layers.items()
    ]


def frameworks_of(builder: str) -> list[str]:
    """The registered frameworks whose model this builder makes: a builder's
    verdict is that of every framework of its family (DataParallel and
    MirroredStrategy wrap the same model), save those that name their own
    builder (AdapterInfo.gate_builder, else the family's)."""
    from frameworks import registry

    return sorted(
        name for name, info in registry.FRAMEWORKS.items() if info.gate_builder == builder
    )


def _key(row: dict) -> tuple:
    return (row["type"], tuple(row["shape"]), int(row["params"]), int(row.get("running_stats", 0)))


def compare(reference: list[dict], rows: list[dict]) -> list[str]:
    """What differs from the reference, in words (empty: the same model).
    Layers are matched by position, or by node name where the spec names
    its nodes (a graph: frameworks may list its layers in another order)."""
    if reference and "name" in reference[0]:
        problems = _compare_by_name(reference, rows)
    else:
        problems = _compare_in_order(reference, rows)
    for field, words in (("params", "parameters"), ("running_stats", "BN running statistics")):
        total_want = sum(int(r.get(field, 0)) for r in reference)
        total_got = sum(int(r.get(field, 0)) for r in rows)
        if total_want != total_got:
            problems.append(f"{total_got} {words} built, {total_want} in the spec")
    return problems


def _compare_in_order(reference: list[dict], rows: list[dict]) -> list[str]:
    want = [_key(r) for r in reference if r["type"] in COMPARED]
    got = [_key(r) for r in rows if r["type"] in COMPARED]
    problems = [
        f"layer {i}: expected {w}, built {g}" for i, (w, g) in enumerate(zip(want, got)) if w != g
    ]
    if len(want) != len(got):
        problems.append(f"{len(got)} weighted/pooling layers built, {len(want)} in the spec")
    return problems


def _compare_by_name(reference: list[dict], rows: list[dict]) -> list[str]:
    want = {r["name"]: _key(r) for r in reference if r["type"] in COMPARED}
    got = {r.get("name"): _key(r) for r in rows if r["type"] in COMPARED}
    problems = [
        f"layer {name}: expected {key}, built {got.get(name, 'nothing')}"
        for name, key in want.items()
        if got.get(name) != key
    ]
    problems += [
        f"layer {name}: built {key}, not in the spec"
        for name, key in got.items()
        if name not in want
    ]
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rows = sub.add_parser("rows", help="one builder's rows, as JSON (in its environment)")
    rows.add_argument("builder", choices=tuple(BUILDERS))
    rows.add_argument("model")
    rows.add_argument("datasets", nargs="+")
    args = parser.parse_args(argv)
    print(
        json.dumps(
            {
                d: dict(zip(("rows", "checked_on"), builder_rows(args.builder, args.model, d)))
                for d in args.datasets
            }
        )
    )


if __name__ == "__main__":
    main()
