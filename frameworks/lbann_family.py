"""LBANN's family (its adapter: frameworks/adapters/lbann.py): a driver that
builds the shared CNN with LBANN's Python front end, writes the data in the
files LBANN's readers take, runs the experiment with ``lbann.run``
(scheduler 'slurm', or 'openmpi': locally and on OAR, with the OAR node
file as hostfile) and turns LBANN's output into the common tables.

LBANN owns its processes and its training loop: the harness starts one
driver process (launcher 'lbann-driver') and LBANN's launcher starts the
ranks. Its environment comes from envs/build-lbann.sh (or Spack on a
cluster, envs/lbann.md). Each rank's per-step phases come from LBANN's
timeline callback (frameworks/lbann_timeline.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import time
from collections.abc import Mapping, MutableMapping
from typing import Any
from pathlib import Path

import numpy as np

from runfiles import names, variables
from runfiles.atomic import write_bytes
from runfiles.names import METRICS
from frameworks import common, data, knobs, lbann_timeline, models
from frameworks.common import Dist
from frameworks.otf2_writer import Otf2Sink
from frameworks.recorder import PhaseRecorder
from runfiles.run_config import RunConfig

HOW_TO_BUILD = (
    "build LBANN with envs/build-lbann.sh (CPU, LBANN's CMake SuperBuild) or "
    "Spack as envs/lbann.md says, and point DDLC_VENV_LBANN at its environment"
)


def import_lbann():
    """LBANN's front end, with the executable it launches."""
    import shutil

    try:
        import lbann
    except ImportError as exc:
        raise common.RunError(
            f"lbann: LBANN's Python front end is not importable in this "
            f"environment ({exc}); {HOW_TO_BUILD}"
        ) from None
    if shutil.which(lbann.lbann_exe()) is None:
        raise common.RunError(
            f"lbann: the front end is there but not the executable "
            f"{lbann.lbann_exe()!r} it launches; {HOW_TO_BUILD}"
        )
    return lbann


# --- the shared CNN as an LBANN layer graph --------------------------------


def layer_graph(spec: dict, info: data.DatasetInfo) -> list[dict]:
    """The spec as the LBANN layers the builder creates, in order, with the
    arguments it gives them. LBANN's FullyConnected flattens its input, so
    the spec's flatten needs no layer of its own."""
    if not models.is_sequential(spec):
        return residual_graph(spec, info)
    init = spec["init"]
    graph = []
    for layer in spec["layers"]:
        kind = layer["type"]
        relu = layer.get("activation") == "relu"
        weights = [init["relu"] if relu else init["linear"], init["bias"]]
        if kind == "conv2d":
            graph.append(
                {
                    "layer": "Convolution",
                    "num_dims": 2,
                    "out_channels": layer["filters"],
                    "kernel_size": layer["kernel"],
                    "stride": 1,
                    "padding": layer["kernel"] // 2,
                    "has_bias": True,
                    "weights": weights,
                }
            )
        elif kind == "maxpool2d":
            graph.append(
                {
                    "layer": "Pooling",
                    "num_dims": 2,
                    "pool_dims_i": layer["size"],
                    "pool_strides_i": layer["size"],
                    "pool_mode": "max",
                }
            )
        elif kind == "dense":
            units = info.classes if layer["units"] == "classes" else layer["units"]
            graph.append(
                {
                    "layer": "FullyConnected",
                    "num_neurons": units,
                    "has_bias": True,
                    "weights": weights,
                }
            )
        elif kind != "flatten":
            raise ValueError(f"the LBANN builder has no layer type {kind!r}")
        if relu:
            graph.append({"layer": "Relu"})
    return graph


def residual_graph(spec: dict, info: data.DatasetInfo) -> list[dict]:
    """A graph spec (models.graph: ResNet-34) as LBANN layers, each named as
    its node, with its parents by name ('input': the images)."""
    graph = []
    for node in models.graph(spec):
        kind = node["type"]
        layer = {"name": node["name"], "parents": node["inputs"]}
        if kind == "conv2d":
            layer.update(
                layer="Convolution",
                num_dims=2,
                out_channels=node["filters"],
                kernel_size=node["kernel"],
                stride=node["stride"],
                padding=node["padding"],
                has_bias=node["bias"],
                weights=[node["init"]],
            )
        elif kind == "batchnorm":  # LBANN's decay is 1 - the spec's momentum;
            # without no_bessel_correction LBANN divides by n - 1 (PyTorch and
            # Keras by n) and ResNet-34 would not be the same model.
            layer.update(
                layer="BatchNormalization",
                decay=1 - node["momentum"],
                epsilon=node["epsilon"],
                statistics_group_size=1,
                no_bessel_correction=True,
                weights=[spec["init"]["bn_gamma"], spec["init"]["bn_beta"]],
            )
        elif kind == "relu":
            layer.update(layer="Relu")
        elif kind == "add":
            layer.update(layer="Sum")
        elif kind == "global_avgpool":
            layer.update(layer="ChannelwiseMean")
        elif kind == "dense":
            units = info.classes if node["units"] == "classes" else node["units"]
            layer.update(
                layer="FullyConnected",
                num_neurons=units,
                has_bias=True,
                weights=[node["init"], node["bias_init"]],
            )
        else:
            raise ValueError(f"the LBANN builder has no node type {kind!r}")
        graph.append(layer)
    return graph


def graph_rows(graph: list[dict], input_shape: tuple[int, int, int]) -> list[dict]:
    """Output shape (C, H, W or units), parameter count and BN running
    statistics of each weighted or shape-changing layer of an LBANN layer
    graph, computed the way LBANN does. A layer's input is its named
    parents' output, else the previous layer's."""
    outputs = {"input": tuple(input_shape)}
    shape = outputs["input"]
    rows = []
    for node in graph:
        if node.get("parents"):
            shape = outputs[node["parents"][0]]
        row = _graph_row(node, shape, [outputs[p] for p in node.get("parents", [])])
        if row is not None:
            shape = row["shape"]
            rows.append({"name": node["name"], **row} if "name" in node else row)
        if "name" in node:
            outputs[node["name"]] = shape
    return rows


def _graph_row(node: dict, shape: tuple, parent_shapes: list[tuple]) -> dict | None:
    kind = node["layer"]
    params = running = 0
    if kind == "Convolution":
        c, h, w = shape
        k, pad, stride = node["kernel_size"], node["padding"], node["stride"]
        out = lambda n: (n + 2 * pad - k) // stride + 1  # noqa: E731
        shape = (node["out_channels"], out(h), out(w))
        params = node["out_channels"] * c * k * k + node["out_channels"] * node["has_bias"]
        kind = "conv2d"
    elif kind == "Pooling":
        c, h, w = shape
        size, stride = node["pool_dims_i"], node["pool_strides_i"]
        shape = (c, (h - size) // stride + 1, (w - size) // stride + 1)
        kind = "maxpool2d"
    elif kind == "FullyConnected":
        inputs = math.prod(shape)
        shape = (node["num_neurons"],)
        params = inputs * node["num_neurons"] + node["num_neurons"] * node["has_bias"]
        kind = "dense"
    elif kind == "BatchNormalization":  # scale and bias; running mean and variance
        params = running = 2 * shape[0]
        kind = "batchnorm"
    elif kind == "Sum":
        if any(p != shape for p in parent_shapes):
            raise ValueError(f"LBANN layer {node.get('name')!r} sums shapes {parent_shapes}")
        kind = "add"
    elif kind == "ChannelwiseMean":
        shape, kind = (shape[0],), "global_avgpool"
    else:
        return None
    return {"type": kind, "shape": shape, "params": params, "running_stats": running}


INITIALISERS = {"he_uniform": "HeUniformInitializer", "glorot_uniform": "GlorotUniformInitializer"}
CONSTANTS = {"zeros": 0.0, "ones": 1.0}


def build_model(
    lbann,
    spec: dict,
    info: data.DatasetInfo,
    epochs: int,
    warmup_steps: int = 0,
    timeline_dir: Path | None = None,
):
    """The LBANN model of the shared spec: its layer graph, softmax
    cross-entropy, and accuracy as the metric named 'accuracy' (in %). The
    timer leaves the first ``warmup_steps`` training steps out of its
    mini-batch statistics (epoch run times still include them). With
    ``timeline_dir``, every rank writes its steps' phases there
    (frameworks/lbann_timeline.py)."""
    samples_name, labels_name = lbann_timeline.INPUT_LAYERS
    images = lbann.Input(data_field="samples", name=samples_name)
    labels = lbann.Input(data_field="labels", name=labels_name)
    x = images
    built = {"input": images}
    for index, node in enumerate(layer_graph(spec, info)):
        args = {k: v for k, v in node.items() if k not in ("layer", "weights", "parents")}
        if "weights" in node:
            parts = (
                ("scale", "bias") if node["layer"] == "BatchNormalization" else ("kernel", "bias")
            )
            args["weights"] = [
                _weights(lbann, name, f"w{index}_{part}")
                for name, part in zip(node["weights"], parts)
            ]
        parents = [built[p] for p in node["parents"]] if "parents" in node else [x]
        x = getattr(lbann, node["layer"])(*parents, **args)
        if "name" in node:
            built[node["name"]] = x
    # Cross-entropy as -sum(labels * log_softmax(logits)), as PyTorch fuses
    # it: its gradient is softmax - labels, finite whatever the logits.
    # LBANN's CrossEntropy layer takes -log of Softmax probabilities, with
    # gradient -labels / p: where a diverging step drives p to 0 in float32,
    # the loss is inf and the weights NaN from the next step on.
    log_probs = lbann.LogSoftmax(x)
    loss = lbann.Negative(lbann.Reduction(lbann.Multiply(log_probs, labels), mode="sum"))
    # The accuracy takes the log-probabilities (same argmax), not a Softmax
    # beside LogSoftmax: LBANN would run both in place on the logits' one
    # buffer, and LogSoftmax's backward would read Softmax's output
    # (Layer::setup_pointers checks a layer's parents, not its siblings).
    accuracy = lbann.CategoricalAccuracy(log_probs, labels)
    callbacks = [lbann.CallbackPrint(), lbann.CallbackTimer(skip_steps=warmup_steps)]
    if timeline_dir is not None:
        callbacks.append(lbann.CallbackTimeline(directory=str(timeline_dir)))
    return lbann.Model(
        epochs,
        layers=lbann.traverse_layer_graph([images, labels]),
        objective_function=loss,
        metrics=[lbann.Metric(accuracy, name="accuracy", unit="%")],
        callbacks=callbacks,
    )


VERSION_LINE = re.compile(r"LLNL LBANN version: (?P<version>\S+)(?: \((?P<git>[^)]+)\))?")


def lbann_version(output: str) -> str:
    """LBANN's Python front end has no __version__ and the executable no
    --version: every run prints 'Running: LLNL LBANN version: 0.105.0
    (<git describe>)' first (src/utils/lbann_library.cpp)."""
    found = VERSION_LINE.search(output)
    if not found:
        return "unknown (no version line in LBANN's output)"
    return found["version"] + (f" ({found['git']})" if found["git"] else "")


def _weights(lbann, name: str, label: str):
    if name in CONSTANTS:
        return lbann.Weights(
            initializer=lbann.ConstantInitializer(value=CONSTANTS[name]), name=label
        )
    return lbann.Weights(initializer=getattr(lbann, INITIALISERS[name])(), name=label)


def graph_of_model(model, names: frozenset = frozenset()) -> list[dict]:
    """The layer graph read back from a built lbann.Model's layer objects
    (what the same-model gate checks when LBANN is importable); ``names``:
    the spec's node names, for a graph spec."""
    fields = (
        "num_dims",
        "out_channels",
        "kernel_size",
        "stride",
        "padding",
        "has_bias",
        "pool_dims_i",
        "pool_strides_i",
        "pool_mode",
        "num_neurons",
        "decay",
        "epsilon",
        "statistics_group_size",
        "no_bessel_correction",
    )
    graph = []
    for layer in model.layers:
        kind = type(layer).__name__
        if kind not in (
            "Convolution",
            "Pooling",
            "FullyConnected",
            "Relu",
            "BatchNormalization",
            "Sum",
            "ChannelwiseMean",
        ):
            continue
        node: dict[str, Any] = {"layer": kind}
        if layer.name in names:  # a graph spec's layer: keep its name and parents
            node["name"] = layer.name
            node["parents"] = [p.name if p.name in names else "input" for p in layer.parents]
        for name in fields:
            value = getattr(layer, name, None)
            if value is not None:
                node[name] = value[0] if isinstance(value, (list, tuple)) else value
        graph.append(node)
    return graph


# --- data in the files LBANN's readers take --------------------------------

# Bumped when the files' contents change (v2: CIFAR-10 stored transposed;
# v3: each CIFAR-10 file filled to LBANN's fixed size), so that a cache
# written by an older version is not reused.
DATA_FILES_VERSION = "v3"
LBANN_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "fashion-mnist": {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    },
    "cifar10": {
        "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        "test": ("test_batch.bin",),
    },
}
# LBANN's cifar10 reader reads exactly this many images from each file
# (readers/data_reader_cifar10.cpp, images_per_file), as in CIFAR-10 itself.
CIFAR_FILE_IMAGES = 10000


def write_idx(path: Path, array: np.ndarray) -> None:
    """An uncompressed IDX file of unsigned bytes (LBANN's mnist reader)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    write_bytes(path, header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_cifar_bin(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """CIFAR-10's binary batch format (LBANN's cifar10 reader): per image,
    the label byte then 3072 bytes, the red, green and blue planes."""
    records = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(len(x), -1)], axis=1)
    write_bytes(path, records.tobytes())


def cifar_files(x: np.ndarray, y: np.ndarray, files: int):
    """(images, labels) of each of ``files`` files of CIFAR_FILE_IMAGES. A
    set smaller than CIFAR-10 (a generated one) is repeated in order to fill
    them; the readers then take only the first images of the test file, and
    as many training images as the run trains on."""
    index = np.resize(np.arange(len(x)), files * CIFAR_FILE_IMAGES)
    for part in np.split(index, files):
        yield transposed(x[part]), y[part]


def data_folder(dataset: data.Dataset) -> Path:
    """Where the data set's LBANN files are kept: named by a digest of the
    arrays, so that another set of the same name (a generated CIFAR-10, or
    the real one after it) gets files of its own."""
    digest = hashlib.sha1()
    for array in (dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y):
        digest.update(np.ascontiguousarray(array).data)
    name = f"{dataset.info.name}-{DATA_FILES_VERSION}-{digest.hexdigest()[:12]}"
    return variables.cache("lbann-data", name)


def write_data_files(dataset: data.Dataset, folder: Path) -> Path:
    """The verified arrays, in LBANN's files: LBANN trains on the same
    images as every other framework (in its own order). CIFAR-10's are
    stored transposed (see transposed)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = LBANN_FILES[dataset.info.name]
    if all((folder / f).exists() for part in files.values() for f in part):
        return folder
    if dataset.info.name == "fashion-mnist":
        for part, (x, y) in {
            "train": (dataset.train_x, dataset.train_y),
            "test": (dataset.test_x, dataset.test_y),
        }.items():
            images, labels = files[part]
            write_idx(folder / images, x[:, 0])
            write_idx(folder / labels, y)
    else:
        for part, (x, y) in {
            "train": (dataset.train_x, dataset.train_y),
            "test": (dataset.test_x, dataset.test_y),
        }.items():
            for name, (images, labels) in zip(files[part], cifar_files(x, y, len(files[part]))):
                write_cifar_bin(folder / name, images, labels)
    return folder


def transposed(images: np.ndarray) -> np.ndarray:
    """Images (N, C, H, W) with height and width swapped. LBANN's
    normalize_to_lbann_layout transform (src/transforms/vision/) writes pixel
    (row, col) to row + col * H, i.e. it hands the model each image
    transposed; written transposed, the images reach the model the right way
    up, as every other framework sees them."""
    return np.ascontiguousarray(images.transpose(0, 1, 3, 2))


def reader_roles(info: data.DatasetInfo) -> tuple[tuple[str, str], ...]:
    """(role, files) of the experiment's readers: 'train' on the training
    files; 'validate' on the TEST files, so that LBANN scores the test set
    after every epoch, where the reader takes that role (mnist does; LBANN's
    cifar10 reader accepts only 'train' and 'test', so CIFAR-10's test set
    is scored once, at the end); 'test' at the end."""
    if info.name == "cifar10":
        return (("train", "train"), ("test", "test"))
    return (("train", "train"), ("validate", "test"), ("test", "test"))


def reader_spec(
    info: data.DatasetInfo, folder: Path, train_samples: int, test_samples: int | None = None
) -> list[dict]:
    """The data readers of the experiment (reader_roles), ``train_samples``
    per epoch and the first ``test_samples`` test images (all if None).
    Inputs are normalised as everywhere: (x / 255 - mean) / std."""
    name = "mnist" if info.name == "fashion-mnist" else "cifar10"
    means = " ".join(f"{m:g}" for m in info.mean)
    stddevs = " ".join(f"{s:g}" for s in info.std)
    if name == "mnist":  # the mnist reader gives raw bytes as floats
        transforms = [
            ("scale", {"scale": 1 / 255}),
            ("normalize", {"means": means, "stddevs": stddevs}),
        ]
    else:  # the cifar10 reader gives images: this transform scales and lays out
        transforms = [("normalize_to_lbann_layout", {"means": means, "stddevs": stddevs})]
    files = LBANN_FILES[info.name]
    readers = []
    for role, part in reader_roles(info):
        reader = {
            "name": name,
            "role": role,
            "shuffle": role == "train",
            "data_filedir": str(folder),
            "transforms": transforms,
        }
        reader.update(_sample_count(train_samples if role == "train" else test_samples))
        if name == "mnist":
            reader["data_filename"], reader["label_filename"] = files[part]
        readers.append(reader)
    return readers


def _sample_count(count: int | None) -> dict:
    """How many samples a reader takes. LBANN refuses a reader where both
    fields are set (exactly one must be zero: data_reader.cpp,
    error_check_counts); unshuffled readers take the first ``count``."""
    if count:
        return {"absolute_sample_count": count, "fraction_of_data_to_use": 0.0}
    return {"absolute_sample_count": 0, "fraction_of_data_to_use": 1.0}


def reader_message(lbann, readers: list[dict]):
    message = lbann.reader_pb2.DataReader()
    for spec in readers:
        reader = message.reader.add()
        for key, value in spec.items():
            if key != "transforms":
                setattr(reader, key, value)
        for kind, fields in spec["transforms"]:
            transform = getattr(reader.transforms.add(), kind)
            for key, value in fields.items():
                setattr(transform, key, value)
    return message


# --- launching --------------------------------------------------------------

# Set by the harness's lbann-driver launcher: where lbann.run launches (its
# scheduler name and mpiexec arguments), as JSON.
RUN_ARGS = "DDLC_LBANN_RUN_ARGS"  # ddlcompare/run/launchers/lbann_driver.py sets it


def launch_args(config: RunConfig, env: Mapping[str, str]) -> dict:
    """The keyword arguments of ``lbann.run`` for this run and where it runs."""
    io_threads = config.get("lbann_io_threads")
    # --print_affinity: each rank names its host in the output (rank_hosts)
    lbann_args = ["--print_affinity", *([f"--num_io_threads={io_threads}"] if io_threads else [])]
    where = json.loads(env[RUN_ARGS])
    where.pop("unset_env", None)  # for the driver's own environment (train)
    return {
        "nodes": config["nodes"],
        "procs_per_node": config["procs_per_node"],
        "job_name": f"ddlc-{config['run_id']}",
        "lbann_args": lbann_args,
        **where,
    }


def unset_for_launch(env: MutableMapping[str, str]) -> None:
    """Drop, from the driver's environment that lbann.run's script inherits,
    what the scheduler says would mislead LBANN's launcher (under Slurm: a
    one-task step's own size, which srun would take for the allocation's)."""
    for name in json.loads(env[RUN_ARGS]).get("unset_env", []):
        env.pop(name, None)


# LBANN's --print_affinity: "  HOST Task   R/N Thread   T/M running on cpu ..."
# (one line per OpenMP thread; without threads "... Task R/N running on cpus").
AFFINITY_LINE = re.compile(
    r"^\s*(\S+) Task\s+(\d+)/\d+ (?:Thread\s+\d+/\d+ )?running on cpus?\b", re.M
)


def rank_hosts(output: str) -> dict[int, str]:
    """Each rank's host, as the rank itself said it."""
    return {int(rank): host for host, rank in AFFINITY_LINE.findall(output)}


# LBANN's banner (src/utils/lbann_library.cpp, print_lbann_configuration)
OMP_LINE = re.compile(r"OpenMP threads per process\s*:\s*(\d+)")
IO_LINE = re.compile(r"I/O threads per process \(\+offset\)\s*:\s*(\d+)")


def knobs_in_effect(output: str, config: RunConfig) -> dict:
    """The CPU settings LBANN's banner says its processes run with: OpenMP
    threads (the design's threads) and I/O threads (lbann_io_threads);
    a run whose banner disagrees fails, naming the setting."""
    omp, io = OMP_LINE.search(output), IO_LINE.search(output)
    found = {
        "threads": int(omp[1]) if omp else None,
        "lbann_io_threads": int(io[1]) if io else None,
    }
    if found["threads"] != config["threads"]:
        raise common.RunError(
            f"lbann: threads: asked {config['threads']}, LBANN's banner says "
            f"{found['threads']} OpenMP threads per process"
        )
    return knobs.confirm(config, found, "LBANN's banner")


# --- LBANN's output ---------------------------------------------------------

# "model0 (instance 0) training epoch 3 objective function : 0.31" (current),
# "Model 0 training epoch 3 objective function : 0.31" (before v0.100).
OUTPUT_LINE = re.compile(
    r"(?:model\d+ \(instance (?P<instance>\d+)\)|Model \d+) "
    r"(?P<mode>training epoch (?P<epoch>\d+)|validation|test) "
    r"(?P<key>objective function|accuracy|categorical accuracy|run time|"
    r"mini-batch time statistics) : (?P<value>.+?)\s*$"
)
STATISTIC = re.compile(r"(N/A|[-+0-9.eE]+)s? (mean|median|max|min|stdev)")


def parse_output(text: str) -> list[dict]:
    """LBANN's per-epoch report lines (instance 0) as one dict per training
    epoch: train_* from 'training epoch N', test_* from the 'validation'
    lines that follow it (the validate reader reads the test set) and, for
    the last epoch, the scores of the final 'test' lines (and their times
    where that epoch was not validated). Epochs count from 1."""
    epochs: list[dict] = []
    final_test: dict = {}
    for line in text.splitlines():
        match = OUTPUT_LINE.search(line)
        if not match or (match["instance"] or "0") != "0":
            continue
        mode, key, value = match["mode"], match["key"], match["value"]
        if match["epoch"] is not None:
            epoch = int(match["epoch"]) + 1
            if not epochs or epochs[-1]["epoch"] != epoch:
                epochs.append({"epoch": epoch})
            target, prefix = epochs[-1], "train"
        elif mode == "validation" and epochs:
            target, prefix = epochs[-1], "test"
        elif mode == "test":
            target, prefix = final_test, "test"
        else:
            continue
        target.update(_values(prefix, key, value))
    if epochs:
        # The final test's scores stand; its times only where the last epoch
        # was not validated (cifar10), so that the last epoch's evaluation
        # time is the one inside training, as for the other epochs.
        for key, value in final_test.items():
            if key.endswith("_loss") or key.endswith("_accuracy"):
                epochs[-1][key] = value
            else:
                epochs[-1].setdefault(key, value)
    return epochs


def _values(prefix: str, key: str, value: str) -> dict:
    if key == "objective function":
        return {f"{prefix}_loss": float(value)}
    if key.endswith("accuracy"):
        return {f"{prefix}_accuracy": float(value.rstrip("%")) / 100}
    if key == "run time":
        return {f"{prefix}_run_time_s": float(value.rstrip("s"))}
    stats = {
        name: (float("nan") if number == "N/A" else float(number))
        for number, name in STATISTIC.findall(value)
    }
    return {
        f"{prefix}_batch_{name}_s": stats.get(name, float("nan"))
        for name in ("mean", "median", "max", "min", "stdev")
    }


def epoch_rows(
    parsed: list[dict],
    images_per_epoch: int,
    launch_s: float = 0.0,
    global_batch: int | None = None,
    warmup_steps: int = 0,
) -> list[dict]:
    """The common epochs.tsv rows. LBANN's training run time is the epoch's
    wall time. The measured time: with ``global_batch``, the mini-batches
    LBANN's timer timed (CallbackTimer(skip_steps=warmup_steps) leaves the
    warm-up steps out) times their mean; else the whole run time (warm-up
    included). An epoch's elapsed time is when training began on the run
    clock (``launch_s``: from LBANN's timeline, else the launch) plus the
    epochs' wall times so far."""
    nan = float("nan")
    rows = []
    elapsed, steps_before = launch_s, 0
    for entry in parsed:
        run_s = entry.get("train_run_time_s", nan)
        wall_s = run_s + entry.get("test_run_time_s", 0)
        elapsed += wall_s
        measured_images, measured_s = images_per_epoch, run_s
        mean_s = entry.get("train_batch_mean_s", nan)
        if global_batch and mean_s == mean_s:  # timed mini-batches (not NaN)
            steps = images_per_epoch // global_batch
            timed = steps - min(steps, max(0, warmup_steps - steps_before))
            measured_images, measured_s = timed * global_batch, timed * mean_s
            steps_before += steps
        rows.append(
            {
                "epoch": entry["epoch"],
                "wall_s": round(wall_s, 4),
                "elapsed_s": round(elapsed, 4),
                "train_loss": entry.get("train_loss", nan),
                "train_accuracy": entry.get("train_accuracy", nan),
                "test_loss": entry.get("test_loss", nan),
                "test_accuracy": entry.get("test_accuracy", nan),
                "images_per_s": measured_images / measured_s if measured_s > 0 else nan,
                "measured_images": measured_images,
                "measured_s": measured_s,
            }
        )
    return rows


BATCH_COLUMNS = ("epoch", "mode", "mean_s", "median_s", "max_s", "min_s", "stdev_s")


def write_batch_times(folder: Path, parsed: list[dict]) -> None:
    """LBANN's mini-batch time statistics, per epoch and mode."""
    lines = ["\t".join(BATCH_COLUMNS)]
    for entry in parsed:
        for mode in ("train", "test"):
            if f"{mode}_batch_mean_s" in entry:
                values = [
                    entry[f"{mode}_batch_{s}_s"] for s in ("mean", "median", "max", "min", "stdev")
                ]
                lines.append("\t".join([str(entry["epoch"]), mode, *(f"{v:.6g}" for v in values)]))
    common.write_text(folder / names.LBANN_BATCH_TIMES, "\n".join(lines) + "\n")


# --- the driver -------------------------------------------------------------

WORLD_LINE = re.compile(r"Total number of processes\s*:\s*(\d+)")


def check_world(output: str, world: int) -> None:
    """LBANN's banner says how many processes its MPI world holds. Ranks
    started without their launcher's MPI support (srun with no PMI plugin)
    each train alone, as a world of one: not the run that was asked for."""
    found = WORLD_LINE.search(output)
    if found and int(found[1]) != world:
        raise common.RunError(
            f"lbann: its MPI world held {found[1]} process(es) where {world} were "
            "launched, so each trained on its own; under Slurm, set DDLC_SRUN_MPI to "
            "the srun MPI plugin that LBANN's MPI needs (srun --mpi=list)"
        )


def write_rank_records(
    run_dir: Path, driver: dict, hosts: dict[int, str], procs_per_node: int
) -> None:
    """One record per rank: the driver's (versions, knobs) with each rank's
    own host from LBANN's output; rank 0's alone where LBANN named none.
    The ranks are LBANN's processes, not the driver: no pid of theirs, and
    no CPU where they ran on another host than the driver's (not read)."""
    for rank in sorted(hosts) or [0]:
        record = {**driver, "rank": rank, "local_rank": rank % procs_per_node}
        if rank in hosts:
            record.update(hostname=hosts[rank], pid=None, driver_hostname=driver["hostname"])
            if hosts[rank] != driver["hostname"]:
                record["cpu"] = None
        common.write_json(run_dir / names.rank_record(rank), record)


def write_step_tables(
    run_dir: Path,
    work_dir: Path,
    parsed: list[dict],
    steps_per_epoch: int,
    config: RunConfig,
    init_start: float,
) -> float | None:
    """steps.rank<r>.tsv of every rank from LBANN's timeline; rank 0's
    intervals: ``init`` from the driver's start to training's, ``eval``
    after each epoch that LBANN evaluated (its timer's run time); and, with
    ``tracer: otf2``, the run's trace of every layer's interval. Returns when
    training began (a perf_counter value), or None, writing nothing, when a
    rank left no readable timeline."""
    world = config["nodes"] * config["procs_per_node"]
    files = lbann_timeline.rank_files(work_dir)
    if sorted(files) != list(range(world)):
        return None
    try:
        timelines = {rank: lbann_timeline.read(path.read_text()) for rank, path in files.items()}
    except (OSError, lbann_timeline.TimelineError):
        return None
    if not all(timelines.values()):
        return None
    info = data.DATASETS[config["dataset"]]
    validated = any(role == "validate" for role, _ in reader_roles(info))
    # a validated run's last epoch ends with its evaluation, inside training
    after_s = parsed[-1].get("test_run_time_s", 0.0) if validated else 0.0
    began_ns = lbann_timeline.training_began_ns(
        files[0], lbann_timeline.last_end_s(timelines[0]), after_s
    )
    began_ns = max(began_ns, round(init_start * 1e9))
    for rank, intervals in timelines.items():
        recorder = PhaseRecorder()
        recorder.steps = lbann_timeline.step_rows(intervals, steps_per_epoch, began_ns)
        if rank == 0:
            recorder.intervals = [("init", 0, round(init_start * 1e9), began_ns)]
            recorder.intervals += eval_intervals(recorder.steps, parsed)
        if config.get("tracer") == "otf2":
            sink = Otf2Sink(run_dir, rank, world, config.get("run_id", ""))
            sink.steps += [row[:4] for row in recorder.steps]
            sink.intervals += lbann_timeline.phase_intervals(intervals, steps_per_epoch, began_ns)
            sink.intervals += [(p, e, -1, start, end) for p, e, start, end in recorder.intervals]
            recorder.sinks.append(sink)
        recorder.write(run_dir, rank)
    return began_ns / 1e9


def eval_intervals(step_rows: list[tuple], parsed: list[dict]) -> list[tuple]:
    """(eval, epoch, start_ns, end_ns) right after each epoch's last step,
    as long as LBANN's timer says the evaluation took, and never past the
    next epoch's first step (the timeline's times are rounded)."""
    last_end: dict[int, int] = {}
    first_start: dict[int, int] = {}
    for epoch, _, start, end, *_ in step_rows:
        last_end[epoch] = end
        first_start.setdefault(epoch, start)
    rows = []
    for entry in parsed:
        epoch = entry["epoch"]
        if epoch in last_end and "test_run_time_s" in entry:
            start = last_end[epoch]
            end = start + round(entry["test_run_time_s"] * 1e9)
            rows.append(("eval", epoch, start, min(end, first_start.get(epoch + 1, end))))
    return rows


def experiment(
    lbann,
    config: RunConfig,
    info: data.DatasetInfo,
    folder: Path,
    steps: int,
    world: int,
    timeline_dir: Path | None = None,
) -> tuple:
    """(trainer, model, data readers, optimizer) of one run: the global
    batch as LBANN's mini-batch, ``steps`` of it per epoch, the design's seed
    and the shared learning-rate rule."""
    global_batch = config["batch_size"] * world
    model = build_model(
        lbann,
        models.MODELS[config["model"]],
        info,
        config["epochs"],
        config["warmup_steps"],
        timeline_dir,
    )
    trainer = lbann.Trainer(mini_batch_size=global_batch, random_seed=config["seed"])
    readers = reader_message(
        lbann, reader_spec(info, folder, steps * global_batch, config["test_images"])
    )
    optimizer = lbann.SGD(
        learn_rate=models.scaled_learning_rate(config, global_batch), momentum=config["momentum"]
    )
    return trainer, model, readers, optimizer


def train(adapter: object, config: RunConfig, run_dir: Path) -> None:
    """Build the experiment, run it with LBANN's launcher, write the tables."""
    lbann = import_lbann()
    init_start = time.perf_counter()
    world = config["nodes"] * config["procs_per_node"]
    clock = common.RunClock()
    dataset = data.load(config["dataset"], config["data_dir"])
    info = dataset.info
    global_batch = config["batch_size"] * world
    _, n_test, steps = common.epoch_sizes(config, dataset, world)
    folder = write_data_files(dataset, data_folder(dataset))
    work_dir = run_dir / names.LBANN_DIR
    work_dir.mkdir(parents=True, exist_ok=True)
    parts = experiment(
        lbann, {**config, "test_images": n_test}, info, folder, steps, world, work_dir
    )
    unset_for_launch(os.environ)
    status = lbann.run(
        *parts, work_dir=str(work_dir), overwrite_script=True, **launch_args(config, os.environ)
    )
    output = (
        (work_dir / "out.log").read_text(errors="replace")
        if (work_dir / "out.log").exists()
        else ""
    )
    parsed = parse_output(output)
    if status != 0 or not parsed:
        raise common.RunError(
            f"lbann: the experiment exited with status {status} and "
            f"{len(parsed)} epoch(s) reported; see {work_dir}/err.log"
        )
    check_world(output, world)
    in_effect = knobs_in_effect(output, config)
    began = write_step_tables(run_dir, work_dir, parsed, steps, config, init_start)
    # Without its timeline, LBANN's start-up cannot be told from training:
    # the run clock then reads training as starting at the launch.
    train_start = began if began is not None else time.perf_counter()
    init_s = train_start - init_start
    rows = epoch_rows(
        parsed, steps * global_batch, clock.at(train_start), global_batch, config["warmup_steps"]
    )
    common.write_epochs(run_dir, rows)
    write_batch_times(run_dir, parsed)
    dist = Dist(rank=0, world=world, local_rank=0)
    record = common.rank_record(
        dist, {"lbann": lbann_version(output), **common.built_versions("lbann_build")}
    )
    record["params_digest"] = None  # LBANN keeps its weights to itself
    record["lbann_timeline"] = "per-step phases" if began is not None else "missing"
    record["knobs"] = in_effect
    write_rank_records(run_dir, record, rank_hosts(output), config["procs_per_node"])
    lr = models.scaled_learning_rate(config, global_batch)
    common.write_json(
        run_dir / METRICS, common.summary(rows, world, global_batch, lr, steps, init_s, clock)
    )
