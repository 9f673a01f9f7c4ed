"""The same-model gate: every framework's builder makes the network of the
shared specification (frameworks/models.py): same weighted and pooling
layers, same output shapes, same parameter counts.

The PyTorch and Keras builders live in different environments, so each is
asked in its own interpreter (``python -m frameworks.model_gate rows
BUILDER MODEL DATASET...`` prints its rows as JSON). The LBANN builder is checked on
the layer graph it produces: read back from a built lbann.Model where LBANN
is importable, otherwise the graph it would hand to LBANN (the result says
which).

    python -m frameworks.model_gate [--out FILE]     # the gate of every model, as JSON
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from frameworks import data, models

BUILDERS = {"pytorch": "torch", "keras": "tensorflow", "lbann": "lbann",
            "tarantella": "tarantella"}
# The builder of each training family: a builder's verdict is that of every
# framework of its family (DataParallel and MirroredStrategy wrap the same model).
FAMILY_BUILDERS = {"torch": "pytorch", "tensorflow": "keras", "lbann": "lbann",
                   "tarantella": "tarantella"}
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
        return (keras_models.layer_rows(keras_models.build(spec, info, seed=0)),
                "Keras layers of frameworks.keras_models.build")
    if builder == "tarantella":  # under Tarantella's launcher (GPI-2 is started)
        import tarantella as tnt
        from frameworks import keras_models
        return (keras_models.layer_rows(tnt.Model(keras_models.build(spec, info, seed=0))),
                "the layers of the tnt.Model (Tarantella) around the Keras model of "
                "frameworks.keras_models.build")
    from frameworks import lbann as lbann_builder
    from frameworks import lbann_source
    lbann, origin = lbann_source.front_end()
    if lbann is None:
        return (lbann_builder.graph_rows(lbann_builder.layer_graph(spec, info), info.shape),
                "the layer graph frameworks.lbann.layer_graph hands to LBANN "
                f"(no lbann.Model was built: {origin})")
    built = lbann_builder.build_model(lbann, spec, info, epochs=1)
    names = frozenset() if models.is_sequential(spec) else frozenset(
        node["name"] for node in models.graph(spec))
    return (lbann_builder.graph_rows(lbann_builder.graph_of_model(built, names), info.shape),
            "the layers of the lbann.Model that frameworks.lbann.build_model builds with "
            + origin)


def _torch_rows(spec: dict, info: data.DatasetInfo) -> list[dict]:
    import torch
    from frameworks.torch_family import build_model
    if not models.is_sequential(spec):
        return _torch_graph_rows(build_model(spec, info), info)
    kinds = {"Conv2d": "conv2d", "MaxPool2d": "maxpool2d", "Flatten": "flatten",
             "Linear": "dense"}
    x = torch.zeros(1, *info.shape)
    rows = []
    with torch.no_grad():
        for module in build_model(spec, info):
            x = module(x)
            kind = kinds.get(type(module).__name__)
            if kind:
                rows.append({"type": kind, "shape": tuple(x.shape[1:]),
                             "params": sum(p.numel() for p in module.parameters())})
    return rows


def _torch_graph_rows(model, info: data.DatasetInfo) -> list[dict]:
    """A GraphNet's rows: each node module's class, output shape, parameters
    and BN running statistics (torch's step counter num_batches_tracked is
    no statistic)."""
    import torch
    kinds = {"Conv2d": "conv2d", "BatchNorm2d": "batchnorm", "ReLU": "relu", "Add": "add",
             "GlobalAvgPool": "global_avgpool", "Linear": "dense"}
    with torch.no_grad():
        outputs = model.eval().outputs(torch.zeros(1, *info.shape))
    return [{"name": name, "type": kinds.get(type(module).__name__, type(module).__name__),
             "shape": tuple(outputs[name].shape[1:]),
             "params": sum(p.numel() for p in module.parameters()),
             "running_stats": sum(b.numel() for n, b in module.named_buffers()
                                  if n != "num_batches_tracked")}
            for name, module in model.layers.items()]


def frameworks_of(builder: str) -> list[str]:
    """The registered frameworks whose model this builder makes."""
    from frameworks import registry
    return sorted(name for name, info in registry.FRAMEWORKS.items()
                  if FAMILY_BUILDERS.get(info.family) == builder)


def _key(row: dict) -> tuple:
    return (row["type"], tuple(row["shape"]), int(row["params"]),
            int(row.get("running_stats", 0)))


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
    problems = [f"layer {i}: expected {w}, built {g}"
                for i, (w, g) in enumerate(zip(want, got)) if w != g]
    if len(want) != len(got):
        problems.append(f"{len(got)} weighted/pooling layers built, {len(want)} in the spec")
    return problems


def _compare_by_name(reference: list[dict], rows: list[dict]) -> list[str]:
    want = {r["name"]: _key(r) for r in reference if r["type"] in COMPARED}
    got = {r.get("name"): _key(r) for r in rows if r["type"] in COMPARED}
    problems = [f"layer {name}: expected {key}, built {got.get(name, 'nothing')}"
                for name, key in want.items() if got.get(name) != key]
    problems += [f"layer {name}: built {key}, not in the spec"
                 for name, key in got.items() if name not in want]
    return problems


def ask(builder: str, model: str, datasets: tuple[str, ...]) -> dict:
    """One builder's answer per data set, from the interpreter of its
    environment (one start-up for all data sets)."""
    from ddlcompare import envs
    from ddlcompare.provenance import REPO
    env = BUILDERS[builder]
    python = envs.python_for(env)
    if not python.exists():
        if builder == "lbann":  # its graph needs no LBANN: check it here
            return {d: dict(zip(("rows", "checked_on"), builder_rows(builder, model, d)))
                    for d in datasets}
        error = {"error": f"environment '{env}' is not built ({envs.env_dir(env)}); "
                          f"{envs.how_to_build(env)}"}
        return {d: error for d in datasets}
    argv, env = [str(python)], None
    if builder == "tarantella":  # one rank, started by Tarantella's launcher
        import os
        from ddlcompare.launch import GPI2_LOCK
        argv = ["flock", str(GPI2_LOCK), str(python.parent / "tarantella"), "-n", "1",
                "--no-gpu", "--"]
        env = {**os.environ, "PATH": f"{REPO / 'envs' / 'local-ssh'}:{python.parent}:"
                                     f"{os.environ.get('PATH', '')}"}
    done = subprocess.run([*argv, "-m", "frameworks.model_gate", "rows", builder, model,
                           *datasets], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=env)
    if done.returncode != 0:
        error = {"error": f"the {builder} builder failed: {done.stderr.strip()[-500:]}"}
        return {d: error for d in datasets}
    return json.loads(done.stdout.strip().splitlines()[-1])


def gate_all(names: tuple[str, ...] = tuple(models.MODELS),
             datasets: tuple[str, ...] = tuple(data.DATASETS)) -> dict:
    """The gate of every model: each model's ``gate`` result under
    ``models``; ``status`` is the worst of theirs (fail, incomplete, pass)."""
    results = {name: gate(name, datasets) for name in names}
    statuses = {r["status"] for r in results.values()}
    status = next(s for s in ("fail", "incomplete", "pass") if s in statuses)
    return {"status": status, "compared": list(COMPARED), "models": results}


def gate(model: str = "cnn", datasets: tuple[str, ...] = tuple(data.DATASETS)) -> dict:
    """The gate's result for one model: per data set, per builder, what was
    checked and what differs; ``status`` is 'pass' only when every builder
    was checked and none differs."""
    result = {"model": model, "compared": list(COMPARED), "datasets": {}}
    status = "pass"
    answers = {builder: ask(builder, model, datasets) for builder in BUILDERS}
    for dataset in datasets:
        reference = reference_rows(model, dataset)
        entry = {"total_params": sum(r["params"] for r in reference),
                 "total_running_stats": sum(r["running_stats"] for r in reference),
                 "builders": {}}
        for builder in BUILDERS:
            answer = answers[builder][dataset]
            if "error" in answer:
                entry["builders"][builder] = {"status": "not checked", "reason": answer["error"]}
                status = "fail" if status == "fail" else "incomplete"
                continue
            problems = compare(reference, answer["rows"])
            entry["builders"][builder] = {
                "status": "fail" if problems else "pass", "problems": problems,
                "total_params": sum(int(r["params"]) for r in answer["rows"]),
                "total_running_stats": sum(int(r.get("running_stats", 0))
                                           for r in answer["rows"]),
                "checked_on": answer["checked_on"], "frameworks": frameworks_of(builder)}
            if problems:
                status = "fail"
        result["datasets"][dataset] = entry
    result["status"] = status
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    rows = sub.add_parser("rows", help="one builder's rows, as JSON (in its environment)")
    rows.add_argument("builder", choices=tuple(BUILDERS))
    rows.add_argument("model")
    rows.add_argument("datasets", nargs="+")
    parser.add_argument("--out", type=Path, help="write the gate's JSON here too")
    args = parser.parse_args(argv)
    if args.command == "rows":
        print(json.dumps({d: dict(zip(("rows", "checked_on"),
                                      builder_rows(args.builder, args.model, d)))
                          for d in args.datasets}))
        return
    result = gate_all()
    text = json.dumps(result, indent=2)
    if args.out:
        from ddlcompare.atomic import write_text
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.out, text + "\n")
    print(text)
    sys.exit(0 if result["status"] != "fail" else 1)


if __name__ == "__main__":
    main()
